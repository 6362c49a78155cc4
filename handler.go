package inboxworker

import "github.com/inboxworker/inboxworker/inboxtype"

// The types a handler touches are declared in package inboxtype, each field and method documented
// there (go doc inboxtype), and re-exported here under the same names.
type (
	// Delivery is what a handler sees of one message: its idempotency Key, its Value, its Attempt,
	// when it was Produced and the key that VerifiedBy it.
	Delivery = inboxtype.Delivery
	// Handler applies one message's effect through the transaction that writes its inbox row.
	Handler = inboxtype.Handler
	// HandlerFunc is a function as a Handler.
	HandlerFunc = inboxtype.HandlerFunc
	// BatchHandler is a Handler that also applies several messages of a partition in one
	// transaction.
	BatchHandler = inboxtype.BatchHandler
	// CallHandler applies messages whose effect is a call to another service, with no
	// transaction open, under a lease on the key.
	CallHandler = inboxtype.CallHandler
	// Completion records a call's result in the transaction that writes the key's inbox row.
	Completion = inboxtype.Completion
	// Event is an event a handler emits (Emit), published to Kafka once its transaction commits.
	Event = inboxtype.Event
	// Reason is a dead-letter reason code: the dlq-reason header of a dead letter.
	Reason = inboxtype.Reason
)

// ErrAlreadyApplied is what a handler returns when its own business keys show the effect happened
// already under another idempotency key: the message is a duplicate (inboxtype.ErrAlreadyApplied).
var ErrAlreadyApplied = inboxtype.ErrAlreadyApplied
