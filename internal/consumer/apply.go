package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// failure is a message's final failure: the message is dead-lettered with reason.
type failure struct {
	reason   inboxtype.Reason
	err      error
	attempts int // how many times its handler ran
}

// apply takes a dispatch's messages to a finished state — applied, a duplicate, dead-lettered or
// parked — and says how many finished, in offset order. It runs on the dispatch's own goroutine.
func (p *partition) apply(ctx context.Context, d *dispatch) settled {
	for _, e := range d.entries {
		// The Kafka key is not recorded: it is often personal data (an SMS event's phone number).
		e.ctx, e.span = p.c.config.Tracer.StartMessage(ctx, tracing.Message{Group: p.c.config.GroupID,
			Topic: p.topic, Partition: p.id, Offset: e.msg.Offset, IdempotencyKey: e.key,
			Headers: e.msg.Headers})
	}
	defer func() {
		for _, e := range d.entries {
			e.span.End()
		}
	}()
	e := d.entries[0]
	if crash, ok := crashLooped(d.starts); ok {
		// Its handler was started too often without finishing: it ran once per death.
		f := failure{reason: crash.reason, err: crash.err, attempts: d.starts - 1}
		if p.finish(e.ctx, ended{msg: e.msg, key: e.key, span: e.span, failure: &f, began: time.Now()}) != nil {
			return settled{d: d} // the count stays: the next owner dead-letters it without running it
		}
		return settled{d: d, finished: 1}
	}
	switch {
	case d.batch:
		return settled{d: d, finished: p.applyBatch(ctx, d.entries)}
	case p.applyMessage(e.ctx, e, carried{}) != nil:
		return settled{d: d}
	}
	return settled{d: d, finished: 1}
}

// carried is what a message brings to the per-message path from the batch transactions that tried
// it: its runs there count as attempts, its handle time counts from the first, and a batch that
// failed on it is an attempt that failed.
type carried struct {
	h     history
	began time.Time
	first *result
}

// applyMessage takes one message to a finished state — applied, a duplicate, dead-lettered or
// parked — retrying it in place, its key's later messages waiting, as the policy decides, and
// counts it. It returns an error only when it abandons the message (its work was cancelled, or the
// consumer began to stop while it waited): nothing of it committed, and it is delivered again.
func (p *partition) applyMessage(ctx context.Context, e *entry, c carried) error {
	began := cmp.Or(c.began, time.Now())
	log := p.log.With("offset", e.msg.Offset)
	if e.keyErr != nil {
		return p.finish(ctx, endOf(e, decision{action: deadLetter, reason: e.reason, err: e.keyErr}, c.h, began, log))
	}
	log = log.With("key", e.key)
	if behind, err := p.parkBehind(ctx, e, log); err != nil || behind {
		return err
	}
	h, a := c.h, p.attemptOf(e, log)
	db := databaseWait{gate: p.route.gate}
	defer db.end()
	for r := c.first; ; r = nil {
		if r == nil {
			got, parkNow, err := p.attemptInPlace(ctx, e, a, h)
			switch {
			case err != nil:
				return err
			case parkNow:
				// The route paused while it waited: it waits in the park, charged nothing.
				return p.park(ctx, e, h, decision{action: park, reason: h.reason, wait: waitRoute}, log)
			}
			r = &got
		}
		d := p.route.policy.decide(h, *r, routeView{open: p.route.gate.Open()})
		h = h.next(*r, d, time.Now())
		db.track(d, h)
		if d.throttle > 0 {
			p.route.gate.Throttle(d.throttle)
		}
		switch d.action {
		case finish, deadLetter:
			return p.finish(ctx, endOf(e, d, h, began, log))
		case park:
			return p.park(ctx, e, h, d, log)
		}
		p.logRetry(ctx, d, h, log)
		if err := p.sleep(ctx, d.delay); err != nil {
			return err
		}
	}
}

// databaseWait tells a route's gate when a message retried in place, or a partition's own statement,
// has waited for the database long enough (gate.HeldAfterWaits) to hold the route, and when it no
// longer waits.
type databaseWait struct {
	gate    *gate.Gate
	release func() // set while the message holds the route
}

// track follows the message's decision d, its history h.
func (w *databaseWait) track(d decision, h history) {
	if d.wait == waitDatabase {
		w.failed(d.err, h.waits)
	} else {
		w.end()
	}
}

// failed counts a wait for the database, the waits-th in a row, which failed with err: from the
// gate.HeldAfterWaits-th on, the route is held.
func (w *databaseWait) failed(err error, waits int) {
	if w.release == nil && waits >= gate.HeldAfterWaits {
		w.release = w.gate.AwaitDatabase(err)
	}
}

// end ends the message's wait for the database, if it waits.
func (w *databaseWait) end() {
	if w.release != nil {
		w.release()
		w.release = nil
	}
}

// attemptInPlace makes one attempt at e once the route's gate lets it start (see runAdmitted). It
// reports parkNow, having made no attempt, when the route's circuit paused it meanwhile and the
// route parks; it fails only when ctx is done or the consumer begins to stop.
func (p *partition) attemptInPlace(ctx context.Context, e *entry, a attempt, h history) (_ result, parkNow bool, _ error) {
	a.units[0].number = h.attempts + 1
	r, admitted, err := p.runAdmitted(ctx, e.order, p.parksWhilePaused, func() result { return p.route.run(ctx, a) })
	switch {
	case err != nil:
		return result{}, false, err
	case !admitted:
		return result{}, true, nil
	case ctx.Err() != nil:
		return result{}, false, context.Cause(ctx)
	}
	return r, false, nil
}

// runAdmitted is how every executor (in place, a batch, the park's retrier) makes a run of the
// route: admitted by the route's gate (gate.Gate.PermitFor), run, and reported back to the gate
// under the run's ordering key order — or as abandoned, when ctx ended or a parked message's hold
// was lost meanwhile. What came of the run is for the executor to act on. It runs nothing, and
// reports admitted false, when elsewhere says the run is better off not waiting for the gate; it
// fails only when ctx is done or the consumer begins to stop while it waits.
func (p *partition) runAdmitted(ctx context.Context, order string, elsewhere func() bool, run func() result) (_ result, admitted bool, _ error) {
	g := p.route.gate
	permit, ok, err := g.PermitFor(ctx, p.stopping, elsewhere)
	if !ok || err != nil {
		return result{}, false, err
	}
	r := run()
	report(g, permit, order, r, abandoned(ctx, r))
	return r, true, nil
}

// abandoned reports whether the run that came to r was abandoned: its context ended, or its parked
// message's hold was lost to another owner. Nothing of it counts.
func abandoned(ctx context.Context, r result) bool {
	return ctx.Err() != nil || errors.Is(r.err, inbox.ErrHoldLost)
}

// parksWhilePaused reports whether a message of the partition that would start now parks rather
// than wait: its route parks, and its circuit has it paused.
func (p *partition) parksWhilePaused() bool { return p.parked != nil && !p.route.gate.Open() }

// attemptOf is an attempt at e alone.
func (p *partition) attemptOf(e *entry, log *slog.Logger) attempt {
	return attempt{units: []unit{p.unitOf(e, 1)}, log: log}
}

// unitOf is e in an attempt, its number-th.
func (p *partition) unitOf(e *entry, number int) unit {
	return unit{msg: p.route.inboxMessage(p.id, e.msg.Offset, e.key, e.msg.Value), value: e.msg.Value,
		produced: e.msg.Time, verifiedBy: e.verifiedBy, number: number}
}

// endOf is e, which d decided after h, as finish takes it: applied, a duplicate or dead-lettered.
func endOf(e *entry, d decision, h history, began time.Time, log *slog.Logger) ended {
	m := ended{msg: e.msg, key: e.key, span: e.span, outcome: d.outcome, began: began, log: log}
	if d.action == deadLetter {
		f := failureOf(d, h, e.key)
		m.failure = &f
	}
	return m
}

// failureOf is the dead letter's failure of the message whose key is key, which d dead-lettered
// after h.
func failureOf(d decision, h history, key string) failure {
	err := d.err
	if errors.Is(err, errKeyReused) {
		err = fmt.Errorf("idempotency key %q was applied before with a different payload", key)
	}
	return failure{reason: d.reason, err: err, attempts: h.attempts}
}

// logRetry logs that a message is retried in place, or waits without a failure of its own.
func (p *partition) logRetry(ctx context.Context, d decision, h history, log *slog.Logger) {
	switch d.wait {
	case "":
		p.c.metrics.retried(p.topic)
		log.InfoContext(ctx, "retrying the message", "attempt", h.attempts, "delay", d.delay, "error", d.err)
	case waitDatabase:
		log.WarnContext(ctx, "the database is unavailable; waiting for it", "delay", d.delay, "error", d.err)
	case waitRate: // the rate limit at work, counted by inboxworker_route_rate_waits_total
		log.DebugContext(ctx, "waiting to try the message again", "why", d.wait, "in", d.delay)
	default:
		log.InfoContext(ctx, "waiting to try the message again", "why", d.wait, "in", d.delay)
	}
}

// refusalOf says whether err, an attempt's error, is a refusal that would meet any message of its
// route, and its class: a permanent error of no reason of its own (handler_error, a handler's panic
// included) that is not about the data the message carries — Postgres's told by their SQLSTATE,
// others by their Go type. Such refusals, at a high rate, trip the route's circuit (the kill
// switch): they hold the route's messages instead of dead-lettering them all. (A read-only
// database is no refusal but an outage, which every message waits out: see gate.Gate.AwaitDatabase.)
func refusalOf(err error) (class string, ok bool) {
	if err == nil {
		return "", false
	}
	if kind, reason, _ := fault.Classify(err); kind != fault.KindPermanent || reason != inboxtype.HandlerError {
		return "", false
	}
	class, data := inbox.ErrorClass(err)
	switch {
	case data:
		return "", false
	case class == "":
		class = fmt.Sprintf("%T", innermost(err))
	}
	return class, true
}

// isRefusal reports whether err is a refusal (refusalOf).
func isRefusal(err error) bool {
	_, ok := refusalOf(err)
	return ok
}

// innermost is the last error of err's chain (the first of a joined error's).
func innermost(err error) error {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				err = next
				continue
			}
		case interface{ Unwrap() []error }:
			if next := u.Unwrap(); len(next) > 0 && next[0] != nil {
				err = next[0]
				continue
			}
		}
		return err
	}
}

// report tells g what the run of permit p, of ordering key key, came to: r, or nothing when the run
// was dropped (see abandoned). A refusal that would meet any message is counted by its class (see
// refusalOf).
func report(g *gate.Gate, p gate.Permit, key string, r result, dropped bool) {
	if dropped {
		g.Record(p, key, gate.SignalNone)
		return
	}
	if class, ok := refusalOf(r.err); ok {
		g.RecordRefused(p, key, class)
		return
	}
	g.Record(p, key, signalOf(r))
}

// signalOf is what the attempt that came to r tells the route's circuit of its dependency. A
// retryable error with a reason of its own (an order that does not exist yet) is the message's
// wait, a key leased by another call is that call's, and the database's outage the consumer's.
// A message its handler declined (an SMS past its validity), or whose call did not go out
// (inbox.ErrNotCalled), did not call the dependency.
func signalOf(r result) gate.Signal {
	if r.err == nil {
		if len(r.outcomes) == 1 && r.outcomes[0].Declined() {
			return gate.SignalNotCalled
		}
		return gate.SignalAnswered
	}
	kind, reason, _ := fault.Classify(r.err)
	switch {
	case errors.Is(r.err, inbox.ErrNotCalled):
		return gate.SignalNotCalled
	case kind == fault.KindPermanent:
		return gate.SignalAnswered
	case kind == fault.KindRetryable && reason == inboxtype.RetriesExhausted && !errors.Is(r.err, inbox.ErrLeaseHeld):
		return gate.SignalFailed
	}
	return gate.SignalNone
}
