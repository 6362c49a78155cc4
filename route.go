package inboxworker

import (
	"time"

	"github.com/inboxworker/inboxworker/internal/consumer"
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
	// it refuses is dead-lettered BadSignature. Nil: messages are not verified.
	Verify Verifier
	// CallLease is how long the lease on a key lasts while a call is out: the call gets two thirds
	// of it, and the last third covers a request the other service may still be working on after
	// the worker gave up; it is also how long a message waits, after the process calling for it
	// died, before it is called again. Call routes only; set it above the
	// call's own timeout by half again or more. Under 45s: the call must end within an attempt's
	// 30s. Defaults to 15s.
	CallLease time.Duration
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
	cr := consumer.Route{Topic: r.Topic, Name: r.Name, CallLease: r.CallLease, Concurrency: r.Concurrency,
		RateLimit: r.RateLimit}
	if r.Handler != nil {
		cr.Handler = r.Handler
	}
	if r.Call != nil {
		cr.Call = r.Call
	}
	if r.Verify != nil {
		cr.Verify = verifyFunc(r.Verify)
	}
	return cr
}
