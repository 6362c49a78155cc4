package consumer

import (
	"testing"
	"testing/synctest"
	"time"
)

// calls counts how many calls a pace lets start within d, starting each as soon as it lets one.
func calls(p *pace, d time.Duration) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		delay, _ := p.reserve()
		if delay > 0 {
			time.Sleep(delay)
		}
		n++
	}
	return n
}

// TestPace: a route keeps to its share of the group's rate — the partitions it owns — and a
// throttled answer halves its rate, which grows back by a tenth a second.
func TestPace(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var rates []float64
		p := newPace(100, func(r float64) { rates = append(rates, r) })
		if n := calls(p, 10*time.Second); n < 990 || n > 1010 {
			t.Errorf("%d calls in 10s at 100/s", n)
		}
		p.setShare(1, 4) // a quarter of the partitions
		if n := calls(p, 10*time.Second); n < 240 || n > 260 {
			t.Errorf("%d calls in 10s at a quarter of 100/s", n)
		}
		p.setShare(4, 4)
		p.throttled()
		if r := rates[len(rates)-1]; r != 50 {
			t.Errorf("rate %g after a throttling, want 50", r)
		}
		time.Sleep(5 * time.Second)
		p.reserve()
		if r := rates[len(rates)-1]; r != 100 {
			t.Errorf("rate %g five seconds later, want back at 100", r)
		}
		for range 20 {
			p.throttled()
		}
		if r := rates[len(rates)-1]; r != 100*minPaceFactor {
			t.Errorf("rate %g after many throttlings, want at least %g", r, 100*minPaceFactor)
		}
	})
	if p := newPace(0, nil); p.limited() {
		t.Error("a pace without a rate limits")
	} else if d, _ := p.reserve(); d != 0 {
		t.Errorf("a pace without a rate makes a call wait %v", d)
	}
}
