package inboxworker

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go/sasl"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/migrations"
)

// Config configures a Worker. Only Brokers, Pool and Routes are required; every other field's
// comment gives its default.
type Config struct {
	// Brokers are the Kafka bootstrap brokers (host:port). Required.
	Brokers []string
	// GroupID is the consumer group: the workers of one group share the routes' partitions.
	// Defaults to "inboxworker".
	GroupID string
	// SASL, when set, authenticates to the brokers (kafka-go's plain or scram mechanisms).
	SASL sasl.Mechanism
	// TLS, when set, encrypts the connections to the brokers.
	TLS *tls.Config
	// SessionTimeout is how soon the group notices a dead worker and hands its partitions on.
	// Defaults to 10s.
	SessionTimeout time.Duration
	// Pool reaches the Postgres database that holds the inbox's tables (see Migrate) and the
	// handlers' own. Required.
	Pool *pgxpool.Pool
	// Routes are the topics to consume and what applies their messages. Required.
	Routes []Route
	// DLQSuffix names a route's dead-letter topic: its topic + DLQSuffix. Defaults to ".dlq".
	DLQSuffix string
	// Retry paces the retries of retryable errors and bounds them.
	Retry Retry
	// ParkAfter is how long a message failing with a retryable error is retried in place, the
	// later messages of its key waiting, before it is parked out of its partition's way. Defaults
	// to 5s.
	ParkAfter time.Duration
	// KillSwitch says when a route whose messages all fail alike pauses.
	KillSwitch KillSwitch
	// Ordering says which messages of a partition run one after another. Defaults to ByKey.
	Ordering Ordering
	// MaxInFlight is the most messages of one partition fetched and not yet committed. Defaults
	// to 256.
	MaxInFlight int
	// BatchSize is the most messages of a BatchHandler's route applied in one transaction (1: a
	// transaction per message). Defaults to 256.
	BatchSize int
	// BatchWait is how long a batch waits for more messages after its first. Defaults to 5ms.
	BatchWait time.Duration
	// ShutdownTimeout is how long Run lets the messages in flight finish once its context is
	// cancelled; then their work is cancelled and rolled back. Defaults to 30s.
	ShutdownTimeout time.Duration
	// LagInterval is how often the lag of every partition of the routes' topics is read. Defaults
	// to 5s.
	LagInterval time.Duration
	// CommitFailureTimeout is how long offset commits may fail, none succeeding, before the worker
	// says it is not ready (Ready): the broker refuses them, and every message since the last commit
	// will be delivered again. Defaults to 1m.
	CommitFailureTimeout time.Duration
	// EventTopics are the topics the handlers emit events to (Emit): when set, the worker runs the
	// outbox's relay, which publishes the committed events — one instance of the group at a time,
	// under a lease in Postgres. None may be a route's dead-letter topic. Leave it empty when
	// Debezium relays the outbox: the handlers' events are then written a row each to the table
	// outbox, the shape of its outbox event router.
	EventTopics []string
	// OutboxRetention is how long an event stays in the outbox table, from when it was written; an
	// event is never purged before it is published. Defaults to 24h.
	OutboxRetention time.Duration
	// Registerer, when set, gets the worker's Prometheus metrics (inboxworker_*), every series at 0
	// from the start.
	Registerer prometheus.Registerer
	// TracerProvider, when set, gets the worker's OpenTelemetry spans: a consumer span per message,
	// child of the traceparent in its headers; one per batch transaction, linked to its messages';
	// a client span per inbox transaction. A dead letter carries its message's trace context.
	// Kafka keys are not recorded: they are often personal data. Defaults to none.
	TracerProvider trace.TracerProvider
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Retry configures the retries of retryable errors: an exponential backoff with jitter, and a
// budget per message, after which it is dead-lettered. Time the message's route spends paused
// (its dependency down, or asking to wait) and time Postgres is unreachable are not charged.
type Retry struct {
	// InitialInterval is the first wait. Defaults to 200ms.
	InitialInterval time.Duration
	// MaxInterval is the longest wait between two attempts. Defaults to 30s.
	MaxInterval time.Duration
	// MaxElapsed is one message's retry budget. Defaults to 5m.
	MaxElapsed time.Duration
}

// KillSwitch pauses a route whose messages fail alike — a dependency down (timeouts, 5xx), or
// every message refused the same way (a revoked privilege, a missing table) — instead of retrying
// or dead-lettering each of them. A paused route starts one message at a time, the probe, 1s
// after the pause, then at doubling intervals; the first probe that succeeds resumes it, and the
// messages it held are applied then, once, with no replay. The failures of one key, or of two,
// never trip it: they come from 3 different keys at least.
type KillSwitch struct {
	// After is how many failures of one kind trip it: in a row, or in a minute in which they are
	// Rate of the results or more. Before a route refusing every message pauses, fewer than After
	// of them are dead-lettered. Defaults to 10.
	After int
	// Rate is the share of a minute's results that, failed, trips it once After have failed.
	// Defaults to 0.5.
	Rate float64
	// MaxProbeInterval is the longest wait between two probes of a paused route. Defaults to
	// 30s.
	MaxProbeInterval time.Duration
}

// minKeys is how many different keys' failures trip a kill switch at least.
const minKeys = 3

// circuit returns the consumer's configuration of k, or an error naming its first invalid field.
func (k KillSwitch) circuit() (gate.CircuitConfig, error) {
	switch {
	case k.After < 0 || k.After > 0 && k.After < minKeys:
		// Fewer would promise fewer dead letters than the failures of minKeys keys.
		return gate.CircuitConfig{}, fmt.Errorf("Config.KillSwitch.After must be at least %d, got %d", minKeys, k.After)
	case k.Rate < 0 || k.Rate > 1:
		return gate.CircuitConfig{}, fmt.Errorf("Config.KillSwitch.Rate must be from 0 to 1, got %g", k.Rate)
	case k.MaxProbeInterval != 0 && k.MaxProbeInterval < time.Second:
		return gate.CircuitConfig{}, fmt.Errorf("Config.KillSwitch.MaxProbeInterval must be at least 1s, got %s", k.MaxProbeInterval)
	}
	return gate.CircuitConfig{ConsecutiveFailures: k.After, MinFailures: k.After, MinKeys: minKeys,
		FailureRate: k.Rate, MaxProbeInterval: k.MaxProbeInterval}, nil
}

// Ordering says which messages of a partition run one after another.
type Ordering int

const (
	// ByKey runs the messages of one Kafka key one after another, in offset order, and those of
	// different keys concurrently; a message without a Kafka key is ordered by its idempotency key.
	ByKey Ordering = iota
	// ByPartition runs a partition's messages strictly one after another, and parks nothing.
	ByPartition
)

// Worker consumes its routes' topics as a member of a consumer group and applies each message's
// effect once, however often the message arrives. It purges the idempotency keys whose retention
// has passed, and dead-letters what cannot be applied.
type Worker struct {
	consumer *consumer.Consumer
	store    *inbox.Store
	relay    *outbox.Relay // nil without Config.EventTopics
}

// New returns a Worker for config, or an error naming the first invalid field. It connects to
// nothing: Run does.
func New(config Config) (*Worker, error) {
	if config.Pool == nil {
		return nil, errors.New("inboxworker: Config.Pool is required")
	}
	logger := cmp.Or(config.Logger, slog.Default())
	retention := make(map[string]time.Duration, len(config.Routes))
	routes := make([]consumer.Route, len(config.Routes))
	for i, r := range config.Routes {
		retention[r.Name] = cmp.Or(r.Retention, DefaultRetention)
		routes[i] = r.consumerRoute()
	}
	store, err := inbox.NewStore(config.Pool, inbox.Config{Retention: retention, Logger: logger})
	if err != nil {
		return nil, err
	}
	var metrics *consumer.Metrics
	if config.Registerer != nil {
		metrics = consumer.NewMetrics(config.Registerer)
	}
	circuit, err := config.KillSwitch.circuit()
	if err != nil {
		return nil, fmt.Errorf("inboxworker: %w", err)
	}
	c, err := consumer.New(consumer.Config{
		Brokers:        config.Brokers,
		GroupID:        config.GroupID,
		Routes:         routes,
		SASL:           config.SASL,
		TLS:            config.TLS,
		SessionTimeout: config.SessionTimeout,
		DLQSuffix:      config.DLQSuffix,
		Retry: consumer.Retry{InitialInterval: config.Retry.InitialInterval,
			MaxInterval: config.Retry.MaxInterval, MaxElapsed: config.Retry.MaxElapsed},
		Ordering:             consumer.Ordering(config.Ordering),
		Circuit:              circuit,
		ParkAfter:            config.ParkAfter,
		MaxInFlight:          config.MaxInFlight,
		BatchSize:            config.BatchSize,
		BatchWait:            config.BatchWait,
		ShutdownTimeout:      config.ShutdownTimeout,
		LagInterval:          config.LagInterval,
		CommitFailureTimeout: config.CommitFailureTimeout,
		Store:                store,
		DeadLetters:          deadletter.NewStore(config.Pool),
		Metrics:              metrics,
		Tracer:               tracing.New(config.TracerProvider),
		Logger:               logger,
	})
	if err != nil {
		return nil, fmt.Errorf("inboxworker: %s", strings.TrimPrefix(err.Error(), "consumer: "))
	}
	relay, err := newRelay(config, c, logger)
	if err != nil {
		return nil, err
	}
	return &Worker{consumer: c, store: store, relay: relay}, nil
}

// newRelay returns the outbox's relay of config.EventTopics, nil without them, or an error naming
// an event topic that is one of c's dead-letter topics.
func newRelay(config Config, c *consumer.Consumer, logger *slog.Logger) (*outbox.Relay, error) {
	for i, topic := range config.EventTopics {
		if c.IsDeadLetterTopic(topic) {
			return nil, fmt.Errorf("inboxworker: Config.EventTopics[%d] %q is a route's dead-letter topic", i, topic)
		}
	}
	if len(config.EventTopics) == 0 {
		return nil, nil
	}
	var m *outbox.Metrics
	if config.Registerer != nil {
		m = outbox.NewMetrics(config.Registerer)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: config.Pool, Brokers: config.Brokers,
		SASL: config.SASL, TLS: config.TLS, Topics: config.EventTopics, Retention: config.OutboxRetention,
		Metrics: m, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("inboxworker: %w", err)
	}
	return relay, nil
}

// Run consumes until ctx is cancelled, purging expired keys meanwhile and, with Config.EventTopics,
// relaying the outbox's events (the relay stops at once then, giving its lease up to another
// instance; what the draining consumer emits meanwhile waits for it). Then it stops fetching, lets
// the messages in flight finish within Config.ShutdownTimeout (after which their work is cancelled
// and rolled back: nothing is committed half), commits the offsets of what finished, leaves the
// group and returns nil. It returns an error only when it cannot run at all. Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	purge, stopPurge := context.WithCancel(ctx)
	var background sync.WaitGroup
	background.Go(func() { w.store.RunPurger(purge, 0) })
	if w.relay != nil {
		background.Go(func() { w.relay.Run(ctx) })
	}
	defer background.Wait()
	defer stopPurge()
	if w.relay == nil {
		ctx = outbox.WithEventRows(ctx) // for Debezium's router, which relays a row per event
	}
	return w.consumer.Run(ctx)
}

// Ready says whether the worker is ready, nil when it is: a member of its group with its
// partitions assigned, its offset commits going through (Config.CommitFailureTimeout); else why not.
func (w *Worker) Ready() error { return w.consumer.NotReady() }

// Migrate applies the pending migrations of the worker's tables (the inbox, its leases, its park,
// dead letters, and those of the bundled routes) to the database of pool, in the schema of its
// search_path. It is safe to run from several processes at once, and does nothing when nothing is
// pending.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := migrations.Up(ctx, pool, nil)
	return err
}
