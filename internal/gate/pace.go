package gate

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// pace keeps a call route's calls to its rate limit, Config.RateLimit, calls per second for the whole
// consumer group. The group's instances share one schedule in Postgres (inbox.Store.BookCalls): an
// instance about to call books a time for it, spaced 1/rate after every call booked before by any
// instance, and calls no sooner. So the group keeps to the rate wherever its traffic is — all on
// one partition's keys or spread — from its first call on, through rebalances, and through an
// instance's death, which leaves only unused times behind. A booking holds the times of the calls
// waiting on this instance at once, up to a tenth of a second of the rate: a statement per call only
// at a low rate.
//
// The gate admits a message while a time is near (delay), and its call takes one right before it
// goes out, after its lease (Gate.TakeTurn): what the provider sees keeps to the rate even when
// leases come back late and together. A throttled answer (a 429, a Retry-After) halves the rate this
// instance books at; it grows back by a tenth of the limit each second without one (TCP's
// congestion control: a multiplicative decrease, an additive increase). The time a message waits for
// its turn is no fault of its own.
type pace struct {
	group  float64 // the group's rate; 0: no limit
	book   Booker
	onRate func(perSecond float64)

	mu     sync.Mutex
	factor float64 // 1, halved at each throttling, recovering additively
	since  time.Time
	// times are booked for this instance and not taken yet, earliest first; bookedUntil is when its
	// last booking ends.
	times       []time.Time
	bookedUntil time.Time
	// booking is closed when the booking in flight returns, with waiting calls waiting for it; nil
	// while none is.
	booking chan struct{}
	waiting int
}

// Booker books n calls in the group's schedule, every apart, after those booked already, and says
// how long from now the first may go out (see inbox.Store.BookCalls).
type Booker func(ctx context.Context, n int, every time.Duration) (first time.Duration, err error)

// Of the pace: the least factor of a throttled rate, and how much of it comes back per second
// (AIMD); the spacing of calls, in 1/rate; how much of the rate one booking holds at most; how late a time booked and not taken may
// still be used, before it is let go.
const (
	paceSpacing      = 1.01
	minPaceFactor    = 1.0 / 64
	paceRecoveryRate = 0.1
	bookingSpan      = 100 * time.Millisecond
	bookedTimeGrace  = 10 * time.Millisecond
)

func newPace(group float64, book Booker, onRate func(float64)) *pace {
	p := &pace{group: group, book: book, factor: 1, since: time.Now(), onRate: onRate}
	if p.limited() {
		p.report()
	}
	return p
}

// limited reports whether the route has a rate limit at all.
func (p *pace) limited() bool { return p.group > 0 }

// delay says how long until the next call could go out, without taking a turn: 0 when at once, or
// without a limit. It is an estimate, for Gate.Admit: a time this instance booked and has not
// taken, or else the end of its last booking and the calls waiting behind it.
func (p *pace) delay() time.Duration {
	if !p.limited() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.recover(now)
	p.letGo(now)
	if len(p.times) > 0 {
		return max(p.times[0].Sub(now), 0)
	}
	next := p.bookedUntil.Add(time.Duration(p.waiting) * p.every())
	return max(next.Sub(now), 0)
}

// take takes the turn of a call about to go out, and returns when it may: booked before by this
// instance, or in a booking made now for it and the calls waiting with it. The zero time for a
// route without a limit. It fails when ctx is done first, or the booking fails (Postgres is down).
// A turn not used goes back with giveBack.
func (p *pace) take(ctx context.Context) (time.Time, error) {
	if !p.limited() {
		return time.Time{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		now := time.Now()
		p.recover(now)
		p.letGo(now)
		if len(p.times) > 0 {
			at := p.times[0]
			p.times = p.times[1:]
			return at, nil
		}
		if p.booking == nil {
			break
		}
		booking := p.booking
		p.waiting++
		p.mu.Unlock()
		select {
		case <-booking:
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
		if ctx.Err() != nil {
			return time.Time{}, context.Cause(ctx)
		}
	}
	// This call books, for itself and for those waiting; at most a span of the rate at once.
	every := p.every()
	n := min(p.waiting+1, max(1, int(bookingSpan/every)))
	p.booking = make(chan struct{})
	p.mu.Unlock()
	first, err := p.book(ctx, n, every)
	booked := time.Now() // counted from the answer: late, if anything, never early
	p.mu.Lock()
	close(p.booking)
	p.booking = nil
	if err != nil {
		return time.Time{}, err
	}
	at := booked.Add(max(first, 0))
	for i := 1; i < n; i++ {
		p.times = append(p.times, at.Add(time.Duration(i)*every))
	}
	p.bookedUntil = at.Add(time.Duration(n) * every)
	return at, nil
}

// giveBack returns a turn taken and not used, for another call of this instance. One whose time
// has come is let go: used later, it would go out together with the turns after it.
func (p *pace) giveBack(at time.Time) {
	if !at.After(time.Now()) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.times, at, time.Time.Compare)
	p.times = slices.Insert(p.times, i, at)
}

// letGo drops the times booked whose moment has passed by more than bookedTimeGrace: used later,
// they would go out together with the times after them. p.mu is held.
func (p *pace) letGo(now time.Time) {
	passed := 0
	for passed < len(p.times) && now.Sub(p.times[passed]) > bookedTimeGrace {
		passed++
	}
	p.times = p.times[passed:]
}

// every is the spacing of the calls this instance books: 1/rate and a hundredth, longer while
// throttled, in whole microseconds, as the database keeps it. The hundredth is for the way of each
// call to the other service, whose time varies: a call a little late, the next on time, would
// otherwise arrive less than 1/rate apart. p.mu is held.
func (p *pace) every() time.Duration {
	us := math.Ceil(paceSpacing * 1e6 / (p.group * p.factor))
	return time.Duration(us) * time.Microsecond
}

// throttled halves the rate: the route's dependency asked to wait.
func (p *pace) throttled() {
	if !p.limited() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recover(time.Now())
	p.factor = max(p.factor/2, minPaceFactor)
	p.report()
}

// recover lets a throttled rate grow back with the time since it was last set. p.mu is held.
func (p *pace) recover(now time.Time) {
	if p.factor < 1 {
		p.factor = min(p.factor+paceRecoveryRate*now.Sub(p.since).Seconds(), 1)
		p.report()
	}
	p.since = now
}

// report tells the rate this instance books at. p.mu is held.
func (p *pace) report() {
	if p.onRate != nil {
		p.onRate(p.group * p.factor)
	}
}
