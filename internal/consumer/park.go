package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// Parking: a message the policy decides to park (policy.go) goes into the park (inbox.Store.Park)
// with its history, and every later message of its ordering key goes behind it, so that its
// partition goes on while the key keeps its order. The partition's retrier (retrier.go) takes the
// park's messages on from there.

// parkedKeys is the set of the ordering keys of one partition that have a message in the park: a
// message of such a key is parked behind them, without running. The set mirrors the park under its
// lock: a key is added as its first message is parked, and dropped only once the park holds none of
// its messages, each checked in Postgres with the lock held, so that a message parked behind its key
// at the moment the key's last parked message leaves is never overtaken.
type parkedKeys struct {
	store     *inbox.Store
	topic     string
	partition int32

	mu   sync.Mutex
	keys map[string]bool
}

// loadParkedKeys reads the keys parked from topic's partition: a new owner's.
func loadParkedKeys(ctx context.Context, store *inbox.Store, topic string, partition int) (*parkedKeys, error) {
	keys, err := store.Park().Keys(ctx, topic, int32(partition))
	if err != nil {
		return nil, err
	}
	k := &parkedKeys{store: store, topic: topic, partition: int32(partition), keys: make(map[string]bool, len(keys))}
	for _, key := range keys {
		k.keys[string(key)] = true
	}
	return k, nil
}

// parked reports whether a message of orderingKey is parked.
func (k *parkedKeys) parked(orderingKey []byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys[string(orderingKey)]
}

// park parks p, due in retryIn once it is its key's head.
func (k *parkedKeys) park(ctx context.Context, p inbox.Parked, retryIn time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, err := k.store.Park().Add(ctx, p, retryIn); err != nil {
		return err
	}
	k.keys[string(p.OrderingKey)] = true
	return nil
}

// parkBehind parks p behind its key if a message of the key is parked, and reports whether it did.
func (k *parkedKeys) parkBehind(ctx context.Context, p inbox.Parked) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.keys[string(p.OrderingKey)] {
		return false, nil
	}
	if _, err := k.store.Park().Add(ctx, p, 0); err != nil {
		return false, err
	}
	return true, nil
}

// left is told that a message of orderingKey left the park: the key is dropped if none is left.
func (k *parkedKeys) left(ctx context.Context, orderingKey []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	parked, err := k.store.Park().HasKey(ctx, k.topic, k.partition, orderingKey)
	if err != nil {
		return err
	}
	if !parked {
		delete(k.keys, string(orderingKey))
	}
	return nil
}

// len returns how many keys are parked.
func (k *parkedKeys) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// keyParked reports whether e's ordering key has messages in the park, so that e is to be parked
// behind them.
func (p *partition) keyParked(e *entry) bool {
	return p.parked != nil && e.keyErr == nil && p.parked.parked([]byte(e.order))
}

// parkBehind parks e behind the messages of its key in the park, if there still are any, and says
// whether it did. It waits for the database as long as it is down; it fails only when ctx is done
// or the consumer is stopping.
func (p *partition) parkBehind(ctx context.Context, e *entry, log *slog.Logger) (bool, error) {
	if !p.keyParked(e) {
		return false, nil
	}
	var behind bool
	err := p.retryDatabase(ctx, "park the message", func(ctx context.Context) (err error) {
		behind, err = p.parked.parkBehind(ctx, toParked(p.route.Route, p.id, e))
		return err
	})
	if err != nil {
		return false, err
	}
	if behind {
		log.InfoContext(ctx, "parked the message behind its key")
		p.retrier.wake()
	}
	return behind, nil
}

// park parks e, whose history is h, due after d.delay. It waits for the database as long as it is
// down; it fails only when ctx is done or the consumer is stopping.
func (p *partition) park(ctx context.Context, e *entry, h history, d decision, log *slog.Logger) error {
	parked := toParked(p.route.Route, p.id, e)
	parked.Attempts, parked.Reason, parked.FirstFailedAt, parked.BudgetSpent = h.attempts, h.reason, h.firstAt, h.spent
	if h.first != nil {
		parked.FirstError, parked.LastError = h.first.Error(), h.last.Error()
	}
	err := p.retryDatabase(ctx, "park the message", func(ctx context.Context) error {
		return p.parked.park(ctx, parked, d.delay)
	})
	if err != nil {
		return err
	}
	why := "its retries in place did not clear it"
	if d.wait != "" {
		why = d.wait
	}
	attrs := []any{"why", why, "attempts", h.attempts, "retry_in", d.delay, "budget_spent", h.spent}
	if h.last != nil {
		attrs = append(attrs, "error", h.last)
	}
	log.InfoContext(ctx, "parked the message", attrs...)
	e.span.SetOutcome("parked")
	p.retrier.wake()
	return nil
}

// toParked is e, read from route's partition, as the park keeps it.
func toParked(route Route, partition int, e *entry) inbox.Parked {
	m := e.msg
	p := inbox.Parked{
		Handler:        route.Name,
		Topic:          route.Topic,
		Partition:      int32(partition),
		Offset:         m.Offset,
		OrderingKey:    []byte(e.order),
		IdempotencyKey: e.key,
		MessageKey:     m.Key,
		Value:          m.Value,
		Produced:       m.Time,
		VerifiedBy:     e.verifiedBy,
	}
	for _, h := range m.Headers {
		p.Headers = append(p.Headers, inbox.Header{Key: h.Key, Value: h.Value})
	}
	return p
}

// fromParked is the message p was parked from, as it was read: its key, value and headers, and its
// origin.
func fromParked(p inbox.Parked) kafka.Message {
	m := kafka.Message{
		Topic:     p.Topic,
		Partition: int(p.Partition),
		Offset:    p.Offset,
		Key:       p.MessageKey,
		Value:     p.Value,
		Time:      p.Produced,
	}
	for _, h := range p.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	return m
}

// reportParked refreshes the park's gauges of topics every interval until ctx is done. A failed
// read is logged at debug level and leaves the gauges as they were: the park is in Postgres, whose
// outages are reported elsewhere.
func reportParked(ctx context.Context, m *Metrics, store *inbox.Store, topics []string, interval time.Duration, log *slog.Logger) {
	if m == nil {
		return
	}
	wait.Every(ctx, interval, log, "read the park's statistics", func(ctx context.Context) error {
		stats, err := store.Park().Stats(ctx)
		if err == nil {
			m.observe(topics, stats)
		}
		return err
	})
}
