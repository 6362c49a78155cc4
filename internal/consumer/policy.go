package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// What happens to a message after an attempt is decided here, and only here: by decide, a pure
// function of the attempt's result, the message's history and its route's state, whichever of the
// two executors ran it — the partition, retrying in place (apply.go), or the retrier of the park
// (retrier.go). Each carries out the decision; neither decides.

// history is what is known of a message's attempts: what the park keeps of a parked one.
type history struct {
	// attempts counts the runs of its handler.
	attempts int
	// spent is the retry budget it has spent: what its own failures cost it, the route's pauses
	// and the database's outages excluded.
	spent time.Duration
	// inPlace is how long it has been retried in place, its key's later messages waiting.
	inPlace time.Duration
	// parked: it is in the park.
	parked bool
	// waits counts the attempts in a row that met no failure of its own but a wait (the database
	// down, the key's lease held by another call), for the pace of the next look.
	waits int
	// reason is the dead-letter reason once its budget runs out; "" until it failed.
	reason inboxtype.Reason
	// first and last are its first and last failures.
	first, last error
	firstAt     time.Time
}

// action is what becomes of a message after an attempt.
type action int

const (
	// finish: applied or a duplicate; nothing more to do.
	finish action = iota
	// deadLetter: it fails for good, with a reason.
	deadLetter
	// retry: again in place, after delay.
	retry
	// park: out of its partition's way, due after delay; for a parked message, rescheduled.
	park
)

// decision is what decide made of an attempt.
type decision struct {
	action action
	// outcome, for finish.
	outcome inbox.Outcome
	// reason, for deadLetter; for retry and park, the reason it will be dead-lettered with once its
	// budget runs out. err is the attempt's error.
	reason inboxtype.Reason
	err    error
	// delay, for retry and park: how long until the next attempt.
	delay time.Duration
	// charge is the retry budget the attempt cost.
	charge time.Duration
	// throttle, when positive, is how long the route is to start nothing: its dependency asked to
	// wait (a Retry-After).
	throttle time.Duration
	// wait says why it waits when the attempt was no failure of its own ("" when it was).
	wait string
}

// policy is the configuration decide works with.
type policy struct {
	retry Retry
	// parkAfter is how long a message is retried in place before it is parked; parks reports
	// whether its route parks at all (Ordering ByKey).
	parkAfter time.Duration
	parks     bool
	// jitter is the backoff's randomization factor: 0.5, or 0 for a table test.
	jitter float64
}

// routeView is what decide needs of the route: whether its circuit has it open. A retryable
// failure while it is not is the outage's, not the message's.
type routeView struct{ open bool }

// Why a message waits without a failure of its own.
const (
	waitDatabase = "the database is unavailable"
	waitLease    = "a call of its key is out"
	waitRoute    = "its route is paused"
	waitRate     = "its turn under the route's rate limit"
)

// maxWaitInterval bounds the wait between two looks while a message waits without a failure of
// its own: the database back, a call of its key over.
const maxWaitInterval = 5 * time.Second

// maxThrottle bounds how long a Retry-After pauses a route: a provider asking for a day is asked
// again within the hour.
const maxThrottle = time.Hour

// decide says what becomes of a message whose history is h after an attempt at it alone that came
// to r.
//
//   - Applied or a duplicate: finish. A key reused with another payload, or a permanent error:
//     dead-letter, with its reason — unless the error is a refusal that would meet any message
//     (refusalOf) while the route's circuit has it paused: the kill switch, which refusals at a
//     high rate tripped, holds the message as an outage does, charged nothing, until a probe
//     gets through.
//   - The database unreachable, or the key's lease held by another live call: no failure of the
//     message's. It looks again on a backoff of its own, charged nothing.
//   - A retryable failure while the route's circuit has it paused: the outage's, charged nothing;
//     parked at once (its partition goes on), or retried in place once the route opens.
//   - A call whose turn under the route's rate limit would come after its lease ends: no call,
//     charged nothing; it waits in place for its turn (in the park if it was parked).
//   - Any other retryable failure is charged its time and the backoff's wait; once the budget is
//     spent it is dead-lettered (with the error's reason, else retries_exhausted). The first
//     failure is always retried, however long its attempt took: a budget is for retries, and one
//     slow attempt (a busy machine, a batch's transaction) is no reason to give up untried. A Retry-After
//     makes the next attempt wait at least that long and throttles the whole route for it, but
//     the wait beyond the backoff is the provider's, not charged: a long Retry-After never
//     dead-letters by itself.
//   - A message retried in place for longer than parkAfter is parked instead (routes that park).
func (p policy) decide(h history, r result, route routeView) decision {
	switch {
	case r.err == nil && r.outcome() == inbox.KeyReused:
		return decision{action: deadLetter, reason: inboxtype.IdempotencyKeyReused, err: errKeyReused}
	case r.err == nil:
		return decision{action: finish, outcome: r.outcome()}
	}
	kind, reason, retryAfter := fault.Classify(r.err)
	switch {
	case kind == fault.KindPermanent && !route.open && isRefusal(r.err):
		return p.later(h, decision{reason: reason, err: r.err, wait: waitRoute})
	case kind == fault.KindPermanent:
		return decision{action: deadLetter, reason: reason, err: r.err}
	case kind == fault.KindUnavailable:
		return p.later(h, decision{reason: h.reason, err: r.err, wait: waitDatabase, delay: p.waitDelay(h.waits + 1)})
	case errors.Is(r.err, inbox.ErrLeaseHeld):
		return p.later(h, decision{reason: h.reason, err: r.err, wait: waitLease, delay: p.waitDelay(h.waits + 1)})
	case !route.open:
		return p.later(h, decision{reason: reason, err: r.err, wait: waitRoute})
	case errors.Is(r.err, gate.ErrPaced):
		// A backlog under the rate limit waits for its turn where it is: it is not parked (nothing
		// is failing), and a parked message waits in the park.
		d := decision{action: retry, reason: reason, err: r.err, wait: waitRate, delay: retryAfter}
		if h.parked {
			d.action = park
		}
		return d
	}
	return p.backOff(h, r, reason, retryAfter)
}

// backOff decides on r, a retryable failure of reason, the other service asking to wait
// retryAfter: a retry after the backoff, charged to the budget, or a dead letter once it is spent.
func (p policy) backOff(h history, r result, reason inboxtype.Reason, retryAfter time.Duration) decision {
	backoffDelay := p.backoff(h.attempts + 1) // after this attempt, the message's (attempts+1)th
	d := decision{reason: reason, err: r.err, charge: r.took + backoffDelay, delay: max(backoffDelay, retryAfter)}
	if retryAfter > 0 {
		d.throttle = min(retryAfter, maxThrottle)
	}
	if h.failedBefore() && h.spent+d.charge > p.retry.MaxElapsed {
		return decision{action: deadLetter, reason: reason, err: r.err, charge: d.charge}
	}
	return p.later(h, d)
}

// later makes d, a decision to try again after d.delay, a retry in place or a parking.
func (p policy) later(h history, d decision) decision {
	d.action = retry
	if h.parked || p.parks && (d.wait == waitRoute || h.inPlace+d.delay > p.parkAfter) {
		d.action = park
	}
	return d
}

// backoff is the wait after a message's n-th failed attempt: exponential from Retry.InitialInterval,
// doubling, at most Retry.MaxInterval, with jitter.
func (p policy) backoff(n int) time.Duration {
	return exponential(p.retry.InitialInterval, p.retry.MaxInterval, p.jitter, n)
}

// waitDelay is the wait before the n-th look in a row at something that is no failure of the
// message's: quick at first, at most maxWaitInterval apart.
func (p policy) waitDelay(n int) time.Duration {
	return exponential(p.retry.InitialInterval, min(p.retry.MaxInterval, maxWaitInterval), p.jitter, n)
}

// exponential is the n-th interval (n >= 1) of the one backoff (package wait) from initial,
// doubling up to max, randomized by jitter.
func exponential(initial, max time.Duration, jitter float64, n int) time.Duration {
	return wait.Backoff{Initial: initial, Max: max, Jitter: jitter}.Delay(n)
}

// crashLoopStarts is how many starts of a message in a row without its finishing make it a crash
// loop: the worker died with it in flight each time.
const crashLoopStarts = 5

// crashLooped says what becomes of a message about to start for the starts-th time in a row without
// ever finishing (this start included), whichever executor is to run it: the partition counts the
// starts of the ranges of offsets it runs (crashloop.go), the retrier those of a parked message
// (inbox.StartLog, both). Past crashLoopStarts the worker died with it in flight each time: it is
// dead-lettered with reason crash_loop without running again. Otherwise it runs (false).
func crashLooped(starts int) (decision, bool) {
	if starts <= crashLoopStarts {
		return decision{}, false
	}
	return decision{action: deadLetter, reason: inboxtype.CrashLoop,
		err: fmt.Errorf("the worker died %d times in a row while handling this message", starts-1)}, true
}

// errKeyReused is the error of a message whose idempotency key was applied before with another
// payload.
var errKeyReused = errors.New("the idempotency key was applied before with a different payload")

// failedBefore reports whether the message had failed before its last attempt: its first failure
// is always retried, however long it took (in a batch's transaction, say, which it is charged).
func (h history) failedBefore() bool { return !h.firstAt.IsZero() }

// next is h after an attempt that came to r and was decided d.
func (h history) next(r result, d decision, now time.Time) history {
	for _, ran := range r.ran {
		h.attempts += ran
	}
	if d.wait != "" && d.wait != waitRoute && d.wait != waitRate {
		h.waits++
	} else {
		h.waits = 0
	}
	h.spent += d.charge
	if d.action == retry && d.wait != waitRate { // waiting for its turn is no retry
		h.inPlace += r.took + d.delay
	}
	if d.err != nil && (d.wait == "" || d.wait == waitRoute) { // a wait is no failure of its own
		if h.first == nil {
			h.first, h.firstAt = d.err, now
		}
		h.last, h.reason = d.err, d.reason
	}
	return h
}
