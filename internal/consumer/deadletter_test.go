package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestDeadLetterTopicRefuses checks that a dead letter its topic refuses for good neither blocks the
// partition nor is lost: it is kept in the dead_letters table with everything the dead letter would
// have carried, counted and logged, the message behind it is applied and the offsets move on.
func TestDeadLetterTopicRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// dlqConfig configures the dead-letter topic.
		dlqConfig map[string]string
		// size is the size of the message's value.
		size int
	}{
		// The broker refuses it (MESSAGE_TOO_LARGE): the topic takes smaller records than the source.
		{"TooLargeForTheTopic", map[string]string{"max.message.bytes": "2000"}, 4000},
		// kafka-go refuses it before sending: it fits the source topic, but not kafka-go's 1 MiB
		// limit once the dlq-* headers are added.
		{"TooLargeOnceTheHeadersAreAdded", nil, 1_048_400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			forEachMode(t, func(t *testing.T, mode testMode) {
				testDeadLetterTopicRefuses(t, mode, tt.dlqConfig, tt.size)
			})
		})
	}
}

func testDeadLetterTopicRefuses(t *testing.T, mode testMode, dlqConfig map[string]string, size int) {
	e := &env{t: t, mode: mode, kafka: kafkatest.Start(t, 1, topic), db: pgtest.Schema(t), partitions: 1, log: testlog.New(t)}
	if err := e.kafka.CreateTopic(dlqTopic, 1, dlqConfig); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(t.Context(), effectsTable); err != nil {
		t.Fatal(err)
	}
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "big" {
			return fault.Permanent(inboxtype.InvalidPayload, errors.New("bad payload"))
		}
		return nil
	}})
	reg := prometheus.NewRegistry()
	config.Metrics = consumer.NewMetrics(reg)

	big := kafka.Message{Key: []byte("order-big"),
		Value:   fmt.Appendf(nil, `{"event_id":"big","pad":%q}`, strings.Repeat("x", size-len(`{"event_id":"big","pad":""}`))),
		Headers: []kafka.Header{{Key: "traceparent", Value: []byte("00-trace")}}}
	next := kafka.Message{Key: []byte("order-next"), Value: eventValue("next", 1)}
	e.kafka.Produce(t, topic, big)
	e.kafka.Produce(t, topic, next)
	e.start(config)

	// Today's failure: the partition waited for the dead-letter topic forever.
	e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })
	checkOnce(t, e, []string{"next"})
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d messages in the dead-letter topic, want none: it refused the dead letter", len(dead))
	}

	store := deadletter.NewStore(e.db.Pool)
	var stored []deadletter.Stored
	err := store.Pending(t.Context(), dlqTopic, func(d deadletter.Stored) (bool, error) {
		stored = append(stored, d)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 {
		t.Fatalf("%d dead letters stored, want the big one", len(stored))
	}
	d := stored[0]
	if d.DLQTopic != dlqTopic || !bytes.Equal(d.Key, big.Key) || !bytes.Equal(d.Value, big.Value) {
		t.Errorf("stored dlq topic %q, key %q, value of %d bytes; want %q, %q, %d bytes",
			d.DLQTopic, d.Key, len(d.Value), dlqTopic, big.Key, len(big.Value))
	}
	l := d.Letter
	if l.Reason != inboxtype.InvalidPayload || l.Error != "bad payload" || l.Topic != topic || l.Partition != 0 ||
		l.Offset != 0 || l.Attempts < 1 || l.FailedAt.IsZero() {
		t.Errorf("stored letter %+v, want invalid_payload \"bad payload\" from %s/0 offset 0", l, topic)
	}
	if !strings.Contains(d.WriteError, kafka.MessageSizeTooLarge.Error()) {
		t.Errorf("write error %q does not say the message is too large", d.WriteError)
	}
	// The headers are the dead letter's: the original ones, then the dlq-* ones saying the same.
	read, original := deadletter.Read(d.Headers)
	if fmt.Sprint(original) != fmt.Sprint(big.Headers) {
		t.Errorf("stored original headers %v, want %v", original, big.Headers)
	}
	if read.Reason != l.Reason || read.Topic != l.Topic || read.Offset != l.Offset || read.Attempts != l.Attempts {
		t.Errorf("stored dlq-* headers say %+v, the row %+v", read, l)
	}

	for name, want := range map[string]float64{
		`inboxworker_messages_total{outcome="dead_lettered",topic="events"}`: 1,
		`inboxworker_messages_total{outcome="applied",topic="events"}`:       1,
		`inboxworker_dead_letters_stored_total{topic="events"}`:              1,
	} {
		if got := gathered(t, reg)[name]; got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// gathered returns the value of every counter in reg, by name and labels as Prometheus prints them.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			slices.Sort(labels)
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestDeadLetterStoreFails checks that a dead letter its topic refused and the database cannot take
// either (here its table is gone for a while, as it would be unreachable in an outage) holds the
// partition, uncommitted, until it is stored: it is never dropped.
func TestDeadLetterStoreFails(t *testing.T) {
	t.Parallel()
	forEachMode(t, testDeadLetterStoreFails)
}

func testDeadLetterStoreFails(t *testing.T, mode testMode) {
	logs := &logCounter{counts: map[string]int{}}
	e := &env{t: t, mode: mode, kafka: kafkatest.Start(t, 1, topic), db: pgtest.Schema(t), partitions: 1,
		log: slog.New(logs.wrap(testlog.New(t).Handler()))}
	if err := e.kafka.CreateTopic(dlqTopic, 1, map[string]string{"max.message.bytes": "1000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(t.Context(), effectsTable+`; ALTER TABLE dead_letters RENAME TO dead_letters_away`); err != nil {
		t.Fatal(err)
	}
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "big" {
			return fault.Permanent(inboxtype.InvalidPayload, errors.New("bad payload"))
		}
		return nil
	}})
	e.kafka.Produce(t, topic, kafka.Message{Key: []byte("order-big"),
		Value: fmt.Appendf(nil, `{"event_id":"big","pad":%q}`, strings.Repeat("x", 2000))})
	e.produceOrdered("order-big", "next") // behind big in every ordering mode
	e.start(config)

	const failed = "cannot store the dead letter its topic refused; the partition waits and tries again"
	e.waitFor("the store to fail twice", func() bool { return logs.count(failed) >= 2 })
	if got := e.committed(); got != 0 {
		t.Fatalf("committed %d offsets without storing the dead letter", got)
	}
	if got := e.effects()["next"]; got != 0 {
		t.Fatal("the partition moved past a dead letter it could not store")
	}

	if _, err := e.db.Pool.Exec(t.Context(), `ALTER TABLE dead_letters_away RENAME TO dead_letters`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })
	checkOnce(t, e, []string{"next"})
	var n int
	if err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM dead_letters WHERE reason = 'invalid_payload'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d dead letters stored (%v), want the big one", n, err)
	}
}

// logCounter counts the log records by message, passing them on.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *logCounter) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[msg]
}

func (c *logCounter) wrap(h slog.Handler) slog.Handler { return countingHandler{h, c} }

type countingHandler struct {
	slog.Handler
	c *logCounter
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.c.mu.Lock()
	h.c.counts[r.Message]++
	h.c.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(attrs), h.c}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.c}
}
