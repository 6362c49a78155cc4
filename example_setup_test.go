package inboxworker_test

import (
	"context"
	"log"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exampleEnv is what an example runs against: a fresh, migrated Postgres schema and an embedded
// Kafka broker (kfake: the real wire protocol, in memory) with the examples' topics.
type exampleEnv struct {
	pool      *pgxpool.Pool
	brokers   []string
	drop      func()
	cluster   *kfake.Cluster
	transport *kafka.Transport // the example's own producer's and offset reader's
}

func setupExample() *exampleEnv {
	db, drop, err := pgtest.NewSchema()
	if err != nil {
		log.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(1, "shipments", "shipments.dlq", "notices", "notices.dlq", "reminders", "reminders.dlq",
			"returns", "returns.dlq", "return.events"))
	if err != nil {
		log.Fatal(err)
	}
	return &exampleEnv{pool: db.Pool, brokers: cluster.ListenAddrs(), drop: drop, cluster: cluster,
		transport: &kafka.Transport{}}
}

func (e *exampleEnv) close() {
	e.transport.CloseIdleConnections()
	e.cluster.Close()
	e.drop()
}

// produce writes a message of key and value to topic.
func (e *exampleEnv) produce(topic, key, value string) { e.produceAt(topic, key, value, time.Time{}) }

// produceAt writes a message of key and value to topic, produced at (its record's timestamp; now
// when zero).
func (e *exampleEnv) produceAt(topic, key, value string, at time.Time) {
	w := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Transport: e.transport}
	defer w.Close()
	if err := w.WriteMessages(context.Background(), kafka.Message{Key: []byte(key), Value: []byte(value), Time: at}); err != nil {
		log.Fatal(err)
	}
}

// waitCommitted waits until the worker's group has committed n offsets of topic's partition: every
// message produced is applied, a duplicate, or dead-lettered.
func (e *exampleEnv) waitCommitted(topic string, n int64) {
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Transport: e.transport}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{
			GroupID: "inboxworker", Topics: map[string][]int{topic: {0}}})
		if err == nil && resp.Error == nil && len(resp.Topics[topic]) == 1 && resp.Topics[topic][0].CommittedOffset >= n {
			return
		}
	}
	log.Fatalf("the worker did not commit %d offsets of %s within a minute", n, topic)
}
