package gate

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/busiest"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// paces returns n paces of one route of one group at rate, instances sharing the schedule in the
// database.
func paces(t *testing.T, n int, rate float64) []*pace {
	t.Helper()
	store, err := inbox.NewStore(pgtest.Schema(t).Pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	book := func(ctx context.Context, n int, every time.Duration) (time.Duration, error) {
		return store.BookCalls(ctx, "g", "sms", n, every)
	}
	out := make([]*pace, n)
	for i := range out {
		out[i] = newPace(rate, book, nil)
	}
	return out
}

// turns takes calls turns of each pace at once, from as many goroutines, and returns them all in
// order.
func turns(t *testing.T, ps []*pace, calls int) []time.Time {
	t.Helper()
	var mu sync.Mutex
	var all []time.Time
	var wg sync.WaitGroup
	for _, p := range ps {
		for range calls {
			wg.Go(func() {
				at, err := p.take(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, at)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	slices.SortFunc(all, time.Time.Compare)
	return all
}

// TestPaceShared: the instances of a group keep to one rate together, from their first calls on:
// the turns they are given are spaced by the rate in the schedule they share, whichever instance
// asks. Each turn's time is counted from the answer of its booking, so a slow answer only delays it;
// the limits leave room for that, and fail at what instances that did not share the rate would
// do (each its own rate: three times it).
func TestPaceShared(t *testing.T) {
	t.Parallel()
	t.Run("FirstCalls", func(t *testing.T) {
		t.Parallel()
		// At 1 call a second, three fresh instances calling at once: one call in the first second,
		// not one each.
		all := turns(t, paces(t, 3, 1), 1)
		if gap := all[1].Sub(all[0]); gap < 500*time.Millisecond {
			t.Errorf("the second call's turn %s after the first's, want a second: the instances each took one", gap)
		}
		if gap := all[2].Sub(all[1]); gap < 500*time.Millisecond {
			t.Errorf("the third call's turn %s after the second's, want a second", gap)
		}
	})
	t.Run("Busy", func(t *testing.T) {
		t.Parallel()
		const rate = 100
		all := turns(t, paces(t, 3, rate), 100)
		if n := busiest.Within(all, time.Second); n > rate*3/2 {
			t.Errorf("%d turns within one second, want at most %d: the instances do not share the rate", n, rate*3/2)
		}
		t.Logf("300 turns at %d/s over %s; the busiest second %d", rate, all[len(all)-1].Sub(all[0]).Round(time.Millisecond),
			busiest.Within(all, time.Second))
	})
}

// TestPaceGiveBack: a turn given back goes to the next call of the instance, and one whose time has
// passed is let go.
func TestPaceGiveBack(t *testing.T) {
	t.Parallel()
	p := paces(t, 1, 0.1)[0] // a call every 10 s
	ctx := t.Context()
	first, err := p.take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gap := second.Sub(first); gap < 9*time.Second {
		t.Fatalf("turns %s apart, want about 10s", gap)
	}
	p.giveBack(second)
	if d := p.delay(); d < 5*time.Second {
		t.Errorf("delay %s with a turn given back, want the time until it", d)
	}
	if again, err := p.take(ctx); err != nil || !again.Equal(second) {
		t.Errorf("take after a give back = %s, %v; want the turn given back, %s", again, err, second)
	}
	p.giveBack(first) // its time came: used later it would go out with the next
	if len(p.times) != 0 {
		t.Errorf("a passed turn kept: %v", p.times)
	}
}

// TestPaceDatabaseDown: a turn that cannot be booked, Postgres being out of reach, is refused as an
// outage of the database, which no message is charged for and which is waited out; the next call
// once it is back books as before.
func TestPaceDatabaseDown(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	proxy := pgtest.StartProxy(t, db.URL)
	pool, err := pgxpool.New(t.Context(), proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := newPace(10, func(ctx context.Context, n int, every time.Duration) (time.Duration, error) {
		return store.BookCalls(ctx, "g", "sms", n, every)
	}, nil)
	proxy.Cut()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := p.take(ctx); err == nil {
		t.Fatal("a turn taken with the database out of reach")
	} else if kind, _, _ := fault.Classify(err); kind != fault.KindUnavailable {
		t.Errorf("take error %v classified %v, want unavailable", err, kind)
	}
	proxy.Restore()
	if _, err := p.take(ctx); err != nil {
		t.Errorf("take once the database is back: %v", err)
	}
}

// TestPaceThrottled: a throttled answer halves the rate an instance books at, which grows back by a
// tenth a second, never below a 64th.
func TestPaceThrottled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var rates []float64
		p := newPace(100, nil, func(r float64) { rates = append(rates, r) })
		if r := rates[len(rates)-1]; r != 100 {
			t.Errorf("rate %g at the start, want 100", r)
		}
		p.throttled()
		if r := rates[len(rates)-1]; r != 50 {
			t.Errorf("rate %g after a throttling, want 50", r)
		}
		if got := p.every(); got != 20200*time.Microsecond {
			t.Errorf("calls booked %s apart when throttled, want 20.2ms", got)
		}
		time.Sleep(5 * time.Second)
		p.delay()
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
	// Spaced in whole microseconds, as the database keeps a booking: 1.01 s / 3, rounded up.
	if got := newPace(3, nil, nil).every(); got != 336667*time.Microsecond {
		t.Errorf("calls booked %s apart at 3/s, want 336.667ms", got)
	}
	if p := newPace(0, nil, nil); p.limited() {
		t.Error("a pace without a rate limits")
	} else if at, err := p.take(t.Context()); err != nil || !at.IsZero() || p.delay() != 0 {
		t.Errorf("a pace without a rate makes a call wait: %s, %v", at, err)
	}
}
