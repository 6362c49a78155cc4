// Package consumer turns Kafka's at-least-once delivery into exactly-once effects.
//
// It reads a consumer group's partitions with segmentio/kafka-go, runs every message through the
// inbox (package inbox) and the handler of its topic, retries what is worth retrying, dead-letters the
// rest to <topic><DLQSuffix>, and commits offsets only for finished work.
package consumer

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// Handler applies one message's effect inside the inbox transaction tx. It classifies its errors
// with package fault; an unclassified error is permanent.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error
}

// Route binds a topic to its handler.
type Route struct {
	// Topic is the Kafka topic to consume. Required.
	Topic string
	// Name is the handler's name in the inbox ("payments", "sms"): keys are unique per name. Required.
	Name string
	// Handler applies the topic's messages. Required.
	Handler Handler
}

// Retry configures the backoff for retryable errors.
type Retry struct {
	// InitialInterval defaults to 200ms.
	InitialInterval time.Duration
	// MaxInterval defaults to 30s.
	MaxInterval time.Duration
	// MaxElapsed is the retry budget of one message, after which it is dead-lettered. Defaults to 5m.
	MaxElapsed time.Duration
}

// Config configures a Consumer.
type Config struct {
	// Brokers are the bootstrap brokers. Required.
	Brokers []string
	// GroupID is the consumer group. Defaults to "inboxworker".
	GroupID string
	// Routes are the topics to consume and their handlers. Required.
	Routes []Route
	// SASL, when set, authenticates to the brokers.
	SASL sasl.Mechanism
	// TLS, when set, encrypts the connections to the brokers.
	TLS *tls.Config
	// SessionTimeout is how soon the group notices a dead member. Defaults to 10s.
	SessionTimeout time.Duration
	// DLQSuffix names the dead-letter topic: source topic + suffix. Defaults to ".dlq".
	DLQSuffix string
	// Retry configures retries of retryable errors.
	Retry Retry
	// Pool reaches the migrated database. Required.
	Pool *pgxpool.Pool
	// Store is the inbox. Required.
	Store *inbox.Store
	// Metrics records outcomes; nil records nothing.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}
