package deadletter

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// NewWriter returns the producer dead letters are written with, by the consumer to a dead-letter
// topic and by worker replay back to their original topic: each write is acknowledged by every
// in-sync replica before it returns, one message per request, so that a dead letter is durable
// before anything moves on (an offset committed, a row marked replayed); and each message goes to
// the partition of its key, as the producers of the topics choose it, so that one key's messages
// stay in order. The caller sets the rest (attempts, loggers, topic creation) and closes it.
func NewWriter(brokers []string, transport *kafka.Transport) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Transport:    transport,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    1,
		BatchTimeout: time.Millisecond,
	}
}
