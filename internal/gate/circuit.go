package gate

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"
)

// RouteState is the state of a route's outage circuit.
//
// The names are the route's, not a circuit breaker's: a route is open when messages flow. In
// resilience4j's terms open is CLOSED, paused is OPEN and probing is HALF_OPEN.
type RouteState int

const (
	// RouteOpen: messages start as they come.
	RouteOpen RouteState = iota
	// RoutePaused: the route's failures look like an outage of its dependency; no message starts
	// until the next probe is due.
	RoutePaused
	// RouteProbing: one message, the probe, runs; no other starts until its result is known.
	RouteProbing
)

func (s RouteState) String() string {
	switch s {
	case RouteOpen:
		return "open"
	case RoutePaused:
		return "paused"
	case RouteProbing:
		return "probing"
	}
	return fmt.Sprintf("RouteState(%d)", int(s))
}

// Signal is what a message's run tells of its route's dependency.
type Signal int

const (
	// SignalAnswered: the dependency answered, whatever it said (applied, a duplicate, a rejection).
	SignalAnswered Signal = iota
	// SignalFailed: a retryable failure that an outage of the dependency would cause (a timeout, a 503).
	SignalFailed
	// SignalNone: the run tells nothing of the dependency: it was cancelled, Postgres was down
	// (which the consumer waits out on its own), or the message waits for data of its own (an order
	// that does not exist yet).
	SignalNone
	// SignalNotCalled: the handler declined the message without calling the dependency (an SMS
	// past its validity): a probe that tells nothing, to be followed by another at once.
	SignalNotCalled
	// SignalRefused: Postgres or the handler refused the message the way it would refuse any
	// (a privilege revoked, a table missing: see the consumer's refusalOf): a failure that is no fault of the
	// message's, counted with the others when it is of the run's class (RecordRefused).
	SignalRefused
)

// CircuitConfig configures a route's outage circuit. The defaults are discussed in docs/design.md
// (The gate: one admission per route).
type CircuitConfig struct {
	// ConsecutiveFailures failures in a row, with no answer between them, trip the circuit when they
	// come from MinKeys keys or more. Defaults to 10.
	ConsecutiveFailures int
	// Window is how far back the failure rate looks. Defaults to 1m.
	Window time.Duration
	// FailureRate is the share of the results in the Window that, failed, trips the circuit, when
	// there are MinFailures failures or more from MinKeys keys or more. Defaults to 0.5.
	FailureRate float64
	// MinFailures defaults to 10.
	MinFailures int
	// MinKeys is how many different keys must have failed for the circuit to trip: the failures of
	// one key, or of a few, are theirs, not an outage. Defaults to 3.
	MinKeys int
	// ProbeInterval is the wait before the first probe; it doubles after each failed probe, up to
	// MaxProbeInterval. Defaults to 1s.
	ProbeInterval time.Duration
	// MaxProbeInterval defaults to 30s.
	MaxProbeInterval time.Duration
	// OnChange, when set, is told of every change of state, the cause of the pause it belongs to
	// (PausedOutage, or PausedFailing when refusals tripped it), and why, in order. It is called
	// with the circuit locked: it must return quickly and not call the circuit.
	OnChange func(from, to RouteState, cause, why string)
}

// circuit tells when a route's failures look like an outage of its dependency (an SMS gateway
// answering 503) rather than the failures of some messages, and then pauses the route: no message
// starts but one probe at a growing interval, until a probe gets an answer. It tells nothing of
// Postgres, whose outages the consumer waits out on its own, and does not retry anything itself.
//
// The circuit trips on ConsecutiveFailures failures in a row, or on a FailureRate over the Window,
// in either case from at least MinKeys different keys, so that a key that always fails, or a few,
// never trips it. While the route is not open, only the probe's result changes its state.
//
// The keys whose failures tripped it are its suspects: failing keys of their own (poison) look the
// same as an outage, until a key that did not trip it fails too. So a probe of another key is
// preferred (see Tripped), and its failure confirms the outage. A probe of a suspect that fails
// while the outage is unconfirmed proves nothing: the route opens again, the failure is charged to
// its message, and keys that keep failing spend their budgets and end as dead letters, instead of
// holding the route paused for good.
//
// A circuit is safe for concurrent use.
type circuit struct {
	config CircuitConfig

	mu      sync.Mutex
	state   RouteState
	changed chan struct{} // closed and replaced at each change of state

	// While open: the current run of failures, its keys and its class (that of its refusals, ""
	// for failures), and the window.
	run       int
	runKeys   map[string]bool
	runClass  string
	buckets   []bucket
	failedAt  map[string]time.Time // key → its last failure in the window
	trips     uint64               // counts the trips: a permit of an earlier one is stale
	cause     string               // what tripped it last: PausedOutage or PausedFailing
	suspects  map[string]bool      // the keys that failed before the trip
	confirmed bool                 // a probe of a key not among them failed: an outage
	interval  time.Duration        // the wait before the next probe
	probeAt   time.Time            // while paused, when the next probe may start
	reprobe   bool                 // the last probe called nothing: the next goes unannounced
	notOpen   time.Time            // when the route stopped being open
	pausedFor time.Duration        // total time not open, up to notOpen
}

// bucket counts the results of one slice of the window.
type bucket struct {
	start             time.Time
	answers, failures int
}

// windowBuckets is how many slices the window is counted in.
const windowBuckets = 60

// maxTrackedKeys bounds how many failing keys the window remembers: more than MinKeys is enough to
// know that MinKeys have failed.
const maxTrackedKeys = 256

// newCircuit returns an open circuit, or an error naming the first invalid field of config.
func newCircuit(config CircuitConfig) (*circuit, error) {
	config.ConsecutiveFailures = cmp.Or(config.ConsecutiveFailures, 10)
	config.Window = cmp.Or(config.Window, time.Minute)
	config.FailureRate = cmp.Or(config.FailureRate, 0.5)
	config.MinFailures = cmp.Or(config.MinFailures, 10)
	config.MinKeys = cmp.Or(config.MinKeys, 3)
	config.ProbeInterval = cmp.Or(config.ProbeInterval, time.Second)
	config.MaxProbeInterval = cmp.Or(config.MaxProbeInterval, 30*time.Second)
	switch {
	case config.ConsecutiveFailures < 1:
		return nil, fmt.Errorf("Circuit.ConsecutiveFailures must be positive, got %d", config.ConsecutiveFailures)
	case config.Window < windowBuckets*time.Millisecond:
		return nil, fmt.Errorf("Circuit.Window must be at least %s, got %s", windowBuckets*time.Millisecond, config.Window)
	case config.FailureRate <= 0 || config.FailureRate > 1:
		return nil, fmt.Errorf("Circuit.FailureRate must be in (0, 1], got %g", config.FailureRate)
	case config.MinFailures < 1:
		return nil, fmt.Errorf("Circuit.MinFailures must be positive, got %d", config.MinFailures)
	case config.MinKeys < 1 || config.MinKeys > maxTrackedKeys:
		return nil, fmt.Errorf("Circuit.MinKeys must be in [1, %d], got %d", maxTrackedKeys, config.MinKeys)
	case config.ProbeInterval <= 0:
		return nil, fmt.Errorf("Circuit.ProbeInterval must be positive, got %s", config.ProbeInterval)
	case config.MaxProbeInterval < config.ProbeInterval:
		return nil, errors.New("Circuit.MaxProbeInterval must not be less than ProbeInterval")
	}
	c := &circuit{config: config, changed: make(chan struct{}), interval: config.ProbeInterval}
	c.reset()
	return c, nil
}

// Permit is leave to start one message, from Allow. Its result goes back through Record.
type Permit struct {
	probe bool
	trip  uint64
}

// Probe reports whether the permit is the probe of a paused route.
func (p Permit) Probe() bool { return p.probe }

// Allow reports whether a message may start now. While the route is open, any may. While it is
// paused, one may once the probe interval is over: the probe, whose result decides whether the
// route opens again; no other starts until that result is recorded. Every permit granted must be
// given back to Record, SignalNone when its message did not run.
func (c *circuit) Allow() (Permit, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case RouteOpen:
		return Permit{trip: c.trips}, true
	case RoutePaused:
		if !time.Now().Before(c.probeAt) {
			if c.reprobe {
				c.setQuietly(RouteProbing)
			} else {
				c.setState(RouteProbing, fmt.Sprintf("probing with one message after %s", c.interval))
			}
			return Permit{probe: true, trip: c.trips}, true
		}
	}
	return Permit{}, false
}

// Record records the result of the run of a message, of key, that p let start.
func (c *circuit) Record(p Permit, key string, res Signal) { c.record(p, key, res, "") }

// RecordRefused records that the run of a message, of key, that p let start was refused the way
// any would be, with an error of class (a SQLSTATE, say). Refusals trip the circuit as failures
// do, when they are of one class: a run of failures of another class starts again.
func (c *circuit) RecordRefused(p Permit, key, class string) { c.record(p, key, SignalRefused, class) }

func (c *circuit) record(p Permit, key string, res Signal, class string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if p.probe {
		if c.state != RouteProbing || p.trip != c.trips {
			return // not the probe in flight: cannot happen unless a permit is recorded twice
		}
		c.reprobe = res == SignalNotCalled
		switch res {
		case SignalAnswered:
			c.pausedFor += now.Sub(c.notOpen)
			c.interval = c.config.ProbeInterval
			c.reset()
			c.setState(RouteOpen, "the probe was answered")
		case SignalFailed, SignalRefused:
			if !c.suspects[key] {
				c.confirmed = true
			}
			if !c.confirmed {
				c.pausedFor += now.Sub(c.notOpen)
				c.reset()
				c.setState(RouteOpen, "the probe failed on a key that tripped the circuit, which proves no outage")
				return
			}
			c.interval = min(2*c.interval, c.config.MaxProbeInterval)
			c.probeAt = now.Add(c.interval)
			c.setState(RoutePaused, fmt.Sprintf("the probe failed; next in %s", c.interval))
		case SignalNotCalled: // told of neither this change nor the next probe's: nothing changed
			c.probeAt = now
			c.setQuietly(RoutePaused)
		default:
			c.probeAt = now.Add(c.interval)
			c.setState(RoutePaused, fmt.Sprintf("the probe told nothing; next in %s", c.interval))
		}
		return
	}
	if c.state != RouteOpen || p.trip != c.trips {
		return // started before the route paused: its result is not news
	}
	switch res {
	case SignalAnswered:
		c.run = 0
		clear(c.runKeys)
		c.bucket(now).answers++
	case SignalFailed, SignalRefused:
		if class != c.runClass {
			c.run, c.runClass = 0, class
			clear(c.runKeys)
		}
		c.run++
		if len(c.runKeys) < c.config.MinKeys {
			c.runKeys[key] = true
		}
		c.bucket(now).failures++
		c.trackFailedKey(key, now)
		c.tripIfOutage(now, class)
	}
}

// tripIfOutage pauses the route when the failures recorded look like an outage; class is the last
// one's, "" when it was no refusal.
func (c *circuit) tripIfOutage(now time.Time, class string) {
	var why string
	if c.run >= c.config.ConsecutiveFailures && len(c.runKeys) >= c.config.MinKeys {
		why = fmt.Sprintf("%d failures in a row from %d keys or more", c.run, len(c.runKeys))
	} else {
		c.forgetFailedKeys(now)
		answers, failures := c.counts(now)
		rate := float64(failures) / float64(answers+failures)
		if failures < c.config.MinFailures || rate < c.config.FailureRate || len(c.failedAt) < c.config.MinKeys {
			return
		}
		why = fmt.Sprintf("%d of %d runs failed in %s, from %d keys or more",
			failures, answers+failures, c.config.Window, len(c.failedAt))
	}
	c.trips++
	c.cause = PausedOutage
	if class != "" {
		c.cause = PausedFailing
		why += ", the last refused with " + class
	}
	c.suspects = make(map[string]bool, len(c.failedAt)+len(c.runKeys))
	for k := range c.failedAt {
		c.suspects[k] = true
	}
	for k := range c.runKeys {
		c.suspects[k] = true
	}
	c.confirmed = false
	c.notOpen = now
	c.probeAt = now.Add(c.interval)
	c.setState(RoutePaused, why)
}

// State returns the route's state and, while it is paused, when the next probe may start.
func (c *circuit) State() (RouteState, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == RoutePaused {
		return c.state, c.probeAt
	}
	return c.state, time.Time{}
}

// notYet is how long until a message may start: 0 while the route is open or its probe is due,
// until the probe while it is paused; while a probe is out, a while to look again.
func (c *circuit) notYet() time.Duration {
	switch state, probeAt := c.State(); state {
	case RouteOpen:
		return 0
	case RoutePaused:
		return max(time.Until(probeAt), 0)
	}
	return RoutePoll
}

// Tripped reports whether key failed before the circuit tripped: while it is paused, a probe of
// another key tells more of the dependency.
func (c *circuit) Tripped(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state != RouteOpen && c.suspects[key]
}

// Paused returns how long the route has not been open in all, up to now. The retry budget of a
// message excludes what this grows by while it waits: a pause is no fault of the message's.
func (c *circuit) Paused() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == RouteOpen {
		return c.pausedFor
	}
	return c.pausedFor + time.Since(c.notOpen)
}

// Changed returns a channel that is closed at the route's next change of state.
func (c *circuit) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *circuit) setState(to RouteState, why string) {
	from := c.state
	c.setQuietly(to)
	if c.config.OnChange != nil {
		c.config.OnChange(from, to, c.cause, why)
	}
}

// setQuietly changes the state without telling OnChange.
func (c *circuit) setQuietly(to RouteState) {
	c.state = to
	close(c.changed)
	c.changed = make(chan struct{})
}

// reset forgets the failures counted while the route was open.
func (c *circuit) reset() {
	c.run, c.runClass = 0, ""
	c.runKeys = make(map[string]bool, c.config.MinKeys)
	c.buckets = make([]bucket, windowBuckets)
	c.failedAt = make(map[string]time.Time)
}

// bucket returns the bucket of now, emptied if it held an older slice of time.
func (c *circuit) bucket(now time.Time) *bucket {
	width := c.config.Window / windowBuckets
	start := now.Truncate(width)
	b := &c.buckets[int(start.UnixNano()/int64(width))%windowBuckets]
	if !b.start.Equal(start) {
		*b = bucket{start: start}
	}
	return b
}

// counts returns the answers and failures recorded in the window that ends now.
func (c *circuit) counts(now time.Time) (answers, failures int) {
	for _, b := range c.buckets {
		if now.Sub(b.start) < c.config.Window {
			answers += b.answers
			failures += b.failures
		}
	}
	return answers, failures
}

// trackFailedKey remembers that key failed at now.
func (c *circuit) trackFailedKey(key string, now time.Time) {
	if _, ok := c.failedAt[key]; !ok && len(c.failedAt) >= maxTrackedKeys {
		c.forgetFailedKeys(now)
	}
	if _, ok := c.failedAt[key]; ok || len(c.failedAt) < maxTrackedKeys {
		c.failedAt[key] = now
	}
}

// forgetFailedKeys forgets the keys whose last failure has left the window.
func (c *circuit) forgetFailedKeys(now time.Time) {
	for k, at := range c.failedAt {
		if now.Sub(at) >= c.config.Window {
			delete(c.failedAt, k)
		}
	}
}
