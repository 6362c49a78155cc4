package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/effect"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// failure is a message's final failure: the message is dead-lettered with reason.
type failure struct {
	reason   fault.Reason
	err      error
	attempts int // how many times its handler was started
}

// apply takes a dispatch's messages to a finished state: applied, duplicate or dead-lettered, and
// says how many finished, in offset order. It runs on the dispatch's own goroutine.
func (p *partition) apply(ctx context.Context, d *dispatch) settled {
	e := d.entries[0]
	switch {
	case d.starts > crashLoopStarts:
		if p.deadLetterCrashLoop(ctx, e, d.starts-1) != nil {
			return settled{d: d} // the count stays: the next owner dead-letters it without running it
		}
		return settled{d: d, finished: 1}
	case d.batch:
		return settled{d: d, finished: p.applyBatch(ctx, d.entries)}
	case p.applyMessage(ctx, e, tried{}) != nil:
		return settled{d: d}
	}
	return settled{d: d, finished: 1}
}

// tried is what happened to a message in batch transactions before it came to the per-message path.
type tried struct {
	// runs counts the runs of its handler in batches, which count as attempts.
	runs int
	// began is when its first batch began, from which its handle time is measured.
	began time.Time
	// err is the error of its last run when the batch failed on it: that run was a failed attempt.
	err error
}

// verdict is how a message's attempts ended: an outcome of the inbox, or a failure to dead-letter.
type verdict struct {
	outcome inbox.Outcome
	failed  *failure
	// parked: the message is in the park, whose retrier takes it on from there.
	parked bool
}

// applyMessage takes one message, which prior says was tried in batches before, to a finished state
// and settles it: dead letter, metrics, log. It returns an error only when it abandons the message
// (the work was cancelled, or the consumer is stopping while it waited): then nothing of it was
// committed, and it is delivered again.
//
// It is the wrapper around the handler that records the metrics.
func (p *partition) applyMessage(ctx context.Context, e *entry, prior tried) error {
	began := prior.began
	if began.IsZero() {
		began = time.Now()
	}
	log := p.log.With("offset", e.msg.Offset)
	var v verdict
	if e.keyErr != nil {
		v.failed = &failure{reason: e.reason, err: e.keyErr}
	} else {
		log = log.With("key", e.key)
		switch behind, err := p.parkBehind(ctx, e, log); {
		case err != nil:
			return err
		case behind:
			return nil // its key's messages before it are parked: it waits behind them
		}
		var err error
		if v, err = p.retry(ctx, e, prior, log); err != nil {
			return err
		}
		if v.parked {
			return nil
		}
	}
	outcome := string(v.outcome)
	if v.failed != nil {
		if err := p.deadLetter(ctx, e.msg, *v.failed, log); err != nil {
			return err
		}
		outcome = outcomeDeadLettered
	}
	p.c.metrics.finished(p.topic, outcome, time.Since(began))
	log.DebugContext(ctx, "finished the message", "outcome", outcome)
	return nil
}

// retry runs e through the inbox and its handler until it is applied or found a duplicate, or
// fails for good, which it returns as a failure to dead-letter (a key reused with another payload
// among them), or is parked. In between it retries in place, keeping its key's order:
//
//   - a retryable error waits with exponential backoff and jitter (at least the error's RetryAfter,
//     which pauses the whole route as well) until the message's retry budget, Retry.MaxElapsed,
//     runs out; once the retries in place have taken ParkAfter, the message is parked instead, and
//     its budget goes on in the park;
//   - an outage of the database waits without limit, and without spending the retry budget;
//   - while the route's circuit has it paused (its dependency looks down), the message is parked at
//     once, its budget untouched; with Ordering ByPartition, which parks nothing, it waits for the
//     route to open again, without spending its budget;
//   - a permanent error fails at once.
//
// Each run is the route circuit's to know of. Nothing is open while it waits. It returns an error
// only when ctx is done or the consumer begins to stop while it waits. A message that failed in a
// batch (prior.err) goes on from that failed attempt.
func (p *partition) retry(ctx context.Context, e *entry, prior tried, log *slog.Logger) (verdict, error) {
	msg := p.inboxMessage(e.msg, e.key)
	budget := &budgetClock{}
	retries := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.c.config.Retry.InitialInterval),
		backoff.WithMaxInterval(p.c.config.Retry.MaxInterval),
		backoff.WithMaxElapsedTime(p.c.config.Retry.MaxElapsed),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithClockProvider(budget),
	)
	var outage *backoff.ExponentialBackOff
	var t tries
	attempt, batchErr := prior.runs, prior.err
	for {
		began := time.Now()
		var outcome inbox.Outcome
		err := batchErr
		var run permit
		ran := batchErr == nil
		if ran {
			var ok bool
			if run, ok = p.circuit.Allow(); !ok {
				if p.parked != nil {
					t.attempts = attempt
					err := p.park(ctx, e, t, retries.GetElapsedTime(), 0, "its route is paused", log)
					return verdict{parked: err == nil}, err
				}
				pausedBefore := p.circuit.Paused()
				if err := p.waitRoute(ctx); err != nil {
					return verdict{}, err
				}
				budget.exclude(p.circuit.Paused() - pausedBefore)
				continue
			}
			attempt++
			outcome, err = p.attempt(ctx, msg, e.msg.Value, attempt, log)
		}
		batchErr = nil
		switch {
		case err == nil && outcome == inbox.KeyReused:
			p.record(run, ran, e, resultAnswered)
			// The claim found the key reused: this attempt ran no handler.
			return verdict{failed: keyReused(e.key, attempt-1)}, nil
		case err == nil:
			p.record(run, ran, e, resultAnswered)
			return verdict{outcome: outcome}, nil
		case ctx.Err() != nil:
			p.record(run, ran, e, resultInconclusive)
			return verdict{}, context.Cause(ctx)
		}

		err = unwrapPermanent(err)
		kind, reason, retryAfter := p.classify(ctx, err)
		p.record(run, ran, e, circuitResult(err, kind, reason))
		switch kind {
		case fault.KindPermanent:
			return verdict{failed: &failure{reason: reason, err: err, attempts: attempt}}, nil

		case fault.KindUnavailable:
			if outage == nil {
				outage = p.outageBackOff()
			}
			delay := outage.NextBackOff()
			log.WarnContext(ctx, "the database is unavailable; waiting for it",
				"attempt", attempt, "delay", delay, "error", err)
			if err := p.sleep(ctx, delay); err != nil {
				return verdict{}, err
			}
			budget.exclude(time.Since(began))
			continue
		}

		outage = nil
		t.failed(err, reason, attempt)
		if p.parked != nil {
			if state, _ := p.circuit.State(); state != RouteOpen {
				// This failure, or others with it, paused the route: an outage, not the message's doing.
				err := p.park(ctx, e, t, retries.GetElapsedTime(), 0, "its route is paused", log)
				return verdict{parked: err == nil}, err
			}
		}
		delay := retries.NextBackOff()
		if delay == backoff.Stop || retries.GetElapsedTime()+retryAfter > p.c.config.Retry.MaxElapsed {
			return verdict{failed: &failure{reason: reason, err: err, attempts: attempt}}, nil
		}
		if retryAfter > 0 {
			p.limit.pause(retryAfter)
		}
		delay = max(delay, retryAfter, p.limit.pausedFor())
		if p.parked != nil && retries.GetElapsedTime()+delay > p.c.config.ParkAfter {
			spent := retries.GetElapsedTime() + delay
			err := p.park(ctx, e, t, spent, delay, "its retries in place did not clear it", log)
			return verdict{parked: err == nil}, err
		}
		p.c.metrics.retried(p.topic)
		log.InfoContext(ctx, "retrying the message", "attempt", attempt, "delay", delay, "error", err)
		pausedBefore := p.circuit.Paused()
		if err := p.sleep(ctx, delay); err != nil {
			return verdict{}, err
		}
		budget.exclude(p.circuit.Paused() - pausedBefore)
	}
}

// record tells the route's circuit what a run of e, which run let start, came to; nothing when the
// run was not this loop's (it failed in a batch).
func (p *partition) record(run permit, ran bool, e *entry, res result) {
	if ran {
		p.circuit.Record(run, e.order, res)
	}
}

// keyReused is the failure of a message whose key was applied before with another payload.
func keyReused(key string, attempts int) *failure {
	err := fmt.Errorf("idempotency key %q was applied before with a different payload", key)
	return &failure{reason: fault.IdempotencyKeyReused, err: err, attempts: attempts}
}

// inboxMessage is m, whose idempotency key is key, as the inbox records it.
func (p *partition) inboxMessage(m kafka.Message, key string) inbox.Message {
	return inbox.Message{
		Handler:     p.route.Name,
		Key:         key,
		Fingerprint: inbox.Fingerprint(m.Value),
		Topic:       p.topic,
		Partition:   int32(p.id),
		Offset:      m.Offset,
	}
}

// attempt runs m through the inbox and the handler once, in a transaction of its own, under a
// context of its own bounded by AttemptTimeout. A panic in the handler rolls the transaction back
// and is a permanent error. A CallHandler's message goes through its three steps instead (see call).
func (p *partition) attempt(ctx context.Context, msg inbox.Message, value []byte, attempt int, log *slog.Logger) (inbox.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, p.c.config.AttemptTimeout)
	defer cancel()
	d := inbox.Delivery{Key: msg.Key, Value: value, Attempt: attempt}
	if h, ok := p.route.Handler.(effect.CallHandler); ok {
		return p.call(ctx, h, msg, d, log)
	}
	h := p.route.Handler.(effect.Handler) // Config.validate admits nothing else
	return p.c.config.Store.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.ErrorContext(ctx, "the handler panicked", "panic", r, "stack", string(debug.Stack()))
				err = fault.Permanent(fault.HandlerError, fmt.Errorf("panic: %v", r))
			}
		}()
		return h.Handle(ctx, tx, d)
	})
}

// classify tells what to do with a failed attempt's error (see package fault). An error that is not
// clearly the message's own (anything but one its handler declared permanent) may come from a
// database that just went down without saying so; a ping tells, and an outage is no message's fault.
func (p *partition) classify(ctx context.Context, err error) (fault.Kind, fault.Reason, time.Duration) {
	kind, reason, retryAfter := fault.Classify(err)
	var declared *fault.Error
	if kind == fault.KindUnavailable || errors.As(err, &declared) && declared.Kind == fault.KindPermanent {
		return kind, reason, retryAfter
	}
	ping, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if perr := p.c.config.Store.Ping(ping); perr != nil && ctx.Err() == nil {
		return fault.KindUnavailable, reason, 0
	}
	return kind, reason, retryAfter
}

// unwrapPermanent takes a backoff.PermanentError off err, so that what leaves the retry layer (a
// dead letter's dlq-error) is the handler's error itself. Such an error says "do not retry": it is
// made permanent unless it is already classified.
func unwrapPermanent(err error) error {
	var perm *backoff.PermanentError
	if !errors.As(err, &perm) {
		return err
	}
	var classified *fault.Error
	if errors.As(perm.Err, &classified) {
		return perm.Err
	}
	return fault.Permanent(fault.HandlerError, perm.Err)
}

// pingTimeout bounds the ping that tells an outage from a message's failure.
const pingTimeout = 2 * time.Second

// budgetClock is the clock of a message's retry budget: the wall clock, less the time spent in
// attempts that met an outage and in waiting for it to end, which is no fault of the message.
type budgetClock struct{ excluded time.Duration }

func (c *budgetClock) Now() time.Time          { return time.Now().Add(-c.excluded) }
func (c *budgetClock) exclude(d time.Duration) { c.excluded += d }
