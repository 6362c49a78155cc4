package consumer

import (
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/internal/effect"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// route is a Route as the consumer runs it, shared by its partitions: its handler by kind, its
// gate (gate.go) and its retry policy (policy.go).
type route struct {
	Route
	// Exactly one of handler and caller is set. batcher is handler as a BatchHandler when the
	// route applies batches in one transaction (Config.Transactions PerBatch), else nil.
	handler effect.Handler
	batcher effect.BatchHandler
	caller  effect.CallHandler

	gate   *gate
	policy policy

	store          *inbox.Store
	attemptTimeout time.Duration
	log            *slog.Logger
}

func newRoute(r Route, config *Config, log *slog.Logger) (*route, error) {
	rt := &route{
		Route:          r,
		store:          config.Store,
		attemptTimeout: config.AttemptTimeout,
		log:            log.With("topic", r.Topic),
		policy: policy{retry: config.Retry, parkAfter: config.ParkAfter, parks: config.Ordering == ByKey,
			jitter: backoffJitter},
	}
	switch h := r.Handler.(type) {
	case effect.CallHandler:
		rt.caller = h
	case effect.Handler:
		rt.handler = h
		if b, ok := h.(effect.BatchHandler); ok && config.Transactions == PerBatch {
			rt.batcher = b
		}
	}
	cc := config.Circuit
	cc.Now, cc.OnChange = nil, nil
	g, err := newGate(r.Topic, r.Concurrency, cc, config.Metrics, log)
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

// isHandler reports whether h can be a Route's Handler.
func isHandler(h any) bool {
	switch h.(type) {
	case effect.Handler, effect.CallHandler:
		return true
	}
	return false
}
