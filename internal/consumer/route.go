package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// route is a Route as the consumer runs it, shared by its partitions: its handler by kind, its
// gate (package gate) and its retry policy (policy.go).
type route struct {
	Route
	// batcher is Handler as a BatchHandler when the route applies batches in one transaction
	// (Config.Transactions PerBatch), else nil.
	batcher inboxtype.BatchHandler

	gate   *gate.Gate
	policy policy

	store  *inbox.Store
	tracer *tracing.Tracer
	log    *slog.Logger
}

func newRoute(r Route, config *Config, log *slog.Logger) (*route, error) {
	rt := &route{
		Route:  r,
		store:  config.Store,
		tracer: config.Tracer,
		log:    log.With("topic", r.Topic),
		policy: policy{retry: config.Retry, parkAfter: config.ParkAfter, parks: config.Ordering == ByKey,
			jitter: backoffJitter},
	}
	if b, ok := r.Handler.(inboxtype.BatchHandler); ok && config.Transactions == PerBatch {
		rt.batcher = b
	}
	book := func(ctx context.Context, n int, every time.Duration) (time.Duration, error) {
		return config.Store.BookCalls(ctx, config.GroupID, r.Name, n, every)
	}
	g, err := gate.New(gate.Config{Topic: r.Topic, Concurrency: r.Concurrency, SlowStart: r.Call != nil,
		RateLimit: r.RateLimit, Book: book, Circuit: config.Circuit, Metrics: config.Metrics, Logger: log})
	if err != nil {
		return nil, err
	}
	rt.gate = g
	return rt, nil
}

// backoffJitter is the randomization factor of the retries' backoff: each wait is within 50% of
// the doubling interval, so that messages failing together do not come back together.
const backoffJitter = 0.5

// inboxMessage is m, read from partition, whose idempotency key is key, as the inbox records it.
func (rt *route) inboxMessage(partition int, offset int64, key string, value []byte) inbox.Message {
	return inbox.Message{
		Handler:     rt.Name,
		Key:         key,
		Fingerprint: inbox.Fingerprint(value),
		Topic:       rt.Topic,
		Partition:   int32(partition),
		Offset:      offset,
	}
}
