// Package kafkatest starts an in-process Kafka broker for tests (kfake: the real wire protocol, in
// memory) and produces to and reads from it with kafka-go, the client production uses. With
// StartKafka41 the broker sits behind a Floor, which holds every request to the protocol versions
// an Apache Kafka 4.1 broker serves, as kfake alone does not.
//
// It does not start real Kafka, and a Floor fronts one broker only.
package kafkatest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kversion"
)

// ClientID is the client ID of this package's clients, for tests to name theirs by, so that a
// Floor's record tells them from the clients under test.
const ClientID = "kafkatest"

// Cluster is a running in-memory broker.
type Cluster struct {
	*kfake.Cluster
	// Addr is the broker's address: kfake's own, or its Floor's.
	Addr string
	// Client is a client of the broker whose connections are kept for the test's next request:
	// tests poll committed offsets every few milliseconds.
	Client *kafka.Client
	// Floor holds the requests to Kafka 4.1's versions; nil for a plain kfake cluster (Start).
	Floor *Floor
}

// Start starts a one-broker cluster with topics created (partitions each), closed when the test
// ends. Group session timeouts down to 100ms are accepted, so crash tests need not wait 6s.
//
// kfake accepts protocol versions that Kafka 4.x no longer serves; StartKafka41 does not.
func Start(tb testing.TB, partitions int32, topics ...string) *Cluster {
	tb.Helper()
	c := startKfake(tb, kfake.SeedTopics(partitions, topics...))
	return newCluster(tb, c, c.ListenAddrs()[0], nil)
}

// StartKafka41 starts a cluster as Start does, behind a Floor: clients reach it at Addr, where
// every request is held to the versions an Apache Kafka 4.1 broker serves and recorded, and the test
// fails, with the table of what was sent, on any request outside them. kfake itself is capped at
// 4.1's maximum versions and features (kversion.V4_1_0).
func StartKafka41(tb testing.TB, partitions int32, topics ...string) *Cluster {
	tb.Helper()
	c := startKfake(tb, kfake.SeedTopics(partitions, topics...), kfake.MaxVersions(kversion.V4_1_0()))
	floor := StartFloor(tb, c.ListenAddrs()[0], nil)
	return newCluster(tb, c, floor.Addr, floor)
}

func startKfake(tb testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		tb.Fatalf("kafkatest: start broker: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

func newCluster(tb testing.TB, c *kfake.Cluster, addr string, floor *Floor) *Cluster {
	transport := &kafka.Transport{ClientID: ClientID}
	tb.Cleanup(transport.CloseIdleConnections)
	return &Cluster{Cluster: c, Addr: addr, Client: &kafka.Client{Addr: kafka.TCP(addr), Transport: transport}, Floor: floor}
}

// Produce writes msgs to topic and waits for the broker's acknowledgement. Messages go to the
// partition of their key (kafka-go's Hash balancer, as producers of order and phone keys do).
func (c *Cluster) Produce(tb testing.TB, topic string, msgs ...kafka.Message) {
	tb.Helper()
	transport := &kafka.Transport{ClientID: ClientID}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(c.Addr),
		Transport:    transport,
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    len(msgs),
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		tb.Fatalf("kafkatest: produce to %s: %v", topic, err)
	}
}

// ReadAll returns every message of topic's partition, from the first offset to the partition's end
// offset at the time of the call.
func (c *Cluster) ReadAll(tb testing.TB, topic string, partition int) []kafka.Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := (&kafka.Dialer{ClientID: ClientID}).DialLeader(ctx, "tcp", c.Addr, topic, partition)
	if err != nil {
		tb.Fatalf("kafkatest: dial %s/%d: %v", topic, partition, err)
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		tb.Fatalf("kafkatest: offsets of %s/%d: %v", topic, partition, err)
	}
	if last <= first {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   []string{c.Addr},
		Topic:     topic,
		Partition: partition,
		MaxWait:   100 * time.Millisecond,
		Dialer:    &kafka.Dialer{ClientID: ClientID, Timeout: 10 * time.Second},
	})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		tb.Fatalf("kafkatest: seek %s/%d: %v", topic, partition, err)
	}
	var out []kafka.Message
	for int64(len(out)) < last-first {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			tb.Fatalf("kafkatest: read %s/%d after %d messages: %v", topic, partition, len(out), err)
		}
		out = append(out, m)
		if m.Offset >= last-1 {
			break
		}
	}
	return out
}

// CommittedOffset returns the offset group has committed for topic's partition, or -1 when none.
func (c *Cluster) CommittedOffset(tb testing.TB, group, topic string, partition int) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{
		GroupID: group,
		Topics:  map[string][]int{topic: {partition}},
	})
	if err == nil && resp.Error != nil {
		err = resp.Error
	}
	if errors.Is(err, kafka.GroupIdNotFound) {
		return -1 // the group has not joined yet
	}
	if err != nil {
		tb.Fatalf("kafkatest: committed offset of %s in %s/%d: %v", group, topic, partition, err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Partition == partition {
			if p.Error != nil && !errors.Is(p.Error, kafka.UnknownTopicOrPartition) {
				tb.Fatalf("kafkatest: committed offset of %s in %s/%d: %v", group, topic, partition, p.Error)
			}
			return p.CommittedOffset
		}
	}
	return -1
}

// Header returns the value of m's first header named key, "" when it has none.
func Header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
