package consumer_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
)

// TestTransactions: a transactional producer upstream (Spring Kafka, Kafka Streams, a Debezium
// outbox) aborts whenever it fails mid-transaction and writes a marker after every transaction. Only
// what it committed takes effect, once; an aborted record and a marker reach no handler, no dead
// letter and no metric; the committed offset reaches the partition's end, past the last marker.
func TestTransactions(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		config := e.config(&recorder{})
		e.start(config)

		upstream := e.kafka.TransactionalProducer(t, "upstream-"+mode.String())
		inTransaction := func(commit bool, keys ...string) {
			upstream.Begin()
			upstream.Produce(topic, messages(keys...)...)
			if commit {
				upstream.Commit()
			} else {
				upstream.Abort()
			}
		}
		inTransaction(false, "aborted-1", "again")
		inTransaction(true, "committed-1")
		inTransaction(false, "aborted-2")
		inTransaction(true, "committed-2", "again") // aborted before, produced again: applied once
		e.produce("plain-1")
		inTransaction(true, "committed-3") // the partition ends with a marker

		want := map[string]int{"committed-1": 1, "committed-2": 1, "again": 1, "plain-1": 1, "committed-3": 1}
		end := e.endOffset()
		e.waitFor("the committed offset at the partition's end, past its last marker", func() bool {
			return e.committed() == end
		})
		if got := e.effects(); !maps.Equal(got, want) {
			t.Errorf("applied %v, want %v", got, want)
		}
		if dl := e.deadLetters(); len(dl) != 0 {
			t.Errorf("%d dead letters, want none: the first is %q", len(dl), dl[0].Value)
		}
		// Counted as handled: the five committed, once each; nothing aborted, no marker.
		for outcome, want := range map[string]float64{"applied": 5, "duplicate": 0, "dead_lettered": 0, "invalid_payload": 0} {
			if n := outcomes(config, outcome); n != want {
				t.Errorf("%s: %v messages, want %v", outcome, n, want)
			}
		}
	})
}

// TestTransactionHeldOpen: a record of a transaction still open is not handled, nor anything after
// it in its partition (the last stable offset holds the partition, as for every read_committed
// consumer), until its transaction commits; then each is applied once. Meanwhile the lag, counted to
// the last stable offset, is 0, and the open-transaction gauge says how long the partition has been
// held; both are 0 once the transaction commits and its records are read.
func TestTransactionHeldOpen(t *testing.T) {
	e := setup(t, testMode{}, 1)
	config := e.config(&recorder{})
	config.LagInterval = 50 * time.Millisecond
	e.start(config)
	lag := func() float64 { return testutil.ToFloat64(config.Metrics.Lag.WithLabelValues(topic, "0")) }
	open := func() float64 { return testutil.ToFloat64(config.Metrics.TransactionOpen.WithLabelValues(topic, "0")) }

	e.produce("before")
	e.waitFor("the message before the transaction applied", func() bool { return e.effects()["before"] == 1 })
	upstream := e.kafka.TransactionalProducer(t, "upstream")
	upstream.Begin()
	upstream.Produce(topic, messages("open")...)
	e.produce("after")

	e.waitFor("the partition seen held by the open transaction for a second, with no lag", func() bool {
		return open() >= 1 && lag() == 0
	})
	if got := e.effects(); got["open"] != 0 || got["after"] != 0 {
		t.Fatalf("applied %v while the transaction was open; want only before", got)
	}
	upstream.Commit()
	want := map[string]int{"before": 1, "open": 1, "after": 1}
	e.waitFor("the transaction's record and the one after it applied", func() bool { return maps.Equal(e.effects(), want) })
	end := e.endOffset()
	e.waitFor("the committed offset at the partition's end, no lag and no transaction open", func() bool {
		return e.committed() == end && lag() == 0 && open() == 0
	})
}

// endOffset is the end offset of topic's partition 0.
func (e *env) endOffset() int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.kafka.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}})
	if err != nil || len(resp.Topics[topic]) != 1 || resp.Topics[topic][0].Error != nil {
		e.t.Fatalf("end offset of %s/0: %v %+v", topic, err, resp)
	}
	return resp.Topics[topic][0].LastOffset
}
