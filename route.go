package inboxworker

import (
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/idkey"
)

// Route binds a Kafka topic to what applies its messages: a Handler, whose effect commits in the
// transaction of the message's inbox row (a BatchHandler applies a partition's messages in batches),
// or a CallHandler, whose effect is a call to another service. Exactly one of Handler and Call is
// set.
type Route struct {
	// Topic is the Kafka topic to consume, a name Kafka accepts (letters, digits, '.', '_' and
	// '-'). Its dead letters go to Topic + Config.DLQSuffix. Required.
	Topic string
	// Name is the route's name in the inbox: idempotency keys are unique per name. Required, and
	// unique among the routes (two routes of one name would skip each other's messages as
	// duplicates); keep it when the topic is renamed, so that the keys already recorded still count.
	Name string
	// Handler applies the route's messages in the transaction of their inbox rows.
	Handler Handler
	// Call applies the route's messages by a call to another service, with no transaction open.
	Call CallHandler
	// Verify, when set, checks each message of the route before anything of it is recorded: one
	// it refuses is dead-lettered BadSignature, and so is one it panics on. Nil: messages are not
	// verified.
	Verify Verifier
	// Key finds a message's idempotency key (Delivery.Key), after Verify, or returns why it has
	// none: the message is then dead-lettered with the Reason Permanent gave the error, or
	// MissingIdempotencyKey. A key must be 1 to 255 characters a person can read and tell apart
	// (valid UTF-8; no control or format characters; no white space but the ASCII space, and that
	// not at either end); a message whose key is not one is dead-lettered InvalidIdempotencyKey,
	// and one Key panics on HandlerError. An empty value (a tombstone, never an event to apply) is
	// dead-lettered InvalidPayload before Key sees it. Its verdict must depend on the message
	// alone. Defaults to DefaultKey, the worker's contract: a topic whose producers put the key
	// elsewhere (its own header, a field of its own) names it here, and may fall back on
	// DefaultKey.
	Key func(m Received) (string, error)
	// CallLease is how long the lease on a key lasts while a call is out: the call gets two thirds
	// of it, and the last third covers a request the other service may still be working on after
	// the worker gave up; it is also how long a message waits, after the process calling for it
	// died, before it is called again. Call routes only; set it above the call's own timeout by
	// half again or more, and its two thirds under Timeout: the call must end within its attempt.
	// Defaults to 15s, or Timeout if that is less.
	CallLease time.Duration
	// Timeout bounds one attempt at a message of the route, or at a batch in one transaction: its
	// transaction and its handler; for a call route, its lease, its call and its completion. An
	// attempt that runs out of time is rolled back and retried. Defaults to 30s; else from 100ms
	// to 1h.
	Timeout time.Duration
	// Concurrency is the most handler runs of the route at once, across its partitions (a batch
	// counts once; a call out counts until it ends): a database route's transactions each hold a
	// connection of the pool, a call route's calls load the other service. Defaults to 4.
	Concurrency int
	// RateLimit is the most calls per second of a call route, for the whole consumer group,
	// wherever its traffic is: the instances book each call's turn in a schedule they share in the
	// database, one per 1/RateLimit. A 429 or a Retry-After lowers it for a while on the instance
	// that got it. 0: none; else from one an hour (1.0/3600) to 1,000,000.
	RateLimit float64
	// Retention is how long the route's idempotency keys are remembered: at least as long as the
	// topic can deliver a message again, its retention.ms plus its segment.ms (a key forgotten
	// sooner is a duplicate applied again). Defaults to 337h, what Kafka's defaults (7 days each)
	// and an hour of margin make.
	Retention time.Duration
}

// DefaultRetention is Route.Retention's default: Kafka's default retention.ms and segment.ms
// (7 days each) and an hour of margin.
const DefaultRetention = 337 * time.Hour

// consumerRoute is r as the consumer runs it.
func (r Route) consumerRoute() consumer.Route {
	cr := consumer.Route{Topic: r.Topic, Name: r.Name, CallLease: r.CallLease, Timeout: r.Timeout,
		Concurrency: r.Concurrency, RateLimit: r.RateLimit}
	if r.Handler != nil {
		cr.Handler = r.Handler
	}
	if r.Call != nil {
		cr.Call = r.Call
	}
	if r.Verify != nil {
		cr.Verify = verifyFunc(r.Verify)
	}
	if r.Key != nil {
		cr.IdempotencyKey = keyFunc(r.Key)
	}
	return cr
}

// DefaultKey returns m's idempotency key by the rule of the worker's contract, Route.Key's
// default: the header Idempotency-Key, else the header X-Idempotent-Key, else the header
// webhook-id (a signed callback's id, which its provider keeps when it sends the callback again),
// else the string member named exactly event_id of the JSON object in m.Value. Header names match
// in any case; the first source present decides, and an empty header counts as absent; a source
// given twice must give one key. When there is no valid key, its error carries the reason to
// dead-letter with (see Permanent): InvalidPayload for an empty value (a tombstone) or, with no key
// header, a value that is not JSON; MissingIdempotencyKey; InvalidIdempotencyKey.
func DefaultKey(m Received) (string, error) {
	key, reason, err := idkey.Of(m.message())
	if err != nil {
		return "", fault.Permanent(reason, err)
	}
	return key, nil
}

// keyFunc is key as the consumer calls it, on a Kafka message: the key checked, the reason of an
// error found, a panic an error.
func keyFunc(key func(Received) (string, error)) func(kafka.Message) (string, inboxtype.Reason, error) {
	return func(m kafka.Message) (string, inboxtype.Reason, error) {
		k, err := unpanic("Route.Key", func() (string, error) { return key(received(m)) })
		if err != nil {
			reason := inboxtype.MissingIdempotencyKey
			if fe, ok := errors.AsType[*fault.Error](err); ok && fe.Kind == fault.KindPermanent && fe.Reason != "" {
				reason = fe.Reason
			}
			return "", reason, err
		}
		return idkey.Check(k, "Route.Key")
	}
}
