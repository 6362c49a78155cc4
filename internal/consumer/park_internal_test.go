package consumer

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/idkey"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func newParkStore(t *testing.T) *inbox.Store {
	t.Helper()
	store, err := inbox.NewStore(pgtest.Pool(t), inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// A message parked comes back out of the park as it was read: key (or none), value, headers in
// order, origin.
func TestParkedRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newParkStore(t)
	route := Route{Topic: "payments.callbacks", Name: "payments"}
	for i, m := range []kafka.Message{
		{Offset: 41, Key: []byte("A-1001"), Value: []byte(`{"event_id":"evt-1"}`), Headers: []kafka.Header{
			{Key: "Idempotency-Key", Value: []byte("evt-1")}, {Key: "trace", Value: []byte{0, 0xff}}, {Key: "trace", Value: []byte("2")},
		}},
		{Offset: 42, Key: nil, Value: []byte(`{"event_id":"evt-2"}`)},
	} {
		key, _, err := idkey.Of(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Park().Add(ctx, toParked(route, 3, &entry{msg: m, key: key, order: "order"}), 0); err != nil {
			t.Fatal(err)
		}
		taken, err := store.Park().TakeDue(ctx, route.Topic, 3, "o", time.Minute, 1)
		if err != nil || len(taken) != 1 {
			t.Fatalf("TakeDue = %d, %v", len(taken), err)
		}
		if taken[0].Handler != "payments" || taken[0].IdempotencyKey != key {
			t.Errorf("parked as %q/%q, want payments/%s", taken[0].Handler, taken[0].IdempotencyKey, key)
		}
		got := fromParked(taken[0])
		m.Topic, m.Partition = route.Topic, 3
		if got.Topic != m.Topic || got.Partition != m.Partition || got.Offset != m.Offset ||
			(got.Key == nil) != (m.Key == nil) || !bytes.Equal(got.Key, m.Key) || !bytes.Equal(got.Value, m.Value) ||
			!slices.EqualFunc(got.Headers, m.Headers, func(a, b kafka.Header) bool {
				return a.Key == b.Key && bytes.Equal(a.Value, b.Value)
			}) {
			t.Errorf("message %d came back as %+v, want %+v", i, got, m)
		}
		if err := store.Park().Remove(ctx, taken[0]); err != nil {
			t.Fatal(err)
		}
	}
}

func TestParkMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.initSeries([]string{"a", "b"})
	for _, g := range []*prometheus.GaugeVec{m.Parked, m.Oldest} {
		if n := testutil.CollectAndCount(g); n != 2 {
			t.Errorf("%d series at start, want one per topic", n)
		}
		for _, topic := range []string{"a", "b"} {
			if v := testutil.ToFloat64(g.WithLabelValues(topic)); v != 0 {
				t.Errorf("%s at start = %g, want 0", topic, v)
			}
		}
	}

	store := newParkStore(t)
	for i, key := range []string{"k1", "k1", "k2"} {
		p := inbox.Parked{Handler: "h", Topic: "a", Offset: int64(i), OrderingKey: []byte(key), IdempotencyKey: key + string(rune('0'+i))}
		if _, err := store.Park().Add(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		reportParked(runCtx, m, store, []string{"a", "b"}, 10*time.Millisecond, testlog.New(t))
	}()
	poll.For(t, "the gauge of a's parked messages at 3", func() bool {
		return testutil.ToFloat64(m.Parked.WithLabelValues("a")) == 3
	})
	cancel()
	<-done
	if v := testutil.ToFloat64(m.Parked.WithLabelValues("a")); v != 3 {
		t.Errorf("parked_messages{a} = %g, want 3", v)
	}
	if v := testutil.ToFloat64(m.Parked.WithLabelValues("b")); v != 0 {
		t.Errorf("parked_messages{b} = %g, want 0", v)
	}
	if v := testutil.ToFloat64(m.Oldest.WithLabelValues("a")); v <= 0 || v > 60 {
		t.Errorf("parked_oldest_seconds{a} = %g, want the age of the first", v)
	}

}
