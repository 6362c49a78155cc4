package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// An attempt is one run of a route's handler, on one message, on a batch of a partition's messages
// in one transaction, or on a parked message. run is the only place that builds a Delivery, bounds
// an attempt's time (Route.Timeout), dispatches to the handler's kind and recovers its
// panic; everything that runs a handler goes through it, and what happens next is decide's
// (policy.go).
type attempt struct {
	// units are its messages: one, or a batch.
	units []unit
	// parked, when set, is the parked message being retried, which the caller holds; units holds it.
	parked *inbox.Parked
	// log is the logger of the message (or the batch), for a panic.
	log *slog.Logger
}

// unit is one message of an attempt.
type unit struct {
	// msg is the message as the inbox records it, value its value, produced its record's time.
	msg      inbox.Message
	value    []byte
	produced time.Time
	// verifiedBy names the key that verified the message (Delivery.VerifiedBy).
	verifiedBy string
	// number is the attempt's number for the message (Delivery.Attempt), this one included.
	number int
}

// result is what an attempt came to.
type result struct {
	// outcomes has one outcome per message when the attempt committed (err is nil): applied,
	// duplicate or key reused.
	outcomes []inbox.Outcome
	// err is why nothing of the attempt committed. An error no one declared permanent that came
	// with the database unreachable is classified unavailable: no message's fault.
	err error
	// failed is the message err is charged to, or -1 when none is: a batch's outage, failed commit,
	// or panic of HandleBatch, after which each of its messages goes alone.
	failed int
	// ran counts the runs of each message's handler in this attempt (0 or 1): a claim that found
	// the key recorded, the key's lease held, or a batch stopped before it runs nothing.
	ran []int
	// took is how long the attempt took, less the time its route was paused meanwhile.
	took time.Duration
}

// outcome is the outcome of the attempt's one message.
func (r result) outcome() inbox.Outcome {
	if len(r.outcomes) == 0 {
		return ""
	}
	return r.outcomes[0]
}

// one is r as the result of the attempt at its message i alone.
func (r result) one(i int) result {
	one := result{err: r.err, failed: -1, took: r.took, ran: []int{r.ran[i]}}
	if r.err == nil {
		one.outcomes = []inbox.Outcome{r.outcomes[i]}
	} else if r.failed == i {
		one.failed = 0
	}
	return one
}

// run makes the attempt a under a context of its own, bounded by the route's Timeout.
func (rt *route) run(work context.Context, a attempt) result {
	ctx, cancel := context.WithTimeout(work, rt.Timeout)
	defer cancel()
	began, pausedBefore := time.Now(), rt.gate.PausedTotal()
	r := result{failed: -1, ran: make([]int, len(a.units))}
	switch {
	case rt.Call != nil:
		r.outcomes, r.err = rt.call(ctx, a, &r)
	case a.parked != nil:
		r.outcomes, r.err = rt.applyParked(ctx, a, &r)
	case len(a.units) > 1 || rt.batcher != nil:
		r.outcomes, r.err = rt.applyBatch(ctx, a, &r)
	default:
		r.outcomes, r.err = rt.apply(ctx, a, &r)
	}
	if r.err != nil {
		r.outcomes = nil
		r.err = rt.classify(work, r.err)
		if r.failed < 0 && len(a.units) == 1 {
			r.failed = 0
		}
	}
	r.took = max(time.Since(began)-(rt.gate.PausedTotal()-pausedBefore), 0)
	return r
}

// delivery is what the handler sees of message i of a.
func (a attempt) delivery(i int) inbox.Delivery {
	u := a.units[i]
	return inbox.Delivery{Key: u.msg.Key, Value: u.value, Attempt: u.number, Produced: u.produced,
		VerifiedBy: u.verifiedBy}
}

// apply runs a Handler on a's one message, with its inbox row, in one transaction.
func (rt *route) apply(ctx context.Context, a attempt, r *result) ([]inbox.Outcome, error) {
	ctx, span := rt.tracer.StartTransaction(ctx, rt.Name)
	defer span.End()
	outcome, err := rt.store.Process(ctx, a.units[0].msg, func(ctx context.Context, tx pgx.Tx) (err error) {
		r.ran[0] = 1
		defer recoverHandler(ctx, a.log, &err)
		return rt.Handler.Handle(ctx, tx, a.delivery(0))
	})
	return []inbox.Outcome{outcome}, err
}

// applyParked runs a Handler on a's parked message, with its inbox row and its removal from the
// park, in one transaction.
func (rt *route) applyParked(ctx context.Context, a attempt, r *result) ([]inbox.Outcome, error) {
	ctx, span := rt.tracer.StartTransaction(ctx, rt.Name)
	defer span.End()
	outcome, err := rt.store.Park().Process(ctx, *a.parked, func(ctx context.Context, tx pgx.Tx) (err error) {
		r.ran[0] = 1
		defer recoverHandler(ctx, a.log, &err)
		return rt.Handler.Handle(ctx, tx, a.delivery(0))
	})
	return []inbox.Outcome{outcome}, err
}

// applyBatch runs a BatchHandler on a's messages, with their inbox rows, in one transaction. A
// panic of HandleBatch is no one message's failure.
func (rt *route) applyBatch(ctx context.Context, a attempt, r *result) ([]inbox.Outcome, error) {
	ctx, span := rt.tracer.StartTransaction(ctx, rt.Name)
	defer span.End()
	var claimed []int
	panicked := false
	msgs := make([]inbox.Message, len(a.units))
	for i, u := range a.units {
		msgs[i] = u.msg
	}
	outcomes, err := rt.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, ids []int) (results []error) {
		claimed = ids
		ds := make([]inbox.Delivery, len(ids))
		for j, i := range ids {
			ds[j] = a.delivery(i)
		}
		var perr error
		defer func() {
			if perr != nil {
				panicked = true
				results = make([]error, len(ids))
				results[0] = perr
			}
		}()
		defer recoverHandler(ctx, a.log, &perr)
		return rt.batcher.HandleBatch(ctx, tx, ds)
	})
	var failed *inbox.BatchError
	for _, i := range claimed {
		if errors.As(err, &failed) && !panicked && i > failed.Index {
			break // the handler stopped at the failure
		}
		r.ran[i] = 1
	}
	if errors.As(err, &failed) && !panicked {
		r.failed = failed.Index
		err = failed.Err
	}
	return outcomes, err
}

// call runs a CallHandler on a's one message in its three steps (see inboxtype.CallHandler); a parked
// message leaves the park in the completion's transaction, or at once when its key is found
// recorded.
func (rt *route) call(ctx context.Context, a attempt, r *result) ([]inbox.Outcome, error) {
	var unpark inbox.Effect
	if p := a.parked; p != nil {
		unpark = func(ctx context.Context, tx pgx.Tx) error {
			if err := rt.store.Park().RemoveTx(ctx, tx, *p); err != nil && !errors.Is(err, inbox.ErrHoldLost) {
				return err
			}
			return nil
		}
	}
	d := a.delivery(0)
	outcome, err := rt.store.ProcessCall(ctx, a.units[0].msg, inbox.Call{
		Lease: rt.CallLease,
		Check: func(ctx context.Context, tx pgx.Tx) (err error) {
			ctx, span := rt.tracer.StartTransaction(ctx, rt.Name)
			defer span.End()
			defer recoverHandler(ctx, a.log, &err)
			return rt.Call.Check(ctx, tx, d)
		},
		Run: func(ctx context.Context, calls int) (_ inbox.Effect, err error) {
			r.ran[0] = 1
			defer recoverHandler(ctx, a.log, &err)
			d := d
			d.Attempt = max(d.Attempt, calls)
			if err := rt.gate.TakeTurn(ctx); err != nil {
				return nil, err
			}
			complete, err := rt.Call.Call(ctx, d)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, tx pgx.Tx) (err error) {
				ctx, span := rt.tracer.StartTransaction(ctx, rt.Name)
				defer span.End()
				defer recoverHandler(ctx, a.log, &err)
				if unpark != nil {
					if err := unpark(ctx, tx); err != nil {
						return err
					}
				}
				if complete == nil { // nothing to record but the key
					return nil
				}
				return complete(ctx, tx)
			}, nil
		},
	})
	if err == nil && (outcome == inbox.Duplicate || outcome.Declined()) && a.parked != nil {
		// Recorded before, by another delivery, or declined by Check: no call was made, and the
		// parked message goes.
		if err := rt.store.Park().Remove(ctx, *a.parked); err != nil && !errors.Is(err, inbox.ErrHoldLost) {
			return nil, err
		}
	}
	return []inbox.Outcome{outcome}, err
}

// recoverHandler makes a panic of the handler, deferred in the function that called it, the
// permanent error *err: the transaction it ran in rolls back, and its message is dead-lettered
// handler_error.
func recoverHandler(ctx context.Context, log *slog.Logger, err *error) {
	if v := recover(); v != nil {
		log.ErrorContext(ctx, "the handler panicked", "panic", v, "stack", string(debug.Stack()))
		*err = fault.Permanent(inboxtype.HandlerError, fmt.Errorf("panic: %v", v))
	}
}

// classify makes err, a failed attempt's, unavailable when it is not clearly the message's own
// (anything but an error its handler declared permanent) and the database does not answer: a
// database that just went down does not always say so, and an outage is no message's fault.
func (rt *route) classify(ctx context.Context, err error) error {
	kind, _, _ := fault.Classify(err)
	var declared *fault.Error
	if kind == fault.KindUnavailable || errors.As(err, &declared) && declared.Kind == fault.KindPermanent {
		return err
	}
	ping, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
	defer cancel()
	if perr := rt.store.Ping(ping); perr != nil && ctx.Err() == nil {
		return fault.Unavailable(err)
	}
	return err
}

// pingTimeout bounds the ping that tells an outage from a message's failure.
const pingTimeout = 2 * time.Second
