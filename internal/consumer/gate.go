package consumer

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

// gate is a route's one admission of work, shared by all its partitions and their retriers. Four
// things decide whether a message of the route may start, each in a file of its own:
//
//   - slots (slots.go): at most Route.Concurrency of the route's handlers run at once (a batch
//     counts once); a call route starts slowly after start and after a pause, and halves on
//     failures;
//   - the pace (pace.go): a call route's rate limit for the whole group, Route.RateLimit, in a
//     schedule the group's instances share. The gate admits a message only while a turn is near,
//     and the call takes its turn right before it goes out (takeTurn), after its lease: a
//     database slow to grant leases would otherwise release calls admitted over a while all at
//     once, above the rate;
//   - a throttle: the route's dependency asked to wait (a Retry-After), and nothing of the route
//     starts before then;
//   - the outage circuit (circuit.go): while the route's failures look like an outage of its
//     dependency, nothing starts but one probe at a time.
//
// Everything that starts a message takes a slot and a permit; everything that ends gives the
// result back. The time the route spends throttled or paused is no message's fault: paused() is
// the clock of it, which the retry budgets leave out.
type gate struct {
	topic   string
	slots   *slots
	pace    *pace
	circuit *circuit
	metrics *Metrics
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

// The reasons a route is paused, as the route_paused gauge's reason label.
const (
	pausedOutage     = "outage"      // the circuit: its dependency looks down
	pausedFailing    = "failing"     // the circuit: its messages are refused alike (the kill switch)
	pausedRetryAfter = "retry_after" // the throttle: its dependency asked to wait
	pausedDatabase   = "database"    // its messages wait for Postgres: unreachable, or refusing writes
)

var pauseReasons = []string{pausedOutage, pausedFailing, pausedRetryAfter, pausedDatabase}

// newGate is the gate of route r: a call route starts slowly, and keeps to its rate.
func newGate(r Route, cc CircuitConfig, book booker, m *Metrics, log *slog.Logger) (*gate, error) {
	g := &gate{topic: r.Topic, metrics: m, log: log}
	cc.OnChange = g.circuitChanged
	c, err := newCircuit(cc)
	if err != nil {
		return nil, err
	}
	g.circuit = c
	g.slots = newSlots(r.Concurrency, r.Call != nil, c.config.MinKeys, func(limit int) { m.setConcurrency(r.Topic, limit) })
	g.pace = newPace(r.RateLimit, book, func(perSecond float64) { m.setRate(r.Topic, perSecond) })
	return g, nil
}

// tryAcquire takes a slot if one is free.
func (g *gate) tryAcquire() bool { return g.slots.tryAcquire() }

// acquire waits for a free slot, or for ctx to be done.
func (g *gate) acquire(ctx context.Context) error { return g.slots.acquire(ctx) }

func (g *gate) release() { g.slots.release() }

// full reports whether no slot is free.
func (g *gate) full() bool { return g.slots.free() == 0 }

// admission is what the gate lets start now.
type admission int

const (
	admitAny   admission = iota // the route is open
	admitProbe                  // the route is paused and its probe is due: one message may start
	admitNone                   // nothing, for now
)

// admit says what may start now, or else how long until it may change (0: only an event can
// change it, the end of a probe).
func (g *gate) admit() (admission, time.Duration) {
	if d := g.throttledFor(); d > 0 {
		return admitNone, d
	}
	if d := g.pace.delay(); d > 0 {
		return admitNone, d
	}
	switch state, probeAt := g.circuit.State(); state {
	case RouteOpen:
		return admitAny, 0
	case RoutePaused:
		if d := time.Until(probeAt); d > 0 {
			return admitNone, d
		}
		return admitProbe, 0
	}
	return admitNone, routePoll
}

// allow takes the permit for a message to start now: any while the route is open, the probe once
// it is due while it is paused, if the route's pace has a turn near. Every permit granted goes
// back to record.
func (g *gate) allow() (permit, bool) {
	if g.throttledFor() > 0 || g.pace.delay() > 0 {
		return permit{}, false
	}
	return g.circuit.Allow()
}

// wait waits until a message may start and returns its permit: for a message retried in place,
// which keeps its slot meanwhile. It fails only when ctx is done or stopping is closed.
func (g *gate) wait(ctx context.Context, stopping <-chan struct{}) (permit, error) {
	for {
		d := g.notYet()
		if d == 0 {
			d = g.pace.delay()
		}
		if d > 0 {
			if err := sleep(ctx, stopping, d, g.circuit.Changed()); err != nil {
				return permit{}, err
			}
			continue
		}
		if p, ok := g.circuit.Allow(); ok {
			return p, nil
		}
	}
}

// takeTurn takes the turn, under the route's rate limit, of a call about to go out, and waits for
// its time; at once for a route without a rate limit. It fails, the turn given back and no call
// made, when ctx is done first, when the turn cannot be booked (Postgres is down: the error says
// so), or at once with errPaced when the turn's time comes after ctx's deadline (the call's lease):
// all wrap inbox.ErrNotCalled, so that the key's lease is released.
func (g *gate) takeTurn(ctx context.Context) error {
	at, err := g.pace.take(ctx)
	if err != nil {
		return fmt.Errorf("%w: its turn under the route's rate limit: %w", inbox.ErrNotCalled, err)
	}
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	g.metrics.waitedForRate(g.topic)
	if deadline, ok := ctx.Deadline(); ok {
		if late := d - time.Until(deadline); late > 0 {
			g.pace.giveBack(at)
			// Tried again once its turn is nearer: by how much its lease would have ended first.
			err := fmt.Errorf("%w: %w: its turn in %s", inbox.ErrNotCalled, errPaced, d.Round(time.Millisecond))
			return fault.RetryableAfter(err, max(late, minPacedWait))
		}
	}
	if err := sleep(ctx, nil, d, nil); err != nil {
		g.pace.giveBack(at)
		return fmt.Errorf("%w: %w", inbox.ErrNotCalled, err)
	}
	return nil
}

// errPaced is the cause of a call that did not go out because its turn under the route's rate limit
// would come after its lease ends: no failure of the message's, charged nothing. Its error's
// RetryAfter says when the turn would fall within a lease.
var errPaced = errors.New("its turn under the route's rate limit comes after its lease ends")

// minPacedWait is the least wait of a call whose turn came too late.
const minPacedWait = 10 * time.Millisecond

// notYet is how long until the throttle and the circuit may let a message start; 0 when they
// would now.
func (g *gate) notYet() time.Duration {
	if d := g.throttledFor(); d > 0 {
		return d
	}
	return g.circuit.notYet()
}

// sleep waits for d, or until changed is closed; it fails when ctx is done or stopping closed.
func sleep(ctx context.Context, stopping <-chan struct{}, d time.Duration, changed <-chan struct{}) error {
	if err := wait.Sleep(ctx, d, changed, stopping); err != nil {
		return err
	}
	return stopped(stopping)
}

// stopped is errStopping once stopping is closed, else nil.
func stopped(stopping <-chan struct{}) error {
	select {
	case <-stopping:
		return errStopping
	default:
		return nil
	}
}

// record tells the circuit what the run of a message of key, started with p, came to, and the
// slots whether it went well.
func (g *gate) record(p permit, key string, res signal) {
	switch res {
	case signalAnswered:
		g.slots.succeeded()
	case signalFailed:
		g.slots.failed()
	}
	g.circuit.Record(p, key, res)
}

// recordResult tells the circuit what the run of a message of key, started with p, came to: a
// refusal that would meet any message is counted by its class (see refusalOf).
func (g *gate) recordResult(p permit, key string, r result) {
	if class, ok := refusalOf(r.err); ok {
		g.slots.failed()
		g.circuit.RecordRefused(p, key, class)
		return
	}
	g.record(p, key, signalOf(r))
}

// permitFor returns a permit to start a run of the route: at once when the gate allows it, else
// once it does, unless elsewhere reports that the run is better off not waiting here (a partition's
// message parks while its route is paused; a parked one goes back to the park): then no permit
// (false). It is how every executor is admitted, and fails only when ctx is done or stopping is
// closed.
func (g *gate) permitFor(ctx context.Context, stopping <-chan struct{}, elsewhere func() bool) (permit, bool, error) {
	if p, ok := g.allow(); ok {
		return p, true, nil
	}
	if elsewhere() {
		return permit{}, false, nil
	}
	p, err := g.wait(ctx, stopping)
	return p, err == nil, err
}

// report tells the gate what the run of permit p, of ordering key key, came to: r, or nothing when
// the run was abandoned (its context ended, or its parked message's hold was lost).
func (g *gate) report(p permit, key string, r result, abandoned bool) {
	if abandoned {
		g.record(p, key, signalNone)
		return
	}
	g.recordResult(p, key, r)
}

// open reports whether the circuit has the route open: a failure now is a message's own.
func (g *gate) open() bool {
	state, _ := g.circuit.State()
	return state == RouteOpen
}

// tripped reports whether key's failures tripped the circuit: a probe of another key tells more.
func (g *gate) tripped(key string) bool { return g.circuit.Tripped(key) }

// changed is closed at the circuit's next change of state.
func (g *gate) changed() <-chan struct{} { return g.circuit.Changed() }

// throttle starts nothing of the route for d from now, unless a longer throttle is on.
func (g *gate) throttle(d time.Duration) {
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
		g.metrics.setPaused(g.topic, pausedRetryAfter, true)
		g.metrics.countPause(g.topic, pausedRetryAfter)
		g.log.Warn("throttling the route: its dependency asked to wait", "topic", g.topic, "for", d.String())
		g.pace.throttled()
	}
	g.until = until
	if g.reopen != nil {
		g.reopen.Stop()
	}
	g.reopen = time.AfterFunc(d, func() {
		g.metrics.setPaused(g.topic, pausedRetryAfter, false)
		g.slots.restart()
	})
}

// throttledFor is how long the throttle still holds.
func (g *gate) throttledFor() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(time.Until(g.until), 0)
}

// paused is how long the route has been throttled or paused in all, up to now. A span throttled
// while the circuit was paused counts twice: the clock errs on the side of the message.
func (g *gate) paused() time.Duration {
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
func (g *gate) circuitChanged(from, to RouteState, cause, why string) {
	g.metrics.setPaused(g.topic, cause, to != RouteOpen)
	switch {
	case from == RouteOpen && cause == pausedFailing:
		g.metrics.countPause(g.topic, cause)
		g.log.Warn("pausing the route: its messages are all refused alike; holding them instead of dead-lettering them",
			"topic", g.topic, "why", why)
	case from == RouteOpen:
		g.metrics.countPause(g.topic, cause)
		g.log.Warn("pausing the route: its dependency looks down", "topic", g.topic, "why", why)
	case to == RouteOpen:
		g.slots.restart()
		g.log.Info("resuming the route", "topic", g.topic, "why", why)
	default:
		g.log.Info(fmt.Sprintf("the route is %s", to), "topic", g.topic, "why", why)
	}
}

// awaitDatabase marks the route held while one of its messages, or a partition's bookkeeping,
// waits for the database, which failed with err: unreachable, or refusing writes (a read-only
// server after a failover). Its callers call it once a wait outlasts heldAfterWaits tries: a
// connection lost once and replaced at the next try holds nothing. The first wait of a span sets
// route_paused{reason="database"} and logs it once; done, called when the wait is over, ends the
// span with the last of them.
func (g *gate) awaitDatabase(err error) (done func()) {
	g.mu.Lock()
	g.dbWaits++
	if g.dbWaits == 1 {
		g.metrics.setPaused(g.topic, pausedDatabase, true)
		g.metrics.countPause(g.topic, pausedDatabase)
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
				g.metrics.setPaused(g.topic, pausedDatabase, false)
				g.log.Info("resuming the route: the database takes its writes again", "topic", g.topic)
			}
		})
	}
}

// heldAfterWaits is how many failed tries in a row make a wait for the database hold the route.
const heldAfterWaits = 2

// routePoll is how often a route that is probing is looked at again.
const routePoll = 100 * time.Millisecond
