package inbox_test

import (
	"sync"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestBookCalls: calls booked under a rate limit follow those booked before them, by anyone, the
// group's schedule never holding more than the rate: bookings one after another, bookings of many
// instances at once, and another group's or handler's schedule apart. Each figure is checked
// against the times around the statements, whatever the machine's speed.
func TestBookCalls(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	const every = 100 * time.Millisecond
	book := func(group, handler string, n int) time.Duration {
		t.Helper()
		first, err := e.store.BookCalls(ctx, group, handler, n, every)
		if err != nil {
			t.Fatal(err)
		}
		return first
	}

	t0 := time.Now()
	first := book("g", "sms", 3)
	t1 := time.Now()
	if first > 0 || first < -t1.Sub(t0) {
		t.Errorf("the first booking's calls start in %s, want at once", first)
	}
	second := book("g", "sms", 2)
	t2 := time.Now()
	// The first booking holds 300ms from its statement on: the second starts where it ends.
	if second > 3*every || second < 3*every-t2.Sub(t0) {
		t.Errorf("the second booking starts in %s, want after the first's 3 calls: %s less the time since", second, 3*every)
	}
	if other := book("other-group", "sms", 1); other > 0 {
		t.Errorf("another group's booking starts in %s, want at once: its schedule is its own", other)
	}
	if other := book("g", "push", 1); other > 0 {
		t.Errorf("another handler's booking starts in %s, want at once: its schedule is its own", other)
	}

	// Eight instances booking at once: no booking is lost, and none overlaps another.
	const instances, rounds, n = 8, 5, 3
	start := time.Now()
	var wg sync.WaitGroup
	for range instances {
		wg.Go(func() {
			for range rounds {
				if _, err := e.store.BookCalls(ctx, "g", "busy", n, every); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	end := time.Now()
	var bookedUntil time.Time
	if err := e.pool.QueryRow(ctx, `SELECT booked_until FROM inbox_call_rates WHERE consumer_group = 'g' AND handler = 'busy'`).Scan(&bookedUntil); err != nil {
		t.Fatal(err)
	}
	all := instances * rounds * n * every
	if lo, hi := start.Add(all), end.Add(all); bookedUntil.Before(lo.Round(0)) || bookedUntil.After(hi.Round(0)) {
		t.Errorf("booked until %s after the start, want %s: every call booked once",
			bookedUntil.Sub(start.Round(0)), all)
	}

	for _, bad := range []struct {
		n     int
		every time.Duration
	}{{0, every}, {1, 0}, {-1, every}} {
		if _, err := e.store.BookCalls(ctx, "g", "sms", bad.n, bad.every); err == nil {
			t.Errorf("BookCalls(%d, %s) accepted", bad.n, bad.every)
		}
	}
}
