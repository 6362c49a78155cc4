// Package consumer turns Kafka's at-least-once delivery into exactly-once effects.
//
// It reads a consumer group's partitions with segmentio/kafka-go, runs every message through the
// inbox (package inbox) and the handler of its topic, retries what is worth retrying, dead-letters the
// rest to <topic><DLQSuffix>, and commits offsets only for finished work.
//
// Each assigned partition has one goroutine, bound to the group generation that assigned it. Its
// pipeline is: fetch (up to Config.MaxInFlight messages fetched and not yet committed) → schedule
// (pick the messages that may start: the next message of each ordering key that has nothing in
// flight, see Config.Ordering) → apply (one message per transaction, or a batch of messages in one
// transaction when the route's handler is a BatchHandler, see Config.Transactions; retries and dead
// letters) → settle (mark them finished, free their keys) → commit (the offset after the highest
// contiguous finished message). Messages of different keys run concurrently, up to each route's
// Route.Concurrency; messages of one key run one after another, in offset order. Before the
// messages of a newly fetched range start, the range is recorded through the inbox store, so that a
// message that kills the process every time is recognised and dead-lettered as a crash loop. A
// rebalance cancels the partition's in-flight work, whose transactions roll back, and commits
// nothing into the next generation.
//
// A message whose retryable error outlasts Config.ParkAfter in place is parked (inbox.Store.Park),
// with every later message of its key behind it, so that its partition goes on; a retrier per owned
// partition retries the parked heads in key order (retrier.go). Each route has an outage circuit
// (package gate) that pauses it while its failures look like an outage of its dependency: nothing of it
// starts but a probe, and no message's retry budget is charged.
//
// consumer does not decide what an error means (package fault does), holds no SQL (package inbox
// does), nor touches the business tables (handlers do, through the transaction they are given). It
// does not produce anything but dead letters.
package consumer

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/idkey"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// Transactions says how many messages share a transaction.
type Transactions int

const (
	// PerBatch applies each batch of a partition's messages (see Config.BatchSize) in one
	// transaction, through a route's BatchHandler; a route whose handler is not a BatchHandler gets
	// PerMessage. A message that fails is taken out of its batch and goes through the per-message
	// path, so the guarantees are those of PerMessage. The default.
	PerBatch Transactions = iota
	// PerMessage applies every message in a transaction of its own.
	PerMessage
)

func (t Transactions) String() string {
	switch t {
	case PerBatch:
		return "per-batch"
	case PerMessage:
		return "per-message"
	}
	return fmt.Sprintf("Transactions(%d)", int(t))
}

// Ordering says which messages of a partition must run one after another.
type Ordering int

const (
	// ByKey runs the messages of one ordering key one after another, in offset order, and messages
	// of different keys concurrently. A message's ordering key is its Kafka key; a message without
	// one is ordered by its idempotency key (see idkey.Of); a message with neither runs in
	// any order (it is dead-lettered). The default.
	ByKey Ordering = iota
	// ByPartition runs a partition's messages one after another, in offset order.
	ByPartition
)

func (o Ordering) String() string {
	switch o {
	case ByKey:
		return "key"
	case ByPartition:
		return "partition"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Observer is told of a consumer's progress, for measurement: the bench command times each message
// from its fetch to the offset commit that covers it. Its methods are called on the partitions'
// goroutines, concurrently, and must return quickly.
type Observer interface {
	// Fetched reports that the message at offset was fetched.
	Fetched(topic string, partition int, offset int64)
	// Committed reports that offset, the next to consume, was committed: every message before it is
	// finished.
	Committed(topic string, partition int, offset int64)
}

// Route binds a topic to its handler: a Handler (a BatchHandler among them) or a CallHandler,
// exactly one of them.
type Route struct {
	// Topic is the Kafka topic to consume. Required.
	Topic string
	// Name is the handler's name in the inbox ("payments", "sms"): keys are unique per name. Required.
	Name string
	// Handler applies the topic's messages in the transaction of their inbox rows. Required unless
	// Call is set.
	Handler inboxtype.Handler
	// Call applies the topic's messages by a call to another service, with no transaction open.
	// Required unless Handler is set.
	Call inboxtype.CallHandler
	// CallLease is how long the lease on a key lasts while a call of the route is out: the call gets
	// two thirds of it, and the last third covers a request the other service may still be working
	// on after the worker gave up. It is also how long a message waits, after the process calling
	// for it died, before it is called again. Call routes only; set it above the
	// call's own timeout by half again or more. Its two thirds must be less than Timeout: the call
	// must end within its attempt. Defaults to DefaultCallLease, or Timeout if that is less.
	CallLease time.Duration
	// Timeout bounds one attempt at a message of the route, or at a batch in one transaction: its
	// transaction and its handler; a call route's lease, call and completion. An attempt that runs
	// out of time is retried. Defaults to DefaultTimeout; else from MinTimeout to MaxTimeout.
	Timeout time.Duration
	// IdempotencyKey takes a message's idempotency key, or says why it has none (the reason its
	// dead letter gets); it is never asked of a tombstone, refused before. Defaults to idkey.Of,
	// the contract's rule: the Idempotency-Key header, else X-Idempotent-Key, else webhook-id, else
	// the JSON member event_id.
	IdempotencyKey func(kafka.Message) (string, inboxtype.Reason, error)
	// Verify, when set, verifies each message before its idempotency key is taken: it returns the
	// name of the key that verified it (inbox.Delivery.VerifiedBy), or why it does not verify, and
	// the message is dead-lettered inboxtype.BadSignature (see fault.SignatureProblem). Its verdict must
	// depend on the message alone. Nil: messages are not verified.
	Verify func(kafka.Message) (string, error)
	// Concurrency is the most messages of the route, across all its partitions, whose handlers run
	// at once, each in its transaction; a message waiting to be retried keeps its place. A batch
	// applied in one transaction counts once. It keeps a provider, or the database pool, from being
	// overwhelmed. Defaults to 4: a route that does not say is taken for a database-only one, about
	// a transaction per connection of a small pool. A call route's starts slowly (see gate.Config).
	Concurrency int
	// RateLimit is the most calls per second of a call route, for the whole consumer group: its
	// instances book each call's turn in a schedule they share in the database (Store), one per
	// 1/RateLimit, wherever the traffic is. 0: none; else from MinRateLimit to MaxRateLimit.
	RateLimit float64
}

// The bounds of a Route.RateLimit that is set: a call an hour, a million a second.
const (
	MinRateLimit = 1.0 / 3600
	MaxRateLimit = 1e6
)

// DefaultCallLease is Route.CallLease's default.
const DefaultCallLease = 15 * time.Second

// Route.Timeout's default and bounds.
const (
	DefaultTimeout = 30 * time.Second
	MinTimeout     = 100 * time.Millisecond
	MaxTimeout     = time.Hour
)

// Retry configures the backoff for retryable errors.
type Retry struct {
	// InitialInterval defaults to 200ms.
	InitialInterval time.Duration
	// MaxInterval defaults to 30s.
	MaxInterval time.Duration
	// MaxElapsed is the retry budget of one message, after which it is dead-lettered. Time spent
	// waiting for Postgres to come back is not counted. Defaults to 5m.
	MaxElapsed time.Duration
}

// Config configures a Consumer.
type Config struct {
	// Brokers are the bootstrap brokers. Required.
	Brokers []string
	// ClientID names the consumer to the brokers (their logs and quotas). Defaults to "inboxworker".
	ClientID string
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
	// Ordering says which messages of a partition run one after another: those of one key (ByKey,
	// the default) or all of them (ByPartition).
	Ordering Ordering
	// MaxInFlight is the most messages of one partition fetched and not yet committed. Defaults
	// to 256.
	MaxInFlight int
	// BatchSize is the most messages applied in one transaction (see Transactions). Defaults to 256.
	BatchSize int
	// BatchWait is how long a batch waits for more messages after its first. Defaults to 5ms.
	BatchWait time.Duration
	// Transactions says whether a batch is applied in one transaction (PerBatch, the default, for
	// routes with a BatchHandler) or every message in its own (PerMessage).
	Transactions Transactions
	// ParkAfter is how long a message failing with a retryable error is retried in place, the later
	// messages of its key waiting behind it, before it is parked: taken out of its partition's way
	// into Postgres with the later messages of its key, and retried there on the same backoff and
	// budget (Retry), each key in offset order, while the partition goes on (see docs/design.md, The
	// park). With Ordering ByPartition nothing is parked: a message is retried in place until it
	// is applied or its budget runs out. Defaults to 5s.
	ParkAfter time.Duration
	// ParkLease is how long a hold on a parked message lasts, so that one owner at a time retries
	// it; the hold of an owner that died lapses after it. It must outlast an attempt of every
	// route (Route.Timeout). Defaults to twice the longest.
	ParkLease time.Duration
	// Circuit configures the outage circuit of each route, which pauses the route while its failures
	// look like an outage of its dependency (see gate.CircuitConfig); the zero value takes its defaults.
	// Its OnChange is the consumer's own.
	Circuit gate.CircuitConfig
	// ShutdownTimeout is how long Run lets in-flight messages finish once its context is cancelled;
	// then their work is cancelled and rolled back. Defaults to 30s.
	ShutdownTimeout time.Duration
	// CommitFailureTimeout is how long offset commits may fail, none succeeding, before Ready
	// reports false: the broker refuses them (not authorised, a version it no longer serves), and
	// every message since the last commit will be delivered again. Defaults to 1m.
	CommitFailureTimeout time.Duration
	// LagInterval is how often the consumer_lag and consumer_stalled_seconds metrics of every
	// partition of the routes' topics are refreshed. Defaults to 5s.
	LagInterval time.Duration
	// ParkStatsInterval is how often the parked_messages and parked_oldest_seconds gauges are
	// refreshed, with one query. Defaults to 5s.
	ParkStatsInterval time.Duration
	// Store is the inbox, over the migrated database. Required.
	Store *inbox.Store
	// DeadLetters keeps the dead letters their topic refuses for good, in the migrated database.
	// Required.
	DeadLetters *deadletter.Store
	// Metrics records outcomes; nil records nothing.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Tracer records a span per message, per batch transaction and per inbox transaction, and
	// puts the message's trace context in its dead letter. Defaults to none.
	Tracer *tracing.Tracer
	// Observer, when set, is told of every fetch and offset commit. It is for measurement; nil in
	// production.
	Observer Observer
}

// defaultConcurrency is Route.Concurrency's default.
const defaultConcurrency = 4

// ErrStopped is the cause of the cancellation of work still in flight when Config.ShutdownTimeout
// runs out after Run's context was cancelled.
var ErrStopped = errors.New("consumer: stopped")

// errRevoked is the cause of the cancellation of a partition's work by a rebalance.
var errRevoked = errors.New("consumer: partition revoked by a rebalance")

// Tuning measured against kafka-go: its 10s default MaxWait makes every rebalance and every Close
// wait that long for an idle fetch to return.
const (
	fetchMaxWait      = 500 * time.Millisecond
	heartbeatInterval = time.Second
	joinGroupBackoff  = time.Second
)

// Consumer consumes the configured topics as a member of a consumer group.
type Consumer struct {
	config    Config
	routes    map[string]*route // by topic
	log       *slog.Logger
	metrics   *Metrics
	dialer    *kafka.Dialer
	transport *kafka.Transport // for the dead-letter writer and the lag client
	// committer commits the offsets (commitToBroker), on connections of its own, which find the
	// group's coordinator once and keep it.
	committer *kgo.Client
	dlq       *kafka.Writer
	lag       *lagReporter

	// deadLetters keeps the dead letters their topic refused for good.
	deadLetters *deadletter.Store

	// shortGenerations counts the generations in a row that ended at once (rejoinDelay).
	shortGenerations atomic.Int32

	started    atomic.Bool
	ready      atomic.Bool
	commits    commitHealth
	topicState topicState

	// beforeOffsetCommit, when set (by tests only, before Run), runs before each offset commit.
	beforeOffsetCommit func(topic string, partition int, offset int64)
	// beforeAwait, when set (by tests only, before Run), runs each time a partition is about to
	// wait for news.
	beforeAwait func(p *partition)
}

// New returns a Consumer for config, or an error naming the first invalid field.
func New(config Config) (*Consumer, error) {
	config.ClientID = cmp.Or(config.ClientID, "inboxworker")
	config.GroupID = cmp.Or(config.GroupID, "inboxworker")
	config.Routes = slices.Clone(config.Routes) // defaults filled in below are the consumer's own
	for i := range config.Routes {
		if config.Routes[i].IdempotencyKey == nil {
			config.Routes[i].IdempotencyKey = idkey.Of
		}
	}
	config.SessionTimeout = cmp.Or(config.SessionTimeout, 10*time.Second)
	config.DLQSuffix = cmp.Or(config.DLQSuffix, ".dlq")
	config.Retry.InitialInterval = cmp.Or(config.Retry.InitialInterval, 200*time.Millisecond)
	config.Retry.MaxInterval = cmp.Or(config.Retry.MaxInterval, 30*time.Second)
	config.Retry.MaxElapsed = cmp.Or(config.Retry.MaxElapsed, 5*time.Minute)
	config.ParkAfter = cmp.Or(config.ParkAfter, 5*time.Second)
	config.MaxInFlight = cmp.Or(config.MaxInFlight, 256)
	config.BatchSize = cmp.Or(config.BatchSize, 256)
	config.BatchWait = cmp.Or(config.BatchWait, 5*time.Millisecond)
	config.ShutdownTimeout = cmp.Or(config.ShutdownTimeout, 30*time.Second)
	config.LagInterval = cmp.Or(config.LagInterval, 5*time.Second)
	config.CommitFailureTimeout = cmp.Or(config.CommitFailureTimeout, time.Minute)
	config.ParkStatsInterval = cmp.Or(config.ParkStatsInterval, 5*time.Second)
	config.Logger = cmp.Or(config.Logger, slog.Default())
	config.Routes = append([]Route(nil), config.Routes...) // the caller's slice may change later
	var longest time.Duration
	for i := range config.Routes {
		r := &config.Routes[i]
		r.Concurrency = cmp.Or(r.Concurrency, defaultConcurrency)
		r.Timeout = cmp.Or(r.Timeout, DefaultTimeout)
		if r.Call != nil {
			r.CallLease = cmp.Or(r.CallLease, min(DefaultCallLease, r.Timeout))
		}
		longest = max(longest, r.Timeout)
	}
	config.ParkLease = cmp.Or(config.ParkLease, 2*longest)
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}

	c := &Consumer{
		config:  config,
		routes:  make(map[string]*route, len(config.Routes)),
		log:     config.Logger.With("group", config.GroupID),
		commits: commitHealth{timeout: config.CommitFailureTimeout},
		metrics: config.Metrics,
		dialer: &kafka.Dialer{
			ClientID:      config.ClientID,
			Timeout:       10 * time.Second,
			DualStack:     true,
			SASLMechanism: config.SASL,
			TLS:           config.TLS,
		},
		transport: &kafka.Transport{ClientID: config.ClientID, SASL: config.SASL, TLS: config.TLS},
	}
	for _, r := range config.Routes {
		rt, err := newRoute(r, &c.config, c.log)
		if err != nil {
			return nil, fmt.Errorf("consumer: Config.%w", err)
		}
		c.routes[r.Topic] = rt
	}
	c.dlq = c.newDeadLetterWriter()
	c.deadLetters = config.DeadLetters
	c.lag = newLagReporter(c)
	c.metrics.initSeries(c.topics())
	return c, nil
}

// validate says what is wrong with config, its defaults applied: the first field found invalid.
func (config *Config) validate() error {
	if len(config.Brokers) == 0 {
		return errors.New("Config.Brokers is required")
	}
	if config.Store == nil {
		return errors.New("Config.Store is required")
	}
	if config.DeadLetters == nil {
		return errors.New("Config.DeadLetters is required")
	}
	if err := config.validateRoutes(); err != nil {
		return err
	}
	if err := config.validateDurations(); err != nil {
		return err
	}
	switch {
	case config.Transactions != PerBatch && config.Transactions != PerMessage:
		return fmt.Errorf("Config.Transactions must be PerBatch or PerMessage, got %v", config.Transactions)
	case config.Ordering != ByKey && config.Ordering != ByPartition:
		return fmt.Errorf("Config.Ordering must be ByKey or ByPartition, got %v", config.Ordering)
	case config.MaxInFlight < 1:
		return fmt.Errorf("Config.MaxInFlight must be positive, got %d", config.MaxInFlight)
	case config.BatchSize < 1:
		return fmt.Errorf("Config.BatchSize must be positive, got %d", config.BatchSize)
	}
	return nil
}

// validateRoutes says what is wrong with config.Routes: each route on its own, then a topic or a
// name routed twice (two routes of one name would share their idempotency keys: one route's key
// would skip, or dead-letter as reused, the other's message), or a topic that would dead-letter into
// a consumed topic.
func (config *Config) validateRoutes() error {
	if len(config.Routes) == 0 {
		return errors.New("Config.Routes is required")
	}
	if err := startup.CheckTopicName(config.DLQSuffix); err != nil {
		return fmt.Errorf("Config.DLQSuffix: %w", err)
	}
	topics := make(map[string]bool)
	names := make(map[string]int)
	for i, r := range config.Routes {
		if err := r.validate(); err != nil {
			return fmt.Errorf("Config.Routes[%d]%w", i, err)
		}
		if config.ParkLease <= r.Timeout {
			return fmt.Errorf("Config.ParkLease (%s) must be longer than Routes[%d].Timeout (%s)", config.ParkLease, i, r.Timeout)
		}
		if err := startup.CheckTopicName(r.Topic + config.DLQSuffix); err != nil {
			return fmt.Errorf("Config.Routes[%d].Topic: its dead-letter topic: %w", i, err)
		}
		if topics[r.Topic] {
			return fmt.Errorf("Config.Routes[%d].Topic %q is routed twice", i, r.Topic)
		}
		topics[r.Topic] = true
		if j, ok := names[r.Name]; ok {
			return fmt.Errorf("Config.Routes[%d].Name %q is Config.Routes[%d]'s too: routes share idempotency keys by name", i, r.Name, j)
		}
		names[r.Name] = i
	}
	for i, r := range config.Routes {
		if topics[r.Topic+config.DLQSuffix] {
			return fmt.Errorf("Config.Routes[%d].Topic %q would dead-letter into a consumed topic", i, r.Topic)
		}
	}
	return nil
}

// IsDeadLetterTopic says whether topic is the dead-letter topic of one of c's routes.
func (c *Consumer) IsDeadLetterTopic(topic string) bool {
	for _, r := range c.config.Routes {
		if r.Topic+c.config.DLQSuffix == topic {
			return true
		}
	}
	return false
}

// validate says what is wrong with r, as the rest of a sentence that starts with its place in
// Config.Routes.
func (r Route) validate() error {
	topicErr := startup.CheckTopicName(r.Topic)
	switch {
	case r.Topic == "":
		return errors.New(".Topic is required")
	case topicErr != nil:
		return fmt.Errorf(".Topic: %w", topicErr)
	case r.Name == "":
		return errors.New(".Name is required")
	case (r.Handler == nil) == (r.Call == nil):
		return errors.New(" needs a Handler or a Call, and not both")
	case r.Concurrency < 1:
		return fmt.Errorf(".Concurrency must be positive, got %d", r.Concurrency)
	case r.Timeout < MinTimeout || r.Timeout > MaxTimeout:
		return fmt.Errorf(".Timeout must be from %s to %s, got %s", MinTimeout, MaxTimeout, r.Timeout)
	case r.Call == nil && r.RateLimit != 0:
		return fmt.Errorf(".RateLimit is for call routes; got %g on a Handler route", r.RateLimit)
	case r.Call == nil && r.CallLease != 0:
		return fmt.Errorf(".CallLease is for call routes; got %s on a Handler route", r.CallLease)
	case r.Call != nil:
		return r.validateCall()
	}
	return nil
}

// validateCall says what is wrong with call route r's lease and rate limit.
func (r Route) validateCall() error {
	switch {
	case r.RateLimit != 0 && !(r.RateLimit >= MinRateLimit && r.RateLimit <= MaxRateLimit): // NaN too
		return fmt.Errorf(".RateLimit must be 0 or from %g to %g calls per second; got %g", MinRateLimit, MaxRateLimit, r.RateLimit)
	case r.CallLease < 3*time.Millisecond:
		return fmt.Errorf(".CallLease must be at least 3ms, got %s", r.CallLease)
	case r.CallLease*2/3 >= r.Timeout:
		return fmt.Errorf(".CallLease %s gives its call %s, no less than Timeout %s: the attempt would end the call first",
			r.CallLease, r.CallLease*2/3, r.Timeout)
	}
	return nil
}

// validateDurations says what is wrong with config's durations: a negative one, or one out of
// step with another.
func (config *Config) validateDurations() error {
	positive := []struct {
		name string
		d    time.Duration
	}{
		{"SessionTimeout", config.SessionTimeout},
		{"Retry.InitialInterval", config.Retry.InitialInterval},
		{"Retry.MaxInterval", config.Retry.MaxInterval},
		{"Retry.MaxElapsed", config.Retry.MaxElapsed},
		{"ParkAfter", config.ParkAfter},
		{"BatchWait", config.BatchWait},
		{"ShutdownTimeout", config.ShutdownTimeout},
		{"LagInterval", config.LagInterval},
		{"CommitFailureTimeout", config.CommitFailureTimeout},
		{"ParkStatsInterval", config.ParkStatsInterval},
	}
	for _, p := range positive {
		if p.d < 0 {
			//lint:ignore ST1005 it begins with the field's name, as New's other errors do
			return fmt.Errorf("Config.%s must be positive, got %s", p.name, p.d)
		}
	}
	switch {
	case config.SessionTimeout < 100*time.Millisecond:
		return fmt.Errorf("Config.SessionTimeout must be at least 100ms, got %s", config.SessionTimeout)
	case config.Retry.MaxInterval < config.Retry.InitialInterval:
		return fmt.Errorf("Config.Retry.MaxInterval (%s) must not be less than Retry.InitialInterval (%s)",
			config.Retry.MaxInterval, config.Retry.InitialInterval)
	}
	return nil
}

// Ready reports whether the consumer is a member of its group, with its partitions assigned, and
// its offset commits go through: commits that have failed for Config.CommitFailureTimeout, none
// succeeding, make it not ready.
func (c *Consumer) Ready() bool { return c.NotReady() == nil }

// NotReady says why the consumer is not ready; nil when it is.
func (c *Consumer) NotReady() error {
	switch {
	case !c.ready.Load():
		return errors.New("not joined to the consumer group yet")
	case c.commits.failing():
		return fmt.Errorf("offset commits have failed for %s, none succeeding", c.config.CommitFailureTimeout)
	}
	if missing := c.missingTopics(); len(missing) > 0 {
		return fmt.Errorf("consumed topics that cannot be read (deleted, not created yet, or not authorised), their routes consuming nothing: %s",
			strings.Join(missing, ", "))
	}
	return nil
}

// Run consumes until ctx is cancelled. Then it stops fetching, lets in-flight messages finish within
// Config.ShutdownTimeout (after which their work is cancelled with cause ErrStopped and rolled back),
// commits the offsets of what finished, leaves the group, closes its connections and returns nil.
// It returns an error only when it cannot run at all. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	c.readCountsBeforeJoin(ctx)
	var err error
	if c.committer, err = c.newCommitter(); err != nil {
		return err
	}
	group, err := kafka.NewConsumerGroup(c.groupConfig())
	if err != nil {
		c.committer.Close()
		return fmt.Errorf("consumer: %w", err)
	}
	defer c.closeConnections()

	// In-flight work runs under hard, which outlives ctx by ShutdownTimeout.
	hard, cancelHard := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHard(ErrStopped)
	var background sync.WaitGroup
	defer background.Wait()
	runDone := make(chan struct{})
	defer close(runDone)
	background.Go(func() { c.cancelAfterShutdownTimeout(ctx, runDone, cancelHard) })
	background.Go(func() { c.lag.run(ctx) })
	background.Go(func() {
		reportParked(ctx, c.metrics, c.config.Store, c.topics(), c.config.ParkStatsInterval, c.log)
	})

	c.log.InfoContext(ctx, "joining the consumer group", "topics", c.topics())
	var partitions sync.WaitGroup
	var ended atomic.Int64 // when the previous generation ended, in Unix nanoseconds
	for {
		gen, err := group.Next(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			c.ready.Store(false)
			c.log.WarnContext(ctx, "cannot join the consumer group; retrying", "error", err)
			continue
		}
		c.ready.Store(true)
		assigned := assignmentsAttr(gen)
		c.metrics.assigned(c.topics(), assigned)
		attrs := []any{"generation", gen.ID, "member", gen.MemberID, "assignments", assigned}
		if t := ended.Load(); t != 0 {
			attrs = append(attrs, "rebalance", time.Since(time.Unix(0, t)).Round(time.Millisecond))
		}
		c.log.InfoContext(ctx, "joined a generation of the consumer group", attrs...)
		if len(assigned) == 0 { // says why, if it lasts (lag.go)
			gen.Start(func(genCtx context.Context) { c.lag.warnIdle(genCtx, gen.MemberID) })
		}
		c.startGeneration(ctx, hard, gen, &partitions, func() { ended.Store(time.Now().UnixNano()) })
	}

	c.log.InfoContext(ctx, "stopping: fetching no more messages, finishing in-flight ones",
		"timeout", c.config.ShutdownTimeout)
	partitions.Wait()
	c.ready.Store(false)
	if err := group.Close(); err != nil {
		c.log.Warn("cannot leave the consumer group", "error", err)
	}
	c.log.Info("stopped")
	return nil
}

// startGeneration starts one goroutine per partition gen assigned, each bound to gen. kafka-go ends
// a generation as soon as any goroutine started by gen.Start returns; so that a partition finishing
// its last batch on shutdown does not cut short the others' (their heartbeats and commits), every
// partition goroutine waits for its siblings before it returns.
func (c *Consumer) startGeneration(stop, hard context.Context, gen *kafka.Generation, all *sync.WaitGroup, onEnd func()) {
	// Every sibling is counted before the first starts: one that returns at once (its generation
	// already ended) must not find the count at zero while others are still to be added.
	var siblings sync.WaitGroup
	n := 0
	for _, assigned := range gen.Assignments {
		n += len(assigned)
	}
	siblings.Add(n)
	all.Add(n)
	for topic, assigned := range gen.Assignments {
		for _, a := range assigned {
			p := c.newPartition(c.routes[topic], a, gen)
			gen.Start(func(genCtx context.Context) {
				defer all.Done()
				p.run(stop, hard, genCtx)
				siblings.Done()
				siblings.Wait()
			})
		}
	}
	gen.Start(c.watchTopics)
	// Records when the generation ends, to log how long the rebalance took, reads the topics'
	// partitions before the next join, and holds the join back after generations that ended at
	// once (the next join waits for it). Not counted in all: it returns only when the group is
	// closed or rebalanced.
	began := time.Now()
	gen.Start(func(genCtx context.Context) {
		<-genCtx.Done()
		onEnd()
		c.readCountsBeforeJoin(stop)
		if d := c.rejoinDelay(time.Since(began)); d > 0 {
			c.log.Warn("generations of the consumer group end as soon as they begin; waiting before joining again",
				"generation", gen.ID, "delay", d)
			_ = wait.Sleep(stop, d)
		}
	})
}

// A generation that lasts less than shortGeneration ended at once. After shortGenerationsFree of
// them in a row (rolling deploys and partition changes come in small runs), the next join waits
// shortGenerationDelay, doubling up to maxRejoinDelay: whatever ends them (a partition that cannot
// start, a broker answering oddly) must not make the group rebalance as fast as it can join.
const (
	shortGeneration      = time.Second
	shortGenerationsFree = 3
	shortGenerationDelay = 250 * time.Millisecond
	maxRejoinDelay       = 10 * time.Second
)

// rejoinDelay returns how long to wait before the next join, after a generation that lasted.
func (c *Consumer) rejoinDelay(lasted time.Duration) time.Duration {
	if lasted >= shortGeneration {
		c.shortGenerations.Store(0)
		return 0
	}
	n := c.shortGenerations.Add(1)
	if n <= shortGenerationsFree {
		return 0
	}
	return min(shortGenerationDelay<<min(n-shortGenerationsFree-1, 6), maxRejoinDelay)
}

// cancelAfterShutdownTimeout cancels in-flight work ShutdownTimeout after ctx is cancelled, unless
// Run is done by then.
func (c *Consumer) cancelAfterShutdownTimeout(ctx context.Context, runDone <-chan struct{}, cancel context.CancelCauseFunc) {
	select {
	case <-ctx.Done():
	case <-runDone:
		return
	}
	t := time.NewTimer(c.config.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-t.C:
		c.log.Warn("shutdown timeout: cancelling in-flight work", "timeout", c.config.ShutdownTimeout)
		cancel(ErrStopped)
	case <-runDone:
	}
}

func (c *Consumer) groupConfig() kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID:      c.config.GroupID,
		Brokers: c.config.Brokers,
		Dialer:  c.dialer,
		Topics:  c.topics(),
		// kafka-go needs heartbeats well within the session timeout.
		HeartbeatInterval:     min(heartbeatInterval, c.config.SessionTimeout/3),
		SessionTimeout:        c.config.SessionTimeout,
		JoinGroupBackoff:      joinGroupBackoff,
		WatchPartitionChanges: false, // watchTopics instead (topics.go)
		GroupBalancers: []kafka.GroupBalancer{ // kafka-go's, each wrapped (topics.go)
			topicBalancer{kafka.RangeGroupBalancer{}, c},
			topicBalancer{kafka.RoundRobinGroupBalancer{}, c},
		},
		StartOffset: kafka.FirstOffset,
		Logger:      kafkaLogger(c.log, slog.LevelDebug),
		ErrorLogger: kafkaErrorLogger(c.log),
	}
}

func (c *Consumer) topics() []string {
	topics := make([]string, 0, len(c.config.Routes))
	for _, r := range c.config.Routes {
		topics = append(topics, r.Topic)
	}
	return topics
}

// newCommitter returns the client the offsets are committed with (commitToBroker). A commit that
// fails is tried again by its partition (commitDue): kgo tries once more only, for a connection the
// broker closed while it was idle. OffsetCommit 10 (Kafka 4.1) names topics by id, which the worker
// does not know: it asks for 9 at most.
func (c *Consumer) newCommitter() (*kgo.Client, error) {
	versions := kversion.Stable()
	versions.SetMaxKeyVersion(kmsg.OffsetCommit.Int16(), 9)
	committer, err := kgo.NewClient(append(c.kgoOptions(c.log), kgo.RequestRetries(1), kgo.MaxVersions(versions))...)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return committer, nil
}

func (c *Consumer) closeConnections() {
	if err := c.dlq.Close(); err != nil {
		c.log.Warn("cannot close the dead-letter writer", "error", err)
	}
	c.transport.CloseIdleConnections()
	if c.committer != nil { // nil before Run
		c.committer.Close()
	}
}

func assignmentsAttr(gen *kafka.Generation) map[string][]int {
	out := make(map[string][]int, len(gen.Assignments))
	for topic, assigned := range gen.Assignments {
		for _, a := range assigned {
			out[topic] = append(out[topic], a.ID)
		}
	}
	return out
}

// kafkaLogger adapts slog to kafka-go's Logger at a fixed level.
func kafkaLogger(log *slog.Logger, level slog.Level) kafka.Logger {
	log = log.With("component", "kafka-go")
	return kafka.LoggerFunc(func(format string, args ...any) {
		ctx := context.Background()
		if log.Enabled(ctx, level) {
			log.Log(ctx, level, fmt.Sprintf(format, args...))
		}
	})
}

// kafkaErrorLogger is kafkaLogger for kafka-go's errors, at warn: each kind of error (its format)
// said once, then at most once a minute with how often since. The error is an attribute of its own,
// out of the message ("Failed to sync group inboxworker", error "[27] Rebalance In Progress: …"), so
// that the lines of one kind group together. A group's rebalance, which kafka-go reports as a
// failed join or sync answered REBALANCE_IN_PROGRESS, is no warning: the consumer's own lines tell
// the generations; it is at debug.
func kafkaErrorLogger(log *slog.Logger) kafka.Logger {
	log = log.With("component", "kafka-go")
	said := &repeats{interval: repeatInterval}
	return kafka.LoggerFunc(func(format string, args ...any) {
		ctx := context.Background()
		msg, err := kafkaLogEntry(format, args)
		var attrs []any
		if err != nil {
			attrs = append(attrs, "error", err)
		}
		if errors.Is(err, kafka.RebalanceInProgress) {
			log.DebugContext(ctx, msg, attrs...)
			return
		}
		if ok, since := said.say(format, time.Now()); ok {
			if since > 0 {
				attrs = append(attrs, "repeated", since)
			}
			log.WarnContext(ctx, msg, attrs...)
		}
	})
}

// kafkaLogEntry is kafka-go's line (format, args) as a message and its error: a format ending in
// ": %v" (or %s, %w) of an error is the message before it, and the error; any other line is its
// whole text, and no error.
func kafkaLogEntry(format string, args []any) (string, error) {
	format = strings.TrimRight(format, "\n")
	if n := len(args); n > 0 {
		if err, ok := args[n-1].(error); ok {
			for _, verb := range []string{": %v", ": %s", ": %w"} {
				if head, found := strings.CutSuffix(format, verb); found {
					return fmt.Sprintf(head, args[:n-1]...), err
				}
			}
		}
	}
	return fmt.Sprintf(format, args...), nil
}
