// Package effect is everything a handler author needs, in one import: the handler interfaces the
// consumer runs (Handler, BatchHandler, CallHandler), what a handler sees of a message (Delivery),
// and what it may answer — nil (applied), ErrAlreadyApplied (a duplicate found by the handler's own
// business keys), a Permanent error with its dead-letter reason, a Retryable one — plus AfterCommit,
// for what must happen only once the effect committed (a log line).
//
// A handler sees a transaction and a delivery, never a Kafka type, an offset or a retry policy: the
// consumer (package consumer) fetches, orders, retries, dead-letters and commits; the inbox (package
// inbox) claims the idempotency key in the handler's transaction; package fault classifies errors,
// and this package only names what a handler returns. A new route costs a package implementing one
// of these interfaces and one consumer.Route.
package effect

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// Delivery is what a handler sees of one message: its idempotency key, its value and which try this
// is.
type Delivery = inbox.Delivery

// Handler applies one message's effect through tx, the transaction that also writes the message's
// inbox row: both commit, or neither. Its errors are classified with this package's constructors;
// an unclassified error is permanent (dead-lettered handler_error), except Postgres errors, which
// the inbox classifies itself (a deadlock is retried, an outage waited out).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, d Delivery) error
}

// BatchHandler is a Handler that can also apply several messages of one partition in one
// transaction, with set-based statements where it can.
//
// HandleBatch applies ds, in offset order, through tx, and returns one result per delivery, with
// Handle's meaning: nil (applied), ErrAlreadyApplied (a duplicate) or a classified error. Each
// result must be what Handle would have returned, the deliveries applied one after another. It may
// stop at its first error and leave the later results nil: any error rolls back the whole batch. The
// consumer then applies the deliveries before the failed one again, as a batch, takes the failed one
// through Handle with the per-message retries and dead-lettering, and goes on with the rest.
//
// So HandleBatch may run more than once for a message whose effect commits once: it must do
// database work only, all of it through tx, and call no other service. A handler whose effect is a
// call to another service (an SMS gateway) is a CallHandler.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, tx pgx.Tx, ds []Delivery) []error
}

// CallHandler applies messages whose effect is a call to another service (an SMS gateway): a
// network call, which never runs inside a transaction. Each message goes through three steps, and no
// database connection is held while the call is out, however many are:
//
//  1. claim: in a short transaction, unless the key is already applied, a lease on the key, which
//     keeps any other worker from calling for it until the lease is released or expires (CallLease);
//     Check runs in that transaction;
//  2. Call, with no transaction open;
//  3. complete: the key's inbox row, the Completion Call returned and the lease's release, in one
//     transaction.
//
// The claims of several messages may share a transaction, and so may their completions: a busy
// worker commits the steps that arrive together in one transaction (each message keeps its own
// outcome). When such a transaction fails, each of its messages does the step again alone, so that
// one message's failure is charged to it only: Check and a Completion may run twice, the first time
// in a transaction that is rolled back, and must report what they did through AfterCommit.
//
// A process that dies between Call and the commit leaves the lease to expire; the message, delivered
// again, is claimed anew and Call runs again with the same idempotency key (d.Key), which the other
// service must honour so that the effect happens once. A permanent error records nothing, releases
// the lease and dead-letters the message.
type CallHandler interface {
	// Check runs in the claim transaction, before the call. It returns nil to go on,
	// ErrAlreadyApplied when the handler's own tables show the effect happened under d.Key already,
	// or an error that ends the attempt (an invalid payload: a permanent one).
	Check(ctx context.Context, tx pgx.Tx, d Delivery) error
	// Call makes the call under d.Key, with no transaction open, and returns what to record of it.
	// Its context ends before the lease does (two thirds of CallLease), and when the attempt ends.
	// d.Attempt counts the calls for the key, this one included, across processes and retries (the
	// lease keeps the count), not the tries of the message in this process as elsewhere.
	Call(ctx context.Context, d Delivery) (Completion, error)
}

// Completion records a call's result through tx, the transaction that writes the key's inbox row,
// which may write other keys' too. It does database work only, and commits at most once per Call; it
// may run once more first, in a transaction rolled back for another message's sake.
type Completion = inbox.Effect

// CallLease is how long a claim on a key lasts before another worker may take it over. A call gets
// two thirds of it (10s), so a call handler's own timeout must be shorter (the SMS provider's
// request timeout is 5s); the last third covers a request the other service is still working on
// after the client gave up. It is also how long a message waits, after the process that was
// calling for it died, before it is called again.
const CallLease = 15 * time.Second

// ErrAlreadyApplied is what a handler returns when its own business keys show the effect happened
// already under another idempotency key (a provider resending one payment under a new event id):
// the message is a duplicate, and nothing it did is kept.
var ErrAlreadyApplied = inbox.ErrAlreadyApplied

// Reason is a dead-letter reason code.
type Reason = fault.Reason

// The reasons a handler may give a permanent error.
const (
	InvalidPayload   = fault.InvalidPayload
	UnknownOrder     = fault.UnknownOrder
	ProviderRejected = fault.ProviderRejected
	HandlerError     = fault.HandlerError
)

// Permanent marks err as the message's own: it is dead-lettered at once with reason, never retried.
func Permanent(reason Reason, err error) error { return fault.Permanent(reason, err) }

// Permanentf is Permanent with a formatted error.
func Permanentf(reason Reason, format string, args ...any) error {
	return fault.Permanentf(reason, format, args...)
}

// Retryable marks err as worth another try later: the message is retried with backoff until the
// retry budget runs out, then dead-lettered retries_exhausted.
func Retryable(err error) error { return fault.Retryable(err) }

// RetryableAfter is Retryable, tried again no sooner than after: the other service's Retry-After
// (a 429). The consumer slows the whole route for it, not only this message.
func RetryableAfter(err error, after time.Duration) error { return fault.RetryableAfter(err, after) }

// RetryableUntil is Retryable, dead-lettered with reason (not retries_exhausted) once the budget
// runs out: an unknown order, which may yet be created.
func RetryableUntil(reason Reason, err error) error { return fault.RetryableUntil(reason, err) }

// AfterCommit runs action once the transaction of ctx (a handler's) has committed, and never if it
// rolls back: a handler logs what it did through it, so that a batch rolled back and run again logs
// each effect once. It reports false, and drops action, outside such a transaction.
func AfterCommit(ctx context.Context, action func(context.Context)) bool {
	return inbox.AfterCommit(ctx, action)
}
