package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	topic      = "orders.events"
	partitions = 3
)

// env is a test's database and broker.
type env struct {
	t       *testing.T
	db      *pgtest.DB
	cluster *kafkatest.Cluster
}

func setup(t *testing.T) *env {
	t.Helper()
	return &env{t: t, db: pgtest.Schema(t), cluster: kafkatest.Start(t, partitions, topic)}
}

// relayConfig is a relay's configuration for tests: a short lease, so that failovers are quick.
func (e *env) relayConfig(pool *pgxpool.Pool) outbox.RelayConfig {
	return outbox.RelayConfig{
		Pool:          pool,
		Brokers:       []string{e.cluster.Addr},
		Topics:        []string{topic},
		LeaseTTL:      2 * time.Second,
		WriteTimeout:  500 * time.Millisecond,
		PollInterval:  20 * time.Millisecond,
		StatsInterval: 50 * time.Millisecond,
		Logger:        testlog.New(e.t),
	}
}

// startRelay runs a relay until the test ends or the returned stop is called.
func (e *env) startRelay(config outbox.RelayConfig) (*outbox.Relay, func()) {
	e.t.Helper()
	r, err := outbox.NewRelay(config)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return r, stop
}

// orderEvent is a test event of order orderNo, numbered n.
func orderEvent(orderNo string, n int) outbox.Event {
	cause := fmt.Sprintf("%s#%d", orderNo, n)
	return outbox.Event{Topic: topic, AggregateType: "order", AggregateID: orderNo, Type: "order.test",
		Cause: cause, Payload: map[string]any{"order_no": orderNo, "n": n}}
}

// eventID is e's id.
func eventID(e outbox.Event) string { return outbox.EventID(e.Type, e.Cause) }

// emit emits events in one transaction of the inbox's, committed.
func (e *env) emit(pool *pgxpool.Pool, events ...outbox.Event) {
	e.t.Helper()
	err := inbox.WithTx(context.Background(), pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.EmitBatch(ctx, tx, events)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// published is what the topic holds, in partition and offset order.
type published struct {
	key, id string
	n       int
	value   []byte
	headers map[string]string
}

func (e *env) readTopic() []published {
	e.t.Helper()
	var out []published
	for p := range partitions {
		for _, m := range e.cluster.ReadAll(e.t, topic, p) {
			rec := published{key: string(m.Key), value: m.Value, headers: map[string]string{}}
			for _, h := range m.Headers {
				rec.headers[h.Key] = string(h.Value)
			}
			rec.id = rec.headers[outbox.HeaderIdempotencyKey]
			var v struct {
				N int `json:"n"`
			}
			_ = json.Unmarshal(m.Value, &v)
			rec.n = v.N
			out = append(out, rec)
		}
	}
	return out
}

// waitPublished waits until the outbox has no event waiting and n are marked published.
func (e *env) waitPublished(n int) {
	e.t.Helper()
	eventually(e.t, func() string {
		var waiting, done int
		err := e.db.Pool.QueryRow(context.Background(), `
			SELECT (SELECT count(*) FROM outbox_waiting), (SELECT count(*) FROM outbox_events) - (SELECT count(*) FROM outbox_waiting)`).
			Scan(&waiting, &done)
		if err != nil {
			e.t.Fatal(err)
		}
		if waiting != 0 || done != n {
			return fmt.Sprintf("%d events waiting, %d published; want 0 and %d", waiting, done, n)
		}
		return ""
	})
}

// checkOrder checks that the topic holds each event of want (by order number, the numbers 1 to n in
// order) in order, each once unless dups allows more; and nothing else.
func checkOrder(t *testing.T, got []published, want map[string]int, dups bool) {
	t.Helper()
	seen := map[string]int{}   // by order: the highest number seen
	count := map[string]int{}  // by event id
	byKey := map[string]bool{} // orders seen
	for _, r := range got {
		byKey[r.key] = true
		count[r.id]++
		if r.id != outbox.EventID("order.test", fmt.Sprintf("%s#%d", r.key, r.n)) {
			t.Errorf("order %s event %d has id %s, not the one derived from its cause", r.key, r.n, r.id)
		}
		switch {
		case r.n == seen[r.key]+1:
			seen[r.key] = r.n
		case r.n <= seen[r.key] && dups:
			// a resend of an event already published
		default:
			t.Errorf("order %s: event %d after event %d", r.key, r.n, seen[r.key])
		}
	}
	for orderNo, n := range want {
		if seen[orderNo] != n {
			t.Errorf("order %s: %d events in order, want %d", orderNo, seen[orderNo], n)
		}
	}
	if len(byKey) != len(want) {
		t.Errorf("%d orders on the topic, want %d", len(byKey), len(want))
	}
	if !dups {
		for id, c := range count {
			if c != 1 {
				t.Errorf("event %s published %d times, want once", id, c)
			}
		}
	}
}

func eventually(t *testing.T, check func() string) {
	t.Helper()
	poll.Until(t, check)
}

// gauge returns the value of a metric with no labels, or of the series with the given label values.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// recorder is an Observer that records each relay's writes.
type recorder struct {
	mu     sync.Mutex
	writes []write
	// stall, when set, is called before the write of the relay of epoch: a test may hold it there.
	stall func(epoch int64)
}

type write struct {
	epoch      int64
	start, end time.Time
	msgs       int
	published  int
	err        error
}

func (r *recorder) Publishing(epoch int64, msgs []kafka.Message) {
	r.mu.Lock()
	stall := r.stall
	r.writes = append(r.writes, write{epoch: epoch, start: time.Now(), msgs: len(msgs)})
	r.mu.Unlock()
	if stall != nil {
		stall(epoch)
	}
}

func (r *recorder) Published(epoch int64, msgs []kafka.Message, published []bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.writes) - 1; i >= 0; i-- {
		if w := &r.writes[i]; w.epoch == epoch && w.end.IsZero() {
			w.end, w.err = time.Now(), err
			for _, ok := range published {
				if ok {
					w.published++
				}
			}
			return
		}
	}
}

func (r *recorder) all() []write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]write(nil), r.writes...)
}

// quietLogger discards logs, for relays that would flood the test log.
var _ = slog.New(slog.DiscardHandler)
