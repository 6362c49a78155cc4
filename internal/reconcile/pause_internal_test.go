package reconcile

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestPauseProbes: a status endpoint down for a minute, asked by 16 workers, is asked once by each
// before the first failure is known, then by one probe at a time, its pause doubling from a second:
// 5 probes while it is down (at about 1, 3, 7, 15 and 31 seconds); the 6th, at 63 seconds, finds it
// back, and every worker asks again.
func TestPauseProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p pause
		start := time.Now()
		down := func() bool { return time.Since(start) < time.Minute }
		var mu sync.Mutex
		asks, asksDown := 0, 0
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for {
					probe, err := p.wait(ctx)
					if err != nil {
						return
					}
					time.Sleep(10 * time.Millisecond) // the request
					mu.Lock()
					asks++
					failing := down()
					if failing {
						asksDown++
					}
					mu.Unlock()
					if failing {
						p.failed(probe)
					} else {
						p.answered()
					}
					time.Sleep(time.Second) // the next order's turn
				}
			})
		}
		time.Sleep(70 * time.Second)
		cancel()
		wg.Wait()
		if want := 16 + 5; asksDown != want {
			t.Errorf("%d requests while the endpoint was down, want %d (one per worker, then 5 probes)", asksDown, want)
		}
		if asks-asksDown < 16*5 {
			t.Errorf("%d requests in the 7s after it came back, want every worker asking again", asks-asksDown)
		}
	})
}
