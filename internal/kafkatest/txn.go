package kafkatest

import (
	"context"
	"hash/fnv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Producer is a transactional producer, as a payments team's upstream runs one (Spring Kafka with
// a transaction-id-prefix, Kafka Streams with exactly_once_v2, a Debezium outbox under Kafka
// Connect): each transaction it ends writes a commit or abort marker after its records, in every
// partition it wrote to. It is franz-go's kgo, as kafka-go has no transactional producer.
type Producer struct {
	tb     testing.TB
	client *kgo.Client
}

// TransactionalProducer returns a producer with transactional ID id, closed when the test ends.
// Records go to the partition of their key, as Produce's do.
func (c *Cluster) TransactionalProducer(tb testing.TB, id string) *Producer {
	tb.Helper()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(c.Addr),
		kgo.ClientID(ClientID),
		kgo.TransactionalID(id),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
	)
	if err != nil {
		tb.Fatalf("kafkatest: transactional producer: %v", err)
	}
	tb.Cleanup(client.Close)
	return &Producer{tb: tb, client: client}
}

// Begin begins a transaction.
func (p *Producer) Begin() {
	p.tb.Helper()
	if err := p.client.BeginTransaction(); err != nil {
		p.tb.Fatalf("kafkatest: begin a transaction: %v", err)
	}
}

// Produce writes msgs to topic in the open transaction and waits for the broker's
// acknowledgement: the records are in the log, their transaction still open.
func (p *Producer) Produce(topic string, msgs ...kafka.Message) {
	p.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	records := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		records[i] = r
	}
	if err := p.client.ProduceSync(ctx, records...).FirstErr(); err != nil {
		p.tb.Fatalf("kafkatest: produce to %s in a transaction: %v", topic, err)
	}
}

// Commit commits the open transaction.
func (p *Producer) Commit() { p.end(kgo.TryCommit) }

// Abort aborts the open transaction.
func (p *Producer) Abort() { p.end(kgo.TryAbort) }

func (p *Producer) end(how kgo.TransactionEndTry) {
	p.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.client.EndTransaction(ctx, how); err != nil {
		p.tb.Fatalf("kafkatest: end a transaction: %v", err)
	}
}

// fnv32a is kafka-go's Hash balancer's hash, which SaramaCompatHasher turns into its partitions.
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	h.Write(b)
	return h.Sum32()
}
