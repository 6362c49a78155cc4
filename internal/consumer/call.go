package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// CallHandler applies messages whose effect is a call to another service (an SMS gateway): a
// network call, which never runs inside a transaction. Each message goes through three steps (see
// inbox.Call), and no database connection is held while the call is out, however many are:
//
//  1. claim: in a short transaction, unless the key is already applied, a lease on the key, which
//     keeps any other worker from calling for it until the lease is released or expires (CallLease);
//     Check runs in that transaction;
//  2. Call, with no transaction open;
//  3. complete: the key's inbox row, the Completion Call returned and the lease's release, in one
//     transaction.
//
// A process that dies between Call and the commit leaves the lease to expire; the message, delivered
// again, is claimed anew and Call runs again with the same idempotency key (d.Key), which the other
// service must honour so that the effect happens once. Errors are classified with package fault, as
// a Handler's are: a permanent one records nothing, releases the lease and dead-letters the message.
type CallHandler interface {
	// Check runs in the claim transaction, before the call. It returns nil to go on,
	// inbox.ErrAlreadyApplied when the handler's own tables show the effect happened under d.Key
	// already, or an error that ends the attempt (an invalid payload: a permanent one).
	Check(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error
	// Call makes the call under d.Key, with no transaction open, and returns what to record of it.
	// Its context ends before the lease does (two thirds of CallLease), and when the attempt ends.
	// d.Attempt counts the calls for the key, this one included, across processes and retries (the
	// lease keeps the count), not the tries of the message in this process as elsewhere.
	Call(ctx context.Context, d inbox.Delivery) (Completion, error)
}

// Completion records a call's result through tx, the transaction that writes the key's inbox row. It
// does database work only, and runs at most once per Call. It is an inbox.Effect, so that a handler
// package needs the inbox and not the consumer to implement CallHandler.
type Completion = inbox.Effect

// CallLease is how long a claim on a key lasts before another worker may take it over. A call gets
// two thirds of it (10s), so a call handler's own timeout must be shorter (the SMS provider's
// request timeout is 5s); the last third covers a request the other service is still working on
// after the client gave up. It is also how long a message waits, after the process that was
// calling for it died, before it is called again.
const CallLease = 15 * time.Second

// call runs d through h in the three steps of CallHandler. A panic in any of h's methods is a
// permanent error; the transaction it ran in rolls back and the lease is released.
func (p *partition) call(ctx context.Context, h CallHandler, msg inbox.Message, d inbox.Delivery, log *slog.Logger) (inbox.Outcome, error) {
	return p.c.config.Store.ProcessCall(ctx, msg, inbox.Call{
		Lease: CallLease,
		Check: func(ctx context.Context, tx pgx.Tx) (err error) {
			defer recoverHandler(ctx, log, &err)
			return h.Check(ctx, tx, d)
		},
		Run: func(ctx context.Context, attempt int) (_ inbox.Effect, err error) {
			defer recoverHandler(ctx, log, &err)
			d := d
			d.Attempt = attempt
			complete, err := h.Call(ctx, d)
			if err != nil {
				return nil, err
			}
			if complete == nil { // nothing to record but the key
				return func(context.Context, pgx.Tx) error { return nil }, nil
			}
			return func(ctx context.Context, tx pgx.Tx) (err error) {
				defer recoverHandler(ctx, log, &err)
				return complete(ctx, tx)
			}, nil
		},
	})
}

// recoverHandler makes a panic of a handler, deferred in its caller, the permanent error *err.
func recoverHandler(ctx context.Context, log *slog.Logger, err *error) {
	if r := recover(); r != nil {
		log.ErrorContext(ctx, "the handler panicked", "panic", r, "stack", string(debug.Stack()))
		*err = fault.Permanent(fault.HandlerError, fmt.Errorf("panic: %v", r))
	}
}

// isHandler reports whether h can be a Route's Handler.
func isHandler(h any) bool {
	switch h.(type) {
	case Handler, CallHandler:
		return true
	}
	return false
}
