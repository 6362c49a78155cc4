package inboxworker

import (
	"context"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// The reasons the worker gives dead letters itself, and the two general ones a handler may give.
const (
	// InvalidPayload: the message can never be applied as it is (bad JSON, a missing field).
	InvalidPayload = inboxtype.InvalidPayload
	// HandlerError: an error no one classified, or a handler's panic.
	HandlerError = inboxtype.HandlerError
	// RetriesExhausted: a retryable error outlasted the retry budget.
	RetriesExhausted = inboxtype.RetriesExhausted
	// MissingIdempotencyKey, InvalidIdempotencyKey: the message has no valid idempotency key.
	MissingIdempotencyKey = inboxtype.MissingIdempotencyKey
	InvalidIdempotencyKey = inboxtype.InvalidIdempotencyKey
	// IdempotencyKeyReused: the key was applied before with another payload.
	IdempotencyKeyReused = inboxtype.IdempotencyKeyReused
	// CrashLoop: the worker died every time it ran the message.
	CrashLoop = inboxtype.CrashLoop
)

// Expired declines a message on purpose as too late to be of use (a verification code the user
// has stopped waiting for), err saying why. A Handler, a BatchHandler's result or a CallHandler's
// Check returns it: the message's inbox row commits with whatever else the handler wrote in the
// transaction (its record of the decision: a row that says EXPIRED), so that a redelivery, a
// replay or a retry of the message stays a no-op, and the message finishes with outcome expired
// (inboxworker_messages_total{outcome="expired"}): never retried, never a dead letter. Returned by
// a Check, which runs in the lease's transaction right before the call, after any wait (a
// retry's backoff, the park, a pause of the route), it keeps the call from being made at the last
// moment. Never for an effect that must happen, however late (a payment).
func Expired(err error) error { return inbox.Decline(inbox.Expired, err) }

// Suppressed declines a message on purpose as over a limit (a recipient's share of SMS, say), err
// saying why, as Expired does: its inbox row commits with what the handler wrote (a row that says
// SUPPRESSED), a redelivery stays a no-op, and the message finishes with outcome suppressed
// (inboxworker_messages_total{outcome="suppressed"}): never retried, never a dead letter.
func Suppressed(err error) error { return inbox.Decline(inbox.Suppressed, err) }

// Permanent marks err as the message's own: it is dead-lettered at once with reason, never retried.
func Permanent(reason Reason, err error) error { return fault.Permanent(reason, err) }

// Retryable marks err as worth another try later: the message is retried with backoff until its
// retry budget (Config.Retry.MaxElapsed) runs out, then dead-lettered retries_exhausted.
func Retryable(err error) error { return fault.Retryable(err) }

// RetryableAfter is Retryable, tried again no sooner than after: the other service's Retry-After
// (a 429, a 503). The whole route waits as long, and the wait is not charged to the budget.
func RetryableAfter(err error, after time.Duration) error { return fault.RetryableAfter(err, after) }

// RetryableUntil is Retryable, dead-lettered with reason (not retries_exhausted) once the budget
// runs out: an order that does not exist yet, and may be created.
func RetryableUntil(reason Reason, err error) error { return fault.RetryableUntil(reason, err) }

// AfterCommit runs action once the transaction of ctx — a handler's, a check's or a completion's —
// has committed, and never if it rolls back: a handler logs what it did through it, so that a batch
// rolled back and run again logs each effect once. It reports false, and drops action, outside such
// a transaction.
func AfterCommit(ctx context.Context, action func(context.Context)) bool {
	return inbox.AfterCommit(ctx, action)
}
