package outbox

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// HeaderIdempotencyKey is the Kafka header carrying an event's id.
const HeaderIdempotencyKey = "Idempotency-Key"

// Observer is told of a relay's publications, for measurement: the bench command times each event
// from its commit to its acknowledgement. Its methods are called on the relay's goroutine and must
// return quickly.
type Observer interface {
	// Publishing reports that the relay holding the lease under epoch is about to write msgs.
	Publishing(epoch int64, msgs []kafka.Message)
	// Published reports that the write of Publishing ended: published of msgs are acknowledged by
	// every in-sync replica (all of them when err is nil).
	Published(epoch int64, msgs []kafka.Message, published []bool, err error)
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool reaches the migrated database holding the outbox. Required.
	Pool *pgxpool.Pool
	// Brokers are the bootstrap brokers. Required.
	Brokers []string
	// SASL, when set, authenticates to the brokers.
	SASL sasl.Mechanism
	// TLS, when set, encrypts the connections to the brokers.
	TLS *tls.Config
	// Topics are the topics events are emitted to, as far as known at start: their series of the
	// published counter exist from the start.
	Topics []string
	// Retention is how long a published event is kept in the outbox, then purged. Defaults to 24h.
	Retention time.Duration
	// BatchSize is the most events read and published at once. Defaults to 1000.
	BatchSize int
	// LeaseTTL is how long the relay's lease lasts unless renewed: how soon another instance takes
	// over from a relay that died. It must exceed WriteTimeout by a second at least. Defaults to 5s.
	LeaseTTL time.Duration
	// PollInterval is how often a relay holding the lease looks for events when none were emitted
	// in this process (those are published at once). Defaults to 100ms.
	PollInterval time.Duration
	// WriteTimeout bounds one write to Kafka. Defaults to 2s.
	WriteTimeout time.Duration
	// StatsInterval is how often the waiting, oldest and stalled gauges are refreshed, by every
	// relay, holding the lease or not. Defaults to 5s.
	StatsInterval time.Duration
	// PurgeInterval is how often the relay holding the lease purges. Defaults to 1m.
	PurgeInterval time.Duration
	// Metrics, when set, receive the relay's metrics.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Observer, when set, is told of each write.
	Observer Observer
}

// Defaults of RelayConfig.
const (
	defaultRetention     = 24 * time.Hour
	defaultBatchSize     = 1000
	defaultLeaseTTL      = 5 * time.Second
	defaultPollInterval  = 100 * time.Millisecond
	defaultWriteTimeout  = 2 * time.Second
	defaultStatsInterval = 5 * time.Second
	defaultPurgeInterval = time.Minute
)

// The writer's timing. A write of a round goes out within batchTimeout (the writer flushes at
// once: the round's messages are all there) and ends within WriteTimeout; fenceMargin is kept on
// top, for the time between the fence's check and the write.
const (
	batchTimeout = time.Millisecond
	fenceMargin  = 500 * time.Millisecond
	// maxBatchBytes is the most bytes of messages in one round, and the writer's batch size in
	// bytes, so that each partition's messages of a round go in one produce request, which the
	// broker appends whole or not at all.
	maxBatchBytes = 1 << 20
)

// Relay publishes the outbox's events to Kafka. Run it on every instance: one at a time holds the
// lease and publishes, the others stand by and take over when its lease expires.
type Relay struct {
	config RelayConfig
	log    *slog.Logger
	writer *kafka.Writer
	holder string

	// The lease as this relay holds it: only Run's goroutine touches these.
	epoch   int64     // 0: not held
	renewed time.Time // local time before the statement that last renewed it
	// cursor is the position up to which every event is published; marked is how far the lease's
	// cursor has been moved on (marked < cursor: to be marked before anything else). ahead are the
	// events after cursor published already (when a write was acknowledged in part): a later round
	// moves the cursor over them without sending them again.
	cursor, marked int64
	ahead          map[event]bool
	horizon        horizon

	// holding is whether the lease is held, for the purger.
	mu      sync.Mutex
	holding bool
}

// NewRelay returns a Relay.
func NewRelay(config RelayConfig) (*Relay, error) {
	c := config
	c.Retention = cmp.Or(c.Retention, defaultRetention)
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, defaultLeaseTTL)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, defaultWriteTimeout)
	c.StatsInterval = cmp.Or(c.StatsInterval, defaultStatsInterval)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, defaultPurgeInterval)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	switch {
	case c.Pool == nil:
		return nil, errors.New("outbox: RelayConfig.Pool is required")
	case len(c.Brokers) == 0:
		return nil, errors.New("outbox: RelayConfig.Brokers is required")
	case c.Retention < 0 || c.BatchSize < 0 || c.PollInterval < 0 || c.WriteTimeout < 0 ||
		c.StatsInterval < 0 || c.PurgeInterval < 0:
		return nil, errors.New("outbox: RelayConfig durations and sizes must be positive")
	case c.LeaseTTL < c.WriteTimeout+batchTimeout+fenceMargin+renewEvery(c.LeaseTTL):
		return nil, fmt.Errorf("outbox: RelayConfig.LeaseTTL %s is too short for WriteTimeout %s", c.LeaseTTL, c.WriteTimeout)
	}
	r := &Relay{config: c, log: c.Logger, holder: inbox.NewHolder("outbox relay")}
	r.writer = &kafka.Writer{
		Addr:         kafka.TCP(c.Brokers...),
		Balancer:     &kafka.Hash{}, // as producers of order numbers and phone numbers do
		RequiredAcks: kafka.RequireAll,
		MaxAttempts:  1, // the relay retries itself, checking its lease first
		BatchSize:    c.BatchSize,
		BatchBytes:   maxBatchBytes,
		BatchTimeout: batchTimeout,
		WriteTimeout: c.WriteTimeout,
		Transport:    &kafka.Transport{ClientID: "inboxworker-outbox", SASL: c.SASL, TLS: c.TLS},
	}
	c.Metrics.init(c.Topics)
	return r, nil
}

// renewEvery is how often the holder renews its lease: five times per lease.
func renewEvery(ttl time.Duration) time.Duration { return ttl / 5 }

// Run publishes, purges and reports until ctx is done, then gives the lease up, so that another
// instance takes over at once. It waits out Postgres and Kafka outages.
func (r *Relay) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { r.reportStats(ctx) })
	wg.Go(func() { r.purgeWhileHolding(ctx) })
	r.publish(ctx)
	wg.Wait()
	if err := r.writer.Close(); err != nil {
		r.log.WarnContext(ctx, "outbox relay: closing the Kafka writer", slog.Any("error", err))
	}
	r.writer.Transport.(*kafka.Transport).CloseIdleConnections()
}

// publish is the relay's loop: stand by for the lease, then publish rounds while holding it. A
// failed round (Postgres or Kafka unreachable) is tried again after a backoff, without end.
func (r *Relay) publish(ctx context.Context) {
	defer r.release(ctx)
	var failures int
	for ctx.Err() == nil {
		next, err := r.step(ctx)
		switch {
		case err != nil:
			failures++
			// Never longer than the lease's renewal interval: a relay waiting out a Kafka outage
			// still holds the lease, and must renew it rather than lose it to itself.
			next = min(retryDelay(failures), renewEvery(r.config.LeaseTTL))
			if ctx.Err() == nil && (failures == 1 || failures%10 == 0) {
				r.log.WarnContext(ctx, "outbox relay: a round failed; trying again", slog.Any("error", err),
					slog.Int("failures", failures), slog.Duration("retry_in", next))
			}
			_ = wait.Sleep(ctx, next)
			continue
		case failures > 0:
			r.log.InfoContext(ctx, "outbox relay: publishing again", slog.Int("failures", failures))
			failures = 0
		}
		if next > 0 {
			var woken <-chan struct{}
			if r.epoch != 0 {
				woken = emitted.wait()
			}
			_ = wait.Sleep(ctx, next, woken) // woken: events committed in this process
		}
	}
}

// step takes the lease if it is not held, or runs one round. It returns how long to wait before the
// next step (0: at once).
func (r *Relay) step(ctx context.Context) (time.Duration, error) {
	if r.epoch == 0 {
		took, err := r.acquire(ctx)
		if err != nil || !took {
			return renewEvery(r.config.LeaseTTL), err
		}
	}
	n, err := r.round(ctx)
	if err != nil || n == 0 {
		return r.config.PollInterval, err
	}
	return 0, nil
}

// retryDelay is the wait after the nth failure in a row: 100ms doubling up to 5s.
func retryDelay(n int) time.Duration {
	return wait.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(n)
}

// round publishes one batch: it marks what is left unmarked, moves the horizon on (renewing the
// lease when due), reads the events up to it, publishes those not published yet if the lease is live
// with a margin, and moves the cursor over what was acknowledged. It returns how many events it
// published.
func (r *Relay) round(ctx context.Context) (int, error) {
	if err := r.markUnmarked(ctx); err != nil {
		return 0, err
	}
	b, err := r.fetch(ctx)
	if err != nil || len(b.rows) == 0 {
		if err == nil && b.complete && r.epoch != 0 {
			r.cursor = max(r.cursor, r.horizon.at) // only positions never committed up to there
			err = r.markUnmarked(ctx)
		}
		return 0, err
	}
	sending := r.unpublished(b.rows)
	if len(sending) == 0 { // all published already, by a write acknowledged in part
		r.record(b, nil, nil)
		return 0, r.markUnmarked(ctx)
	}
	fence := r.renewed.Add(r.config.LeaseTTL - r.config.WriteTimeout - batchTimeout - fenceMargin)
	msgs := messages(sending)
	if o := r.config.Observer; o != nil {
		o.Publishing(r.epoch, msgs)
	}
	// The fence: no write starts unless it ends, at the latest, before the lease could have
	// passed to another instance. A relay that stalled since it read the batch publishes nothing.
	if time.Now().After(fence) {
		if o := r.config.Observer; o != nil {
			o.Published(r.epoch, msgs, make([]bool, len(msgs)), errFenced)
		}
		return 0, nil // the next round renews the lease, or finds it lost
	}
	// The write is not cancelled with ctx: its outcome must be known, so that what was acknowledged
	// is marked. It ends within WriteTimeout anyway.
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), fence.Add(r.config.WriteTimeout+batchTimeout))
	defer cancel()
	werr := r.writer.WriteMessages(wctx, msgs...)
	published := acknowledged(len(msgs), werr)
	if o := r.config.Observer; o != nil {
		o.Published(r.epoch, msgs, published, werr)
	}
	n := r.record(b, sending, published)
	if err := r.markUnmarked(ctx); err != nil {
		return n, err
	}
	if werr != nil {
		return n, fmt.Errorf("outbox relay: publish %d events (%d acknowledged): %w", len(msgs), n, werr)
	}
	return n, nil
}

// unpublished are the rows not published yet.
func (r *Relay) unpublished(rows []row) []row {
	if len(r.ahead) == 0 {
		return rows
	}
	out := make([]row, 0, len(rows))
	for _, e := range rows {
		if !r.ahead[e.event] {
			out = append(out, e)
		}
	}
	return out
}

// errFenced is what Observer.Published is told of a batch the fence stopped.
var errFenced = errors.New("outbox relay: the lease may have passed to another instance; not published")

// acknowledged says which of n messages a write acknowledged.
func acknowledged(n int, err error) []bool {
	published := make([]bool, n)
	var werrs kafka.WriteErrors
	switch {
	case err == nil:
		for i := range published {
			published[i] = true
		}
	case errors.As(err, &werrs) && len(werrs) == n:
		for i, e := range werrs {
			published[i] = e == nil
		}
	}
	return published
}

// record notes the acknowledged events of sent (of b) as published, counts them, and moves the
// cursor over the longest run of b's emissions whose events are all published (and all in b) — to
// the horizon when b was every event up to it. A partition's events of one round are acknowledged
// together or not at all (one produce request), so an aggregate's unacknowledged events are all
// after its acknowledged ones, and are published again, in order, by a later round; the
// acknowledged events after the cursor are not.
func (r *Relay) record(b batch, sent []row, published []bool) int {
	n := 0
	for i, ok := range published {
		if ok {
			r.ahead[sent[i].event] = true
			r.config.Metrics.published(sent[i].topic)
			n++
		}
	}
	all := true
	for _, e := range b.rows {
		if !r.ahead[e.event] {
			all = false
			break
		}
		if e.event.ordinal == e.of { // the emission's last event: all of it is published
			r.cursor = e.event.position
		}
	}
	if all && b.complete {
		r.cursor = max(r.cursor, r.horizon.at)
	}
	for e := range r.ahead {
		if e.position <= r.cursor {
			delete(r.ahead, e)
		}
	}
	return n
}

// messages are the Kafka messages of batch: key = the aggregate id, value = the payload, the id in
// Idempotency-Key, and the trace context's fields as headers.
func messages(batch []row) []kafka.Message {
	msgs := make([]kafka.Message, len(batch))
	for i, e := range batch {
		headers := []kafka.Header{{Key: HeaderIdempotencyKey, Value: []byte(e.id)}}
		if e.trace != nil {
			for _, kv := range traceHeaders(*e.trace) {
				headers = append(headers, kafka.Header{Key: kv[0], Value: []byte(kv[1])})
			}
		}
		msgs[i] = kafka.Message{Topic: e.topic, Key: []byte(e.aggregateID), Value: e.payload, Headers: headers}
	}
	return msgs
}

// messageBytes is at least what kafka-go counts of a message against a batch's bytes.
func messageBytes(e row) int {
	n := 64 + len(e.aggregateID) + len(e.payload) + len(HeaderIdempotencyKey) + len(e.id)
	if e.trace != nil {
		n += 2 * len(*e.trace)
	}
	return n
}

func (r *Relay) setHolding(holding bool) {
	r.mu.Lock()
	r.holding = holding
	r.mu.Unlock()
	r.config.Metrics.setActive(holding)
}

func (r *Relay) isHolding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holding
}
