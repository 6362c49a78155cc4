package inboxworker_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/inboxworker/inboxworker"
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
			"returns", "returns.dlq", "return.events", "parcels", "parcels.dlq", "quotes", "quotes.dlq",
			"refunds", "refunds.dlq", "texts", "texts.dlq", "invoices", "invoices.dlq"))
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

// produceWith writes a message of value and one header, without a Kafka key, to topic.
func (e *exampleEnv) produceWith(topic, value, header, headerValue string) {
	w := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Transport: e.transport}
	defer w.Close()
	m := kafka.Message{Value: []byte(value), Headers: []kafka.Header{{Key: header, Value: []byte(headerValue)}}}
	if err := w.WriteMessages(context.Background(), m); err != nil {
		log.Fatal(err)
	}
}

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

// migrate creates the worker's tables and the example's own (ddl).
func (e *exampleEnv) migrate(ddl string) {
	ctx := context.Background()
	if err := inboxworker.Migrate(ctx, e.pool); err != nil {
		log.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, ddl); err != nil {
		log.Fatal(err)
	}
}

// rows returns the text of the rows of query, one string each.
func (e *exampleEnv) rows(query string) []string {
	rows, _ := e.pool.Query(context.Background(), query)
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	return texts
}

// run runs a worker of config (its Brokers and Pool the example's) until it has committed n offsets
// of its first route's topic, then stops it.
func (e *exampleEnv) run(config inboxworker.Config, n int64) {
	config.Brokers, config.Pool = e.brokers, e.pool
	w, err := inboxworker.New(config)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.waitCommitted(config.Routes[0].Topic, n)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}

// deadLetters returns the first n dead letters of topic's partition 0, each as its Kafka key, its
// dlq-reason and its dlq-error.
func (e *exampleEnv) deadLetters(topic string, n int) []string {
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Transport: e.transport}
	var letters []string
	for deadline := time.Now().Add(time.Minute); len(letters) < n; {
		if time.Now().After(deadline) {
			log.Fatalf("%d dead letters of %s within a minute, want %d", len(letters), topic, n)
		}
		resp, err := client.Fetch(context.Background(), &kafka.FetchRequest{Topic: topic, Partition: 0,
			Offset: int64(len(letters)), MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
		if err != nil || resp.Error != nil {
			time.Sleep(20 * time.Millisecond) // the topic not there yet: no busy loop
			continue
		}
		for r, err := resp.Records.ReadRecord(); err == nil; r, err = resp.Records.ReadRecord() {
			header := func(name string) string {
				for _, h := range r.Headers {
					if h.Key == name {
						return string(h.Value)
					}
				}
				return ""
			}
			key, _ := io.ReadAll(r.Key)
			letters = append(letters, fmt.Sprintf("%s %s: %s", key, header("dlq-reason"), header("dlq-error")))
		}
	}
	return letters[:n]
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
