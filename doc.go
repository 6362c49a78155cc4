// Package inboxworker applies the effects of Kafka messages exactly once, however often a message
// arrives: each message's idempotency key is written into a Postgres inbox table in the same
// transaction as its side effect, so a redelivery, a retry or a rebalance is a no-op.
//
// A team writes a handler for its own topic and its own tables and runs it in its own binary:
//
//   - a Handler (or a HandlerFunc) applies a message through the transaction of its inbox row; a
//     BatchHandler applies many in one transaction;
//   - a CallHandler applies a message by a call to another service (an SMS gateway), with no
//     transaction open, under a lease on the key, sending the key so that a repeated call is one;
//   - a handler's errors say what to do: Permanent (dead-letter with a Reason), Retryable,
//     RetryableAfter, RetryableUntil; ErrAlreadyApplied says its own tables show the effect
//     happened; Expired and Suppressed decline a message on purpose, its key recorded (a code
//     sent too late, a recipient over a limit); AfterCommit runs what must follow only a commit
//     (a log line);
//   - a Route binds a topic to its handler, and may verify each message before anything of it is
//     recorded (a Verifier: a provider's signature; one that does not verify is dead-lettered
//     BadSignature); New builds a Worker of the routes from a Config, and Run consumes until its
//     context is cancelled. Migrate creates the worker's tables.
//
// The worker fetches, orders (messages of one Kafka key one after another), retries with backoff,
// parks a message that keeps failing out of its partition's way, pauses a route whose dependency
// looks down, dead-letters what cannot be applied to <topic>.dlq with its reason, and commits an
// offset only once its message is applied, a duplicate or dead-lettered. A handler sees a
// transaction and a Delivery, never a Kafka type, an offset or a retry policy.
//
// The ready-made binary, cmd/worker, is this package with two bundled routes: payment callbacks
// (the order state machine) and SMS events. docs/handlers.md tells the contract of each and how to
// add a route; docs/design.md how the worker works.
package inboxworker
