// Package gate is a route's one admission of work, shared by all its partitions and their
// retriers: the consumer asks its route's Gate whether a message may start, and tells it what the
// message's run came to. Four things decide, each in a file of its own:
//
//   - slots (slots.go): at most Config.Concurrency of the route's handlers run at once (a batch
//     counts once); a call route starts slowly after start and after a pause, and halves on
//     failures;
//   - the pace (pace.go): a call route's rate limit for the whole group, Config.RateLimit, in a
//     schedule the group's instances share. The gate admits a message only while a turn is near,
//     and the call takes its turn right before it goes out (Gate.TakeTurn), after its lease: a
//     database slow to grant leases would otherwise release calls admitted over a while all at
//     once, above the rate;
//   - a throttle: the route's dependency asked to wait (a Retry-After), and nothing of the route
//     starts before then;
//   - the outage circuit (circuit.go): while the route's failures look like an outage of its
//     dependency, nothing starts but one probe at a time.
//
// Everything that starts a message takes a slot and a permit; everything that ends gives the
// result back. The time the route spends throttled or paused is no message's fault:
// Gate.PausedTotal is the clock of it, which the retry budgets leave out. The package knows
// nothing of Kafka: its circuit serves reconciliation's calls too (DependencyCircuit).
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// Gate is a route's admission (see the package's comment). It is safe for concurrent use.
type Gate struct {
	topic   string
	slots   *slots
	pace    *pace
	circuit *circuit
	metrics Metrics
	log     *slog.Logger

	mu sync.Mutex
	// The throttle: no start before until. The time throttled so far is done, plus the current
	// span from since.
	since, until time.Time
	done         time.Duration
	// reopen ends the throttle's gauge when it runs out.
	reopen *time.Timer
	// dbWaits counts the route's messages and partitions waiting for the database now.
	dbWaits int
}

// Config is a route's gate's.
type Config struct {
	Topic string // the route's, for its metrics and log lines
	// Concurrency is how many of the route's handlers run at once, at most; SlowStart (a call
	// route's) starts them slowly (see slots).
	Concurrency int
	SlowStart   bool
	// RateLimit is the route's calls per second for the whole group (0: none), booked in the
	// group's schedule through Book.
	RateLimit float64
	Book      Booker
	Circuit   CircuitConfig // its OnChange is the gate's own
	Metrics   Metrics
	Logger    *slog.Logger
}

// Metrics is where a gate reports, for its route's topic (the consumer's metrics).
type Metrics interface {
	// SetPaused sets route_paused{reason}; CountPause counts a pause that begins.
	SetPaused(topic, reason string, paused bool)
	CountPause(topic, reason string)
	// WaitedForRate counts a call that waited for its turn under the rate limit.
	WaitedForRate(topic string)
	// SetConcurrency and SetRate set the slots' limit and the rate this instance books at.
	SetConcurrency(topic string, limit int)
	SetRate(topic string, perSecond float64)
}

// The reasons a route is paused, as the route_paused gauge's reason label.
const (
	PausedOutage     = "outage"      // the circuit: its dependency looks down
	PausedFailing    = "failing"     // the circuit: its messages are refused alike (the kill switch)
	PausedRetryAfter = "retry_after" // the throttle: its dependency asked to wait
	PausedDatabase   = "database"    // its messages wait for Postgres: unreachable, or refusing writes
)

// PauseReasons are the reasons a route is paused, each a series from the start.
var PauseReasons = []string{PausedOutage, PausedFailing, PausedRetryAfter, PausedDatabase}

// New is the gate of a route: a call route starts slowly, and keeps to its rate.
func New(c Config) (*Gate, error) {
	g := &Gate{topic: c.Topic, metrics: c.Metrics, log: c.Logger}
	cc := c.Circuit
	cc.OnChange = g.circuitChanged
	circuit, err := newCircuit(cc)
	if err != nil {
		return nil, err
	}
	g.circuit = circuit
	g.slots = newSlots(c.Concurrency, c.SlowStart, circuit.config.MinKeys,
		func(limit int) { c.Metrics.SetConcurrency(c.Topic, limit) })
	g.pace = newPace(c.RateLimit, c.Book, func(perSecond float64) { c.Metrics.SetRate(c.Topic, perSecond) })
	return g, nil
}

// TryAcquire takes a slot if one is free.
func (g *Gate) TryAcquire() bool { return g.slots.tryAcquire() }

// Acquire waits for a free slot, or for ctx to be done.
func (g *Gate) Acquire(ctx context.Context) error { return g.slots.acquire(ctx) }

func (g *Gate) Release() { g.slots.release() }

// Free is how many slots are free.
func (g *Gate) Free() int { return g.slots.free() }

// Admission is what the gate lets start now.
type Admission int

const (
	AdmitAny   Admission = iota // the route is open
	AdmitProbe                  // the route is paused and its probe is due: one message may start
	AdmitNone                   // nothing, for now
)

// Admit says what may start now, or else how long until it may change (0: only an event can
// change it, the end of a probe).
func (g *Gate) Admit() (Admission, time.Duration) {
	if d := g.throttledFor(); d > 0 {
		return AdmitNone, d
	}
	if d := g.pace.delay(); d > 0 {
		return AdmitNone, d
	}
	switch state, probeAt := g.circuit.State(); state {
	case RouteOpen:
		return AdmitAny, 0
	case RoutePaused:
		if d := time.Until(probeAt); d > 0 {
			return AdmitNone, d
		}
		return AdmitProbe, 0
	}
	return AdmitNone, RoutePoll
}

// allow takes the permit for a message to start now: any while the route is open, the probe once
// it is due while it is paused, if the route's pace has a turn near. Every permit granted goes
// back to record.
func (g *Gate) allow() (Permit, bool) {
	if g.throttledFor() > 0 || g.pace.delay() > 0 {
		return Permit{}, false
	}
	return g.circuit.Allow()
}

// wait waits until a message may start and returns its permit: for a message retried in place,
// which keeps its slot meanwhile. It fails only when ctx is done or stopping is closed.
func (g *Gate) wait(ctx context.Context, stopping <-chan struct{}) (Permit, error) {
	for {
		d := g.NotYet()
		if d == 0 {
			d = g.pace.delay()
		}
		if d > 0 {
			if err := wait.SleepOrStop(ctx, d, stopping, g.circuit.Changed()); err != nil {
				return Permit{}, err
			}
			continue
		}
		if p, ok := g.circuit.Allow(); ok {
			return p, nil
		}
	}
}

// TakeTurn takes the turn, under the route's rate limit, of a call about to go out, and waits for
// its time; at once for a route without a rate limit. It fails, the turn given back and no call
// made, when ctx is done first, when the turn cannot be booked (Postgres is down: the error says
// so), or at once with ErrPaced when the turn's time comes after ctx's deadline (the call's lease):
// all wrap inbox.ErrNotCalled, so that the key's lease is released.
func (g *Gate) TakeTurn(ctx context.Context) error {
	at, err := g.pace.take(ctx)
	if err != nil {
		return fmt.Errorf("%w: its turn under the route's rate limit: %w", inbox.ErrNotCalled, err)
	}
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	g.metrics.WaitedForRate(g.topic)
	if deadline, ok := ctx.Deadline(); ok {
		if late := d - time.Until(deadline); late > 0 {
			g.pace.giveBack(at)
			// Tried again once its turn is nearer: by how much its lease would have ended first.
			err := fmt.Errorf("%w: %w: its turn in %s", inbox.ErrNotCalled, ErrPaced, d.Round(time.Millisecond))
			return fault.RetryableAfter(err, max(late, minPacedWait))
		}
	}
	if err := wait.Sleep(ctx, d); err != nil {
		g.pace.giveBack(at)
		return fmt.Errorf("%w: %w", inbox.ErrNotCalled, err)
	}
	return nil
}

// ErrPaced is the cause of a call that did not go out because its turn under the route's rate limit
// would come after its lease ends: no failure of the message's, charged nothing. Its error's
// RetryAfter says when the turn would fall within a lease.
var ErrPaced = errors.New("its turn under the route's rate limit comes after its lease ends")

// minPacedWait is the least wait of a call whose turn came too late.
const minPacedWait = 10 * time.Millisecond

// NotYet is how long until the throttle and the circuit may let a message start; 0 when they
// would now.
func (g *Gate) NotYet() time.Duration {
	if d := g.throttledFor(); d > 0 {
		return d
	}
	return g.circuit.notYet()
}

// Record tells the circuit what the run of a message of key, started with p, came to, and the
// slots whether it went well.
func (g *Gate) Record(p Permit, key string, res Signal) {
	switch res {
	case SignalAnswered:
		g.slots.succeeded()
	case SignalFailed:
		g.slots.failed()
	}
	g.circuit.Record(p, key, res)
}

// RecordRefused tells the circuit that the run of a message of key, started with p, was refused the
// way any message would be, with an error of class (see circuit.RecordRefused), and the slots that
// it failed.
func (g *Gate) RecordRefused(p Permit, key, class string) {
	g.slots.failed()
	g.circuit.RecordRefused(p, key, class)
}

// PermitFor returns a permit to start a run of the route: at once when the gate allows it, else
// once it does, unless elsewhere reports that the run is better off not waiting here (a partition's
// message parks while its route is paused; a parked one goes back to the park): then no permit
// (false). It is how every executor is admitted, and fails only when ctx is done or stopping is
// closed.
func (g *Gate) PermitFor(ctx context.Context, stopping <-chan struct{}, elsewhere func() bool) (Permit, bool, error) {
	if p, ok := g.allow(); ok {
		return p, true, nil
	}
	if elsewhere() {
		return Permit{}, false, nil
	}
	p, err := g.wait(ctx, stopping)
	return p, err == nil, err
}

// Open reports whether the circuit has the route open: a failure now is a message's own.
func (g *Gate) Open() bool { return g.State() == RouteOpen }

// Tripped reports whether key's failures tripped the circuit: a probe of another key tells more.
func (g *Gate) Tripped(key string) bool { return g.circuit.Tripped(key) }

// State is the circuit's state.
func (g *Gate) State() RouteState {
	state, _ := g.circuit.State()
	return state
}

// SlotFreed is closed when a slot is freed or the slots' limit grows.
func (g *Gate) SlotFreed() <-chan struct{} { return g.slots.changed() }

// Changed is closed at the circuit's next change of state.
func (g *Gate) Changed() <-chan struct{} { return g.circuit.Changed() }

// Throttle starts nothing of the route for d from now, unless a longer throttle is on.
func (g *Gate) Throttle(d time.Duration) {
	now := time.Now()
	until := now.Add(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !until.After(g.until) {
		return
	}
	if !now.Before(g.until) { // a new span
		g.done += g.until.Sub(g.since)
		g.since = now
		g.metrics.SetPaused(g.topic, PausedRetryAfter, true)
		g.metrics.CountPause(g.topic, PausedRetryAfter)
		g.log.Warn("throttling the route: its dependency asked to wait", "topic", g.topic, "for", d.String())
		g.pace.throttled()
	}
	g.until = until
	if g.reopen != nil {
		g.reopen.Stop()
	}
	g.reopen = time.AfterFunc(d, func() {
		g.metrics.SetPaused(g.topic, PausedRetryAfter, false)
		g.slots.restart()
	})
}

// throttledFor is how long the throttle still holds.
func (g *Gate) throttledFor() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(time.Until(g.until), 0)
}

// PausedTotal is how long the route has been throttled or paused in all, up to now. A span throttled
// while the circuit was paused counts twice: the clock errs on the side of the message.
func (g *Gate) PausedTotal() time.Duration {
	g.mu.Lock()
	throttled := g.done
	if !g.since.IsZero() {
		end := g.until
		if now := time.Now(); now.Before(end) {
			end = now
		}
		throttled += end.Sub(g.since)
	}
	g.mu.Unlock()
	return throttled + g.circuit.Paused()
}

// circuitChanged logs a change of the circuit's state and sets the route's gauge of the pause's
// cause.
func (g *Gate) circuitChanged(from, to RouteState, cause, why string) {
	g.metrics.SetPaused(g.topic, cause, to != RouteOpen)
	switch {
	case from == RouteOpen && cause == PausedFailing:
		g.metrics.CountPause(g.topic, cause)
		g.log.Warn("pausing the route: its messages are all refused alike; holding them instead of dead-lettering them",
			"topic", g.topic, "why", why)
	case from == RouteOpen:
		g.metrics.CountPause(g.topic, cause)
		g.log.Warn("pausing the route: its dependency looks down", "topic", g.topic, "why", why)
	case to == RouteOpen:
		g.slots.restart()
		g.log.Info("resuming the route", "topic", g.topic, "why", why)
	default:
		g.log.Info(fmt.Sprintf("the route is %s", to), "topic", g.topic, "why", why)
	}
}

// AwaitDatabase marks the route held while one of its messages, or a partition's bookkeeping,
// waits for the database, which failed with err: unreachable, or refusing writes (a read-only
// server after a failover). Its callers call it once a wait outlasts HeldAfterWaits tries: a
// connection lost once and replaced at the next try holds nothing. The first wait of a span sets
// route_paused{reason="database"} and logs it once; done, called when the wait is over, ends the
// span with the last of them.
func (g *Gate) AwaitDatabase(err error) (done func()) {
	g.mu.Lock()
	g.dbWaits++
	if g.dbWaits == 1 {
		g.metrics.SetPaused(g.topic, PausedDatabase, true)
		g.metrics.CountPause(g.topic, PausedDatabase)
		g.log.Warn("holding the route: the database does not take its writes; waiting for it", "topic", g.topic,
			"error", err)
	}
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.dbWaits--
			if g.dbWaits == 0 {
				g.metrics.SetPaused(g.topic, PausedDatabase, false)
				g.log.Info("resuming the route: the database takes its writes again", "topic", g.topic)
			}
		})
	}
}

// HeldAfterWaits is how many failed tries in a row make a wait for the database hold the route.
const HeldAfterWaits = 2

// RoutePoll is how often a route that is probing is looked at again.
const RoutePoll = 100 * time.Millisecond
