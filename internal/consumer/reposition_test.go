package consumer_test

import (
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
)

// TestRecordsDeletedBeforeRead: retention (here DeleteRecords) took records the group had not read
// while no worker ran. The partition goes on from its first record, and says which range it skipped,
// in an ERROR and a counter: those records are lost, and an operator must hear which.
func TestRecordsDeletedBeforeRead(t *testing.T) {
	e := setup(t, testMode{}, 1)
	_, stop := e.start(e.config(&recorder{}))
	e.produce(keys("read", 4)...)
	e.waitFor("the first 4 committed", func() bool { return e.committed() == 4 })
	stop()

	e.produce(keys("late", 6)...) // offsets 4 to 9
	if err := e.kafka.DeleteRecords(topic, 0, 8); err != nil {
		t.Fatal(err)
	}
	config := e.config(&recorder{})
	e.start(config)
	e.waitFor("the partition's end committed", func() bool { return e.committed() == 10 })

	want := map[string]int{"read-0": 1, "read-1": 1, "read-2": 1, "read-3": 1, "late-4": 1, "late-5": 1}
	if got := e.effects(); !maps.Equal(got, want) {
		t.Errorf("applied %v, want %v", got, want)
	}
	said := e.errors("records were deleted before the group read them (retention, or DeleteRecords): skipping them")
	if len(said) != 1 || said[0]["first_skipped"] != "4" || said[0]["last_skipped"] != "7" || said[0]["skipped"] != "4" {
		t.Errorf("logged %v; want one ERROR naming offsets 4 to 7, 4 records", said)
	}
	if n := testutil.ToFloat64(config.Metrics.Skipped.WithLabelValues(topic)); n != 4 {
		t.Errorf("records_skipped_total %v, want 4", n)
	}
}

// TestTopicCreatedAgain: the topic is deleted and created again at once under two instances, and
// gets more records than the offsets its partitions had been read to. Its partitions are read again
// from their first record: every record of the new topic applied once, none lost below the old
// offsets, and an ERROR says why.
func TestTopicCreatedAgain(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{}, 2)
	var consumers []*consumer.Consumer
	for range 2 {
		c, _ := e.start(e.config(&recorder{}))
		consumers = append(consumers, c)
	}
	e.waitFor("both instances ready", func() bool { return consumers[0].Ready() && consumers[1].Ready() })
	e.produce(keys("old", 10)...)
	e.waitFor("the old topic's records committed", func() bool { return e.committed() == 10 })

	if err := e.kafka.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	if err := e.kafka.CreateTopic(topic, 2, nil); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	e.produce(keys("new", 30)...) // past the old offsets on both partitions
	want := map[string]int{}
	for _, k := range append(keys("old", 10), keys("new", 30)...) {
		want[k] = 1
	}
	e.waitFor("every record of the new topic applied", func() bool { return maps.Equal(e.effects(), want) })
	t.Logf("every record of the new topic applied %s after it was created", time.Since(created).Round(100*time.Millisecond))
	e.waitFor("the new topic's ends committed", func() bool { return e.committed() == 30 })
	if said := e.errors("the topic was deleted and created again: reading its partition from the first record"); len(said) == 0 {
		t.Error("no ERROR says the topic was created again")
	}
}

// errors returns the attributes, as text, of the ERROR records logged with msg.
func (e *env) errors(msg string) []map[string]string {
	var out []map[string]string
	for _, r := range e.logs.All() {
		if r.Level != slog.LevelError || r.Message != msg {
			continue
		}
		attrs := map[string]string{}
		for k, v := range r.Attrs {
			attrs[k] = v.String()
		}
		out = append(out, attrs)
	}
	return out
}

// TestTopicMissing: two instances consume two topics; one topic is deleted and stays gone for a
// while. The other route goes on, both instances say the topic is missing (an ERROR, Ready false,
// naming it), the group does not rebalance over and over meanwhile, and once the topic is created
// again its records are applied, each once, within seconds.
func TestTopicMissing(t *testing.T) {
	t.Parallel()
	const other = "other"
	e := setup(t, testMode{}, 2)
	for _, name := range []string{other, other + ".dlq"} {
		if err := e.kafka.CreateTopic(name, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	var consumers []*consumer.Consumer
	for range 2 {
		config := e.config(&recorder{})
		config.Routes = append(config.Routes, consumer.Route{Topic: other, Name: other, Handler: &recorder{}})
		c, _ := e.start(config)
		consumers = append(consumers, c)
	}
	ready := func() bool { return consumers[0].Ready() && consumers[1].Ready() }
	e.waitFor("both instances ready", ready)

	if err := e.kafka.DeleteTopic(other); err != nil {
		t.Fatal(err)
	}
	e.waitFor("both instances not ready, naming the missing topic", func() bool {
		for _, c := range consumers {
			if err := c.NotReady(); err == nil || !strings.Contains(err.Error(), other) {
				return false
			}
		}
		return true
	})
	joins := func() int {
		n := 0
		for _, r := range e.logs.All() {
			if r.Message == "joined a generation of the consumer group" {
				n++
			}
		}
		return n
	}
	joined := joins()
	e.produce(keys("meanwhile", 10)...)
	e.waitFor("the other route's records applied while the topic is missing", func() bool {
		return len(e.effects()) == 10
	})
	// Gone for 13 s, as in the pass that found the storm (kafka-go's own watcher made hundreds of
	// rebalances a second, 6,164 WARN lines); a slower machine can only make fewer.
	time.Sleep(13 * time.Second)
	n := joins() - joined
	t.Logf("%d generations joined in the 13 s the topic was missing", n)
	if n > 10 {
		t.Errorf("%d generations joined while the topic was missing, want at most 10", n)
	}
	if said := e.errors("a consumed topic cannot be read (deleted, not created yet, or not authorised): its route consumes nothing until it can"); len(said) < 2 {
		t.Errorf("%d ERRORs say the topic is missing, want one per instance", len(said))
	}

	for _, name := range []string{other} {
		if err := e.kafka.CreateTopic(name, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make([]kafka.Message, 6)
	for i, k := range keys("back", 6) {
		msgs[i] = kafka.Message{Key: []byte("order-" + k), Value: eventValue(k, i)}
	}
	e.kafka.Produce(t, other, msgs...)
	back := time.Now()
	e.waitFor("the created topic's records applied, and both instances ready", func() bool {
		return len(e.effects()) == 16 && ready()
	})
	t.Logf("consumed again %s after the topic was created", time.Since(back).Round(100*time.Millisecond))
	for k, n := range e.effects() {
		if n != 1 {
			t.Errorf("%s applied %d times", k, n)
		}
	}
}
