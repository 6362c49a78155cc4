// Package inboxtype holds what a handler of package inboxworker touches: what it is given (a
// Delivery), what it implements (a Handler, a BatchHandler or a CallHandler), what it returns (a
// Completion, ErrAlreadyApplied), what it emits (an Event) and what it names (a Reason).
//
// Package inboxworker re-exports each of them under the same name, and the worker's internals use
// them as they are: a handler reads one declaration, with each field documented on the field.
// inboxtype imports nothing of the worker, so a package of handlers may import it alone.
package inboxtype

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Delivery is what a handler sees of one message. A handler never sees a Kafka type, an offset or a
// retry policy.
type Delivery struct {
	// Key is the message's idempotency key, as its route found it (inboxworker.Route.Key): the
	// inbox records it with the effect, and a CallHandler sends it to the other service so that a
	// repeated call is one.
	Key string
	// Value is the message's value, as received.
	Value []byte
	// Attempt counts the attempts at the message, this one included, from 1: each run of its
	// handler counts, in place, in a batch or once parked; a call route's lease carries the count
	// of its calls across processes.
	Attempt int
	// Produced is when the message was produced: its record's timestamp (CreateTime, unless the
	// topic is set to LogAppendTime), for a handler that drops what is too old to be of use. Zero
	// when the record has none.
	Produced time.Time
	// VerifiedBy is the name of the key that verified the message when its route verifies messages
	// (inboxworker.Route.Verify), for the handler to record with its effect; "" otherwise.
	VerifiedBy string
}

// Handler applies one message's effect through tx, the transaction that also writes the message's
// inbox row: both commit, or neither. It returns nil (applied), ErrAlreadyApplied (its own
// business keys show the effect happened under another idempotency key: a duplicate),
// inboxworker.Expired or inboxworker.Suppressed (it declines the message on purpose, its record of
// that committing with the key), or an error: classified with inboxworker.Permanent, Retryable,
// RetryableAfter or RetryableUntil. An unclassified error is permanent (dead-lettered
// handler_error), but for Postgres errors, which the inbox classifies itself: a deadlock or a
// serialization failure is retried, an outage waited out.
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
//  1. lease: in a short transaction, unless the key is already applied, a lease on the key keeps
//     every other worker from calling for it until the lease is released or expires
//     (inboxworker.Route.CallLease); Check runs in that transaction;
//  2. Call, with no transaction open;
//  3. complete: the key's inbox row and the Completion Call returned, in one transaction.
//
// The leases of several messages may share a transaction, and so may their completions; when such
// a transaction fails, each of its messages does the step again alone, so Check and a Completion
// may run twice, the first time in a transaction that rolls back: they report what they did
// through inboxworker.AfterCommit. A process that dies between Call and the commit leaves the lease
// to expire; the message, delivered again, is called again with the same idempotency key (d.Key),
// which the other service must honour so that the effect happens once. A call that times out keeps
// its lease until it expires too: the other service may still be working on it.
type CallHandler interface {
	// Check runs in the lease's transaction, right before the call: after any retry's backoff,
	// the park and the route's pauses. It returns nil to go on, ErrAlreadyApplied when the
	// handler's own tables show the effect happened under d.Key already, inboxworker.Expired or
	// Suppressed to make no call on purpose (what Check wrote commits with the key), or an error
	// that ends the attempt (an invalid payload: inboxworker.Permanent).
	Check(ctx context.Context, tx pgx.Tx, d Delivery) error
	// Call makes the call under d.Key, with no transaction open, and returns what to record of it
	// (nil: nothing but the key). Its context ends two thirds of the way through the lease, and
	// when the attempt ends (inboxworker.Route.Timeout); its own timeout must be shorter.
	Call(ctx context.Context, d Delivery) (Completion, error)
}

// Completion records a call's result through tx, the transaction that writes the key's inbox row.
// It does database work only. One that fails for good (a permanent error, or a panic) after its
// call went out dead-letters the message saying the call was made, and the key's row of
// inbox_leases stays, marked called: a replay of the message makes no second call (it is
// dead-lettered again, handler_error) until that row is deleted. A retryable failure is retried,
// and calls again under the same key.
type Completion func(ctx context.Context, tx pgx.Tx) error

// ErrAlreadyApplied is what a handler returns when its own business keys show the effect happened
// already under another idempotency key (a payment provider resending one payment under a new
// event id): the message is a duplicate, and its inbox row commits with whatever else the handler
// wrote in the transaction (it should write nothing). The transaction must still be usable: after
// a failed statement the commit fails, and that error is the message's.
var ErrAlreadyApplied = errors.New("inboxworker: effect already applied under another key")

// Reason is a dead-letter reason code: the dlq-reason header of a message dead-lettered. A handler
// names its own (unknown_order, provider_rejected) for the failures of its domain.
type Reason string

// The reasons the worker gives dead letters itself, and the two general ones a handler may give.
const (
	// InvalidPayload: the message can never be applied as it is (bad JSON, a missing field).
	InvalidPayload Reason = "invalid_payload"
	// HandlerError: an error no one classified, or a handler's panic.
	HandlerError Reason = "handler_error"
	// RetriesExhausted: a retryable error outlasted the retry budget.
	RetriesExhausted Reason = "retries_exhausted"
	// MissingIdempotencyKey: the message has no idempotency key.
	MissingIdempotencyKey Reason = "missing_idempotency_key"
	// InvalidIdempotencyKey: the message's idempotency key is not one (empty, too long, unreadable,
	// or given twice with different values).
	InvalidIdempotencyKey Reason = "invalid_idempotency_key"
	// IdempotencyKeyReused: the key was applied before with another payload.
	IdempotencyKeyReused Reason = "idempotency_key_reused"
	// CrashLoop: the worker died every time it ran the message.
	CrashLoop Reason = "crash_loop"
	// BadSignature: the message's route verifies messages, and this one did not verify.
	BadSignature Reason = "bad_signature"
)

// Event is an event a handler emits (inboxworker.Emit), to be published to Kafka once its
// transaction commits: the transactional outbox. Its id, derived from Type and Cause
// (inboxworker.EventID), is its Idempotency-Key header, so that a consumer downstream applies it
// once.
type Event struct {
	// Topic is the Kafka topic it is published to, one of inboxworker.Config.EventTopics.
	// Required.
	Topic string
	// AggregateType names the kind of thing the event is about ("order"). Required.
	AggregateType string
	// AggregateID names the thing ("A-1001"); it is the Kafka message key. The events of one
	// aggregate are published in the order their transactions committed. Required.
	AggregateID string
	// Type says what happened ("order.paid"). Required.
	Type string
	// Cause identifies what caused the event, unambiguously and the same every time it is emitted
	// for that cause (a payment provider's transaction: provider and transaction id). The event's
	// id is derived from Type and Cause. Required.
	Cause string
	// Payload is the Kafka message value, encoded with encoding/json (a json.RawMessage or []byte
	// is taken as it is, and must be valid JSON), at most 512 KiB encoded. Required.
	Payload any
}
