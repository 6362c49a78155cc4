package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
)

// The tests of ordering by key, of the limits on what runs at once, and of what a route costs.

// sequencer is a test handler that records, for each message, its ordering key and its sequence
// number in that key (from the value) in the table sequences, in the inbox transaction: the rows'
// ids give the order in which each key's effects were applied. It takes a moment on some messages
// and fails some first attempts, so that a key's later message would overtake an earlier one if
// the consumer let it.
type sequencer struct {
	mu     sync.Mutex
	failed map[string]bool
}

// sequenced is the value of the messages the sequencer applies.
type sequenced struct {
	EventID string `json:"event_id"`
	Order   string `json:"order"`
	Seq     int    `json:"seq"`
}

const sequencesTable = `CREATE TABLE sequences (
	id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	okey  text NOT NULL,
	seq   int  NOT NULL
)`

func (h *sequencer) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	var v sequenced
	if err := json.Unmarshal(d.Value, &v); err != nil {
		return fault.Permanent(inboxtype.InvalidPayload, err)
	}
	if v.Seq%3 == 0 {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	}
	if v.Seq%7 == 3 {
		h.mu.Lock()
		first := !h.failed[d.Key]
		h.failed[d.Key] = true
		h.mu.Unlock()
		if first {
			return fault.Retryable(errors.New("not yet"))
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO sequences (okey, seq) VALUES ($1, $2)`, v.Order, v.Seq)
	return err
}

func (h *sequencer) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	return handleEach(ctx, tx, ds, h.Handle)
}

// TestKeyOrder interleaves 50 SMS events to one phone and 50 payment callbacks of one order
// (FAILED, then SUCCESS, then redeliveries of both) with 1,000 other keys over 4 partitions: each
// key's effects are applied once each, in offset order.
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 4)
		if _, err := e.db.Pool.Exec(t.Context(), sequencesTable); err != nil {
			t.Fatal(err)
		}
		var msgs []kafka.Message
		want := make(map[string][]int) // by ordering key: the sequence numbers to apply, in order
		add := func(kafkaKey, eventID string, seq int, redelivery bool) {
			value, _ := json.Marshal(sequenced{EventID: eventID, Order: kafkaKey, Seq: seq})
			msgs = append(msgs, kafka.Message{Key: []byte(kafkaKey), Value: value})
			if !redelivery {
				want[kafkaKey] = append(want[kafkaKey], seq)
			}
		}
		phone, order := "+8613800138000", "ORD-1"
		other := 0
		for i := range 50 {
			add(phone, fmt.Sprintf("sms-%d", i), i, false)
			switch {
			case i == 0:
				add(order, "cb-failed", i, false)
			case i == 1:
				add(order, "cb-success", i, false)
			case i%2 == 0:
				// A redelivery: the same event, the same value, found in the inbox.
				value, _ := json.Marshal(sequenced{EventID: "cb-success", Order: order, Seq: 1})
				msgs = append(msgs, kafka.Message{Key: []byte(order), Value: value})
			default:
				add(order, fmt.Sprintf("cb-%d", i), i, false) // the provider resending under a new key
			}
			for range 20 {
				add(fmt.Sprintf("key-%d", other), fmt.Sprintf("other-%d", other), 0, false)
				other++
			}
		}
		e.kafka.Produce(t, topic, msgs...)
		config := e.config(&sequencer{failed: make(map[string]bool)})
		config.Routes[0].Concurrency = 16
		e.start(config)
		e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(msgs)) })

		rows, err := e.db.Pool.Query(t.Context(), `SELECT okey, seq FROM sequences ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		got := make(map[string][]int)
		var okey string
		var seq int
		if _, err := pgx.ForEachRow(rows, []any{&okey, &seq}, func() error {
			got[okey] = append(got[okey], seq)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for k, w := range want {
			if !slices.Equal(got[k], w) {
				t.Errorf("key %s: applied %v, want %v", k, got[k], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%d keys applied, want %d", len(got), len(want))
		}
	})
}

// gauge counts the runs in progress and remembers the most at once.
type gauge struct {
	now, peak atomic.Int64
}

func (g *gauge) enter() {
	n := g.now.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.now.Add(-1) }

// poolOf returns a pool of max connections to e's schema: runs that hold a transaction for 100 ms
// each need one connection each to run at once.
func (e *env) poolOf(max int32) *pgxpool.Pool {
	e.t.Helper()
	config, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	config.MaxConns = max
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	return pool
}

// TestConcurrency runs handlers that take 100 ms over 4 partitions: many run at once, never more
// than the route's Concurrency; a batch transaction counts once.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	t.Run("Messages", func(t *testing.T) {
		t.Parallel()
		const limit = 20
		e := setup(t, testMode{tx: consumer.PerMessage, order: consumer.ByKey}, 4)
		var g gauge
		config := e.config(handlerFunc(func(ctx context.Context, d inbox.Delivery) error {
			g.enter()
			defer g.leave()
			time.Sleep(100 * time.Millisecond)
			return nil
		}))
		store, err := inbox.NewStore(e.poolOf(limit+4), inbox.Config{Logger: e.log})
		if err != nil {
			t.Fatal(err)
		}
		config.Store = store
		config.Routes[0].Concurrency = limit
		e.start(config)
		all := keys("c", 400)
		e.produce(all...)
		e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
		if peak := g.peak.Load(); peak < 16 || peak > limit {
			t.Errorf("at most %d handlers ran at once, want at least 16 and at most %d", peak, limit)
		}
	})
	t.Run("Batches", func(t *testing.T) {
		t.Parallel()
		const limit = 3
		e := setup(t, testMode{tx: consumer.PerBatch, order: consumer.ByKey}, 4)
		var g gauge
		config := e.config(batchFunc(func(ctx context.Context, ds []inbox.Delivery) []error {
			g.enter()
			defer g.leave()
			time.Sleep(100 * time.Millisecond)
			return make([]error, len(ds))
		}))
		config.Routes[0].Concurrency = limit
		config.BatchSize = 10
		e.start(config)
		all := keys("b", 200)
		e.produce(all...)
		e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
		if peak := g.peak.Load(); peak < 2 || peak > limit {
			t.Errorf("at most %d batches ran at once, want at least 2 and at most %d", peak, limit)
		}
	})
}

// batchFunc is a BatchHandler that records nothing.
type batchFunc func(ctx context.Context, ds []inbox.Delivery) []error

func (f batchFunc) Handle(ctx context.Context, _ pgx.Tx, d inbox.Delivery) error {
	return f(ctx, []inbox.Delivery{d})[0]
}

func (f batchFunc) HandleBatch(ctx context.Context, _ pgx.Tx, ds []inbox.Delivery) []error {
	return f(ctx, ds)
}

// inFlight is an Observer that checks, at every fetch, that no more than max messages of a
// partition are fetched and not yet committed.
type inFlight struct {
	t   *testing.T
	max int64

	mu        sync.Mutex
	next      map[int]int64 // by partition: the offset after the last fetched
	committed map[int]int64
	peak      int64
}

func (o *inFlight) Fetched(_ string, partition int, offset int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.next[partition] = offset + 1
	n := offset + 1 - o.committed[partition]
	o.peak = max(o.peak, n)
	if n > o.max {
		o.t.Errorf("partition %d: %d messages fetched and not committed, more than %d", partition, n, o.max)
	}
}

func (o *inFlight) Committed(_ string, partition int, offset int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.committed[partition] = offset
}

// TestMaxInFlight holds a partition's first message while the others could run: no more than
// MaxInFlight messages are fetched ahead of the commit.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		const limit = 8
		e := setup(t, mode, 1)
		release := make(chan struct{})
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			if d.Key == "first" {
				<-release
			}
			return nil
		}})
		observer := &inFlight{t: t, max: limit, next: map[int]int64{}, committed: map[int]int64{}}
		config.Observer = observer
		config.MaxInFlight = limit
		config.Routes[0].Concurrency = 100
		e.start(config)
		all := append([]string{"first"}, keys("then", 40)...)
		e.produce(all...)
		e.waitFor("the window to fill", func() bool {
			observer.mu.Lock()
			defer observer.mu.Unlock()
			return observer.next[0] == limit
		})
		close(release)
		e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
		checkOnce(t, e, all)
	})
}

// TestRetryAfterPausesRoute checks that a retryable error's RetryAfter holds every start of its
// route, not only the retry of its message.
func TestRetryAfterPausesRoute(t *testing.T) {
	t.Parallel()
	const retryAfter = 500 * time.Millisecond
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 2)
		var mu sync.Mutex
		var throttledAt, otherAt time.Time
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case d.Key == "throttled" && d.Attempt == 1:
				throttledAt = time.Now()
				return &fault.Error{Kind: fault.KindRetryable, RetryAfter: retryAfter, Err: errors.New("429")}
			case d.Key == "other" && otherAt.IsZero():
				otherAt = time.Now()
			}
			return nil
		}})
		e.start(config)
		e.produce("throttled")
		retries := config.Metrics.Retries.WithLabelValues(topic)
		e.waitFor("the throttled message's retry", func() bool { return testutil.ToFloat64(retries) == 1 })
		e.produce("other")
		e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })
		mu.Lock()
		defer mu.Unlock()
		if waited := otherAt.Sub(throttledAt); waited < retryAfter {
			t.Errorf("another message of the route started %s after a %s Retry-After", waited, retryAfter)
		}
		checkOnce(t, e, []string{"throttled", "other"})
	})
}

// audit is the handler of a test-only route: what a third route is made of, besides its line in
// Config.Routes.
type audit struct{}

func (audit) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	if string(d.Value) == `{"event_id":"bad"}` {
		return fault.Permanent(inboxtype.InvalidPayload, errors.New("not an audit"))
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, body) VALUES ($1, 'audit')`, d.Key)
	return err
}

// TestThirdRoute adds a route to the consumer with one line: its topic is consumed, its keys have
// an inbox scope of their own, its dead letters go to its own dead-letter topic.
func TestThirdRoute(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		createTopic(t, e.kafka.Addr, "audits")
		createTopic(t, e.kafka.Addr, "audits.dlq")
		config := e.config(&recorder{})
		config.Routes = append(config.Routes, consumer.Route{Topic: "audits", Name: "audits", Handler: audit{}})
		e.start(config)

		e.produce("shared")
		e.kafka.Produce(t, "audits",
			kafka.Message{Value: []byte(`{"event_id":"shared"}`)}, // the same key, another scope
			kafka.Message{Value: []byte(`{"event_id":"bad"}`)})
		e.waitFor("both topics consumed", func() bool {
			return e.committed() == 1 && e.kafka.CommittedOffset(t, group, "audits", 0) == 2
		})
		rows, err := e.db.Pool.Query(t.Context(), `SELECT body FROM effects WHERE key = 'shared' ORDER BY body`)
		if err != nil {
			t.Fatal(err)
		}
		bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(bodies) != 2 || bodies[0] != "audit" {
			t.Errorf("effects of key shared = %v, want one per route", bodies)
		}
		dead := e.kafka.ReadAll(t, "audits.dlq", 0)
		if len(dead) != 1 || kafkatest.Header(dead[0], "dlq-reason") != string(inboxtype.InvalidPayload) {
			t.Errorf("audits dead letters = %v, want the bad one", dead)
		}
	})
}

// TestRouteKeyRule gives a route a key rule of its own: its messages are keyed by their Kafka key,
// not by the contract's headers and event_id, redeliveries are duplicates under it, and a message
// the rule refuses is dead-lettered with the reason the rule gave. The other route keeps the
// contract's rule.
func TestRouteKeyRule(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerBatch, consumer.ByKey}, 1)
	createTopic(t, e.kafka.Addr, "audits")
	createTopic(t, e.kafka.Addr, "audits.dlq")
	config := e.config(&recorder{})
	byKafkaKey := func(m kafka.Message) (string, inboxtype.Reason, error) {
		if len(m.Key) == 0 {
			return "", inboxtype.MissingIdempotencyKey, errors.New("an audit needs a Kafka key")
		}
		return "audit-" + string(m.Key), "", nil
	}
	config.Routes = append(config.Routes, consumer.Route{Topic: "audits", Name: "audits", Handler: audit{},
		IdempotencyKey: byKafkaKey})
	e.start(config)

	e.produce("contract")
	e.kafka.Produce(t, "audits",
		kafka.Message{Key: []byte("a1"), Value: []byte(`{"event_id":"ignored-1"}`)},
		kafka.Message{Key: []byte("a1"), Value: []byte(`{"event_id":"ignored-1"}`)}, // a redelivery
		kafka.Message{Value: []byte(`{"event_id":"no-kafka-key"}`)})
	e.waitFor("both topics consumed", func() bool {
		return e.committed() == 1 && e.kafka.CommittedOffset(t, group, "audits", 0) == 3
	})
	rows, err := e.db.Pool.Query(t.Context(), `SELECT key FROM effects ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"audit-a1", "contract"}; !slices.Equal(keys, want) {
		t.Errorf("effects = %v, want %v: the audit once under its Kafka key, the other route by event_id", keys, want)
	}
	dead := e.kafka.ReadAll(t, "audits.dlq", 0)
	if len(dead) != 1 || kafkatest.Header(dead[0], "dlq-reason") != string(inboxtype.MissingIdempotencyKey) {
		t.Errorf("audits dead letters = %d, want the one without a Kafka key as missing_idempotency_key", len(dead))
	}
}
