package consumer_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestGroupLag runs two consumers and a third group member that joins and never reads its
// partitions, with 25 messages waiting on each partition: every partition's lag is in each
// consumer's metrics, the held ones with their true lag and a stall signal that grows, the consumed
// ones at 0 and not stalled.
func TestGroupLag(t *testing.T) {
	t.Parallel()
	const partitions, waiting = 6, 25
	e := setup(t, testMode{tx: consumer.PerBatch}, partitions)

	// The idle member joins first and holds every partition until the consumers join. Closed last
	// (cleanups run in reverse), once the consumers have left.
	held := joinIdle(t, e.kafka.Addr)

	var regs []*prometheus.Registry
	var consumers []*consumer.Consumer
	for range 2 {
		config := e.config(&recorder{})
		config.LagInterval = 50 * time.Millisecond
		reg := prometheus.NewRegistry()
		config.Metrics = consumer.NewMetrics(reg)
		c, _ := e.start(config)
		regs, consumers = append(regs, reg), append(consumers, c)
	}
	// The group is stable once the idle member holds a third of the partitions: all three joined.
	var idle []int
	e.waitFor("a generation of the three members", func() bool {
		idle = held()
		return len(idle) == partitions/3 && consumers[0].Ready() && consumers[1].Ready()
	})
	isIdle := map[int]bool{}
	for _, p := range idle {
		isIdle[p] = true
	}
	t.Logf("the idle member holds partitions %v", idle)

	produceToEach(t, e.kafka.Addr, partitions, waiting)

	// Every instance reports every partition: the held ones at their true lag, the others caught up.
	want := func(p int) float64 {
		if isIdle[p] {
			return waiting
		}
		return 0
	}
	var problem string
	defer func() {
		if t.Failed() {
			t.Log("last seen:", problem)
		}
	}()
	e.waitFor("every partition's lag in both consumers' metrics", func() bool {
		problem = ""
		for i, reg := range regs {
			lag := gatherByPartition(t, reg, "inboxworker_consumer_lag")
			stalled := gatherByPartition(t, reg, "inboxworker_consumer_stalled_seconds")
			for p := range partitions {
				l, ok := lag[p]
				switch {
				case !ok:
					problem = fmt.Sprintf("consumer %d reports no lag for partition %d: %v", i, p, lag)
				case l != want(p):
					problem = fmt.Sprintf("consumer %d: lag of partition %d = %v, want %v", i, p, l, want(p))
				case !isIdle[p] && stalled[p] != 0:
					problem = fmt.Sprintf("consumer %d: caught-up partition %d stalled for %vs", i, p, stalled[p])
				}
				if problem != "" {
					return false
				}
			}
		}
		return true
	})

	// The stall signal of a held partition grows from one refresh to the next.
	p := idle[0]
	var first float64
	e.waitFor("a stall signal for the held partition", func() bool {
		first = gatherByPartition(t, regs[0], "inboxworker_consumer_stalled_seconds")[p]
		return first > 0
	})
	e.waitFor("the stall signal to grow", func() bool {
		return gatherByPartition(t, regs[0], "inboxworker_consumer_stalled_seconds")[p] > first
	})
	if n := e.committed(); n != int64((partitions-len(idle))*waiting) {
		t.Errorf("the group committed %d offsets, want the consumed partitions' %d", n, (partitions-len(idle))*waiting)
	}
}

// joinIdle makes a kafka-go member of the test group that takes part in every rebalance (kafka-go
// heartbeats and rejoins by itself) and never reads its partitions. held returns the partitions of
// its latest generation.
func joinIdle(t *testing.T, broker string) (held func() []int) {
	t.Helper()
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                group,
		Brokers:           []string{broker},
		Topics:            []string{topic},
		HeartbeatInterval: 200 * time.Millisecond,
		SessionTimeout:    600 * time.Millisecond,
		JoinGroupBackoff:  100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var latest []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			gen, err := g.Next(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				continue
			}
			var ps []int
			for _, a := range gen.Assignments[topic] {
				ps = append(ps, a.ID)
			}
			mu.Lock()
			latest = ps
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if err := g.Close(); err != nil {
			t.Logf("close the idle member: %v", err)
		}
	})
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), latest...)
	}
}

// produceToEach writes n messages to each partition of topic.
func produceToEach(t *testing.T, broker string, partitions, n int) {
	t.Helper()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:      kafka.TCP(broker),
		Transport: transport,
		Topic:     topic,
		// The message key names its partition.
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int {
			p, _ := strconv.Atoi(string(m.Key))
			return p
		}),
		RequiredAcks: kafka.RequireAll,
		BatchSize:    partitions * n,
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	var msgs []kafka.Message
	for p := range partitions {
		for i := range n {
			k := fmt.Sprintf("p%d-%d", p, i)
			msgs = append(msgs, kafka.Message{Key: []byte(strconv.Itoa(p)), Value: eventValue(k, i)})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// gatherByPartition returns the values of the named gauge of topic in reg, by partition; a
// partition without a series is absent.
func gatherByPartition(t *testing.T, reg *prometheus.Registry, name string) map[int]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] != topic {
				continue
			}
			p, err := strconv.Atoi(labels["partition"])
			if err != nil {
				t.Fatalf("%s has partition %q", name, labels["partition"])
			}
			out[p] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestSeriesFromTheStart checks that a consumer that has seen no message already exposes its
// message, retry and handling-time series, at 0.
func TestSeriesFromTheStart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pool := lazyPool(t)
	store, err := inbox.NewStore(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = consumer.New(consumer.Config{
		Brokers: []string{"127.0.0.1:1"},
		Routes: []consumer.Route{
			{Topic: "a", Name: "a", Handler: &recorder{}},
			{Topic: "b", Name: "b", Handler: &recorder{}},
		},
		Store:       store,
		DeadLetters: deadletter.NewStore(pool),
		Metrics:     consumer.NewMetrics(reg),
	})
	if err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			series := f.GetName()
			for _, l := range m.GetLabel() {
				series += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				got[series] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[series] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for _, tp := range []string{"a", "b"} {
		for _, series := range []string{
			"inboxworker_messages_total,outcome=applied,topic=" + tp,
			"inboxworker_messages_total,outcome=duplicate,topic=" + tp,
			"inboxworker_messages_total,outcome=dead_lettered,topic=" + tp,
			"inboxworker_messages_total,outcome=expired,topic=" + tp,
			"inboxworker_messages_total,outcome=suppressed,topic=" + tp,
			"inboxworker_retries_total,topic=" + tp,
			"inboxworker_handle_seconds,topic=" + tp,
		} {
			if v, ok := got[series]; !ok || v != 0 {
				t.Errorf("%s: %v (present %v), want 0 before any message", series, v, ok)
			}
		}
	}
}
