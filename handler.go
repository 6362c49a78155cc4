package inboxworker

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// Delivery is what a handler sees of one message: its idempotency key (Key: recorded in the inbox
// with the effect, and what a call handler sends the other service so that a repeated call is
// one), its value as received (Value), and which attempt at it this is (Attempt, from 1: each run
// of its handler counts, in place, in a batch or once parked; a call route's lease carries the
// count of its calls across processes), and when it was produced (Produced: its record's
// timestamp, for a handler that drops what is too old to be of use), and the name of the key that
// verified it (VerifiedBy: when its route verifies messages, Route.Verify; else ""). A handler never
// sees a Kafka type, an offset or a retry policy.
type Delivery = inbox.Delivery

// Handler applies one message's effect through tx, the transaction that also writes the message's
// inbox row: both commit, or neither. It returns nil (applied), ErrAlreadyApplied (its own
// business keys show the effect happened under another idempotency key: a duplicate), Expired or
// Suppressed (it declines the message on purpose, its record of that committing with the key), or
// an error: classified with Permanent, Retryable, RetryableAfter or RetryableUntil. An unclassified
// error is permanent (dead-lettered handler_error), but for Postgres errors, which the inbox
// classifies itself: a deadlock or a serialization failure is retried, an outage waited out.
//
// Handle must do its database work through tx and call no other service: a call to another
// service is a CallHandler's. A panic rolls the transaction back and dead-letters the message.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, d Delivery) error
}

// HandlerFunc is a function as a Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Handle calls f(ctx, tx, d).
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, d Delivery) error { return f(ctx, tx, d) }

// BatchHandler is a Handler that can also apply several messages of one partition in one
// transaction, with set-based statements where it can: one commit for many messages.
//
// HandleBatch applies ds, in offset order, through tx, and returns one result per delivery, with
// Handle's meaning. Each result must be what Handle would have returned, the deliveries applied one
// after another. It may stop at its first error and leave the later results nil: any error rolls
// back the whole batch. The worker then applies the deliveries before the failed one again, as a
// batch, takes the failed one through Handle with its retries and dead letter, and goes on with
// the rest. So HandleBatch may run more than once for a message whose effect commits once: it must
// do database work only, all of it through tx.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, tx pgx.Tx, ds []Delivery) []error
}

// CallHandler applies messages whose effect is a call to another service (an SMS gateway): a
// network call, which never runs inside a transaction. Each message goes through three steps, and
// no database connection is held while a call is out, however many are:
//
//  1. claim: in a short transaction, unless the key is already applied, a lease on the key keeps
//     every other worker from calling for it until the lease is released or expires
//     (Route.CallLease); Check runs in that transaction;
//  2. Call, with no transaction open;
//  3. complete: the key's inbox row and the Completion Call returned, in one transaction.
//
// The claims of several messages may share a transaction, and so may their completions; when such
// a transaction fails, each of its messages does the step again alone, so Check and a Completion
// may run twice, the first time in a transaction that rolls back: they report what they did
// through AfterCommit. A process that dies between Call and the commit leaves the lease to expire;
// the message, delivered again, is called again with the same idempotency key (d.Key), which the
// other service must honour so that the effect happens once. A call that times out keeps its lease
// until it expires too: the other service may still be working on it.
type CallHandler interface {
	// Check runs in the claim transaction, right before the call: after any retry's backoff, the
	// park and the route's pauses. It returns nil to go on, ErrAlreadyApplied when the handler's
	// own tables show the effect happened under d.Key already, Expired or Suppressed to make no
	// call on purpose (what Check wrote commits with the key), or an error that ends the attempt
	// (an invalid payload: Permanent).
	Check(ctx context.Context, tx pgx.Tx, d Delivery) error
	// Call makes the call under d.Key, with no transaction open, and returns what to record of it
	// (nil: nothing but the key). Its context ends two thirds of the way through the lease, and
	// when the attempt ends; its own timeout must be shorter.
	Call(ctx context.Context, d Delivery) (Completion, error)
}

// Completion records a call's result through tx, the transaction that writes the key's inbox row.
// It does database work only. One that fails for good (a permanent error, or a panic) after its call
// went out dead-letters the message saying the call was made, and the key's row of inbox_leases
// stays, marked called: a replay of the message makes no second call (it is dead-lettered again,
// handler_error) until that row is deleted. A retryable failure is retried, and calls again under
// the same key.
type Completion = inbox.Effect
