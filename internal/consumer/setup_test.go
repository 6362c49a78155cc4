package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild() // a crash test's worker process: never returns
	}
	pgtest.Main(m)
}

const (
	topic    = "events"
	dlqTopic = "events.dlq"
	group    = "test-group"
	handler  = "events"
)

// testMode is a way to run the consumer: a value of Config.Transactions and one of Config.Ordering.
type testMode struct {
	tx    consumer.Transactions
	order consumer.Ordering
}

// modes are the ways the tests run the consumer: each guarantee holds in all of them.
var modes = []testMode{
	{consumer.PerMessage, consumer.ByKey},
	{consumer.PerBatch, consumer.ByKey},
	{consumer.PerMessage, consumer.ByPartition},
	{consumer.PerBatch, consumer.ByPartition},
}

// forEachMode runs test as a parallel subtest for each mode, named after it (PerMessage/ByKey,
// PerBatch/ByPartition, ...).
func forEachMode(t *testing.T, test func(t *testing.T, mode testMode)) {
	t.Helper()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

func (m testMode) String() string {
	tx, order := "PerMessage", "ByKey"
	if m.tx == consumer.PerBatch {
		tx = "PerBatch"
	}
	if m.order == consumer.ByPartition {
		order = "ByPartition"
	}
	return tx + order
}

// env is one test's broker, schema and metrics.
type env struct {
	t          *testing.T
	mode       testMode
	kafka      *kafkatest.Cluster
	db         *pgtest.DB
	partitions int
	log        *slog.Logger
	logs       *testlog.Records // what log logged
	// beforeOffsetCommit, when set, runs before each offset commit of every consumer start runs.
	beforeOffsetCommit func(topic string, partition int, offset int64)
}

// setup starts a broker with topic and its dead-letter topic (partitions each) and a fresh schema
// with an effects table, where the test handler records what it applied, inside the inbox
// transaction. The consumers it configures run in mode.
func setup(t *testing.T, mode testMode, partitions int) *env {
	t.Helper()
	log, logs := testlog.Capture(t)
	e := &env{
		t:          t,
		mode:       mode,
		kafka:      kafkatest.Start(t, int32(partitions), topic, dlqTopic),
		db:         pgtest.Schema(t),
		partitions: partitions,
		log:        log,
		logs:       logs,
	}
	_, err := e.db.Pool.Exec(context.Background(), effectsTable)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// effectsTable has no unique constraint: an effect applied twice shows as two rows.
const effectsTable = `CREATE TABLE effects (
	id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key  text NOT NULL,
	body text NOT NULL
)`

// recorder is the test handler: it records each message it applies in effects, after asking fail
// (when set) whether to fail instead. after, when set, runs once the effect is written, in the
// transaction. It is a BatchHandler that applies a batch one delivery at a time, so that a test
// runs the same handler in both modes.
type recorder struct {
	fail  func(d inbox.Delivery) error
	after func(d inbox.Delivery)
}

func (h *recorder) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	return handleEach(ctx, tx, ds, h.Handle)
}

// handleEach applies ds one by one with handle, stopping at the first error.
func handleEach(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery,
	handle func(context.Context, pgx.Tx, inbox.Delivery) error) []error {
	errs := make([]error, len(ds))
	for i, d := range ds {
		if errs[i] = handle(ctx, tx, d); errs[i] != nil {
			break
		}
	}
	return errs
}

func (h *recorder) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	if h.fail != nil {
		if err := h.fail(d); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, body) VALUES ($1, $2)`, d.Key, string(d.Value))
	if err == nil && h.after != nil {
		h.after(d)
	}
	return err
}

// config returns a consumer configuration with the fast timings of the tests.
func (e *env) config(h inboxtype.Handler) consumer.Config {
	store, err := inbox.NewStore(e.db.Pool, inbox.Config{Logger: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	return testConfig(e.kafka.Addr, e.db.Pool, store, h, e.mode, e.log)
}

func testConfig(broker string, pool *pgxpool.Pool, store *inbox.Store, h inboxtype.Handler,
	mode testMode, log *slog.Logger) consumer.Config {
	return consumer.Config{
		Brokers: []string{broker},
		GroupID: group,
		Routes:  []consumer.Route{{Topic: topic, Name: handler, Handler: h}},
		// Long: the broker runs in the test's process, so a pause of the whole process (a busy
		// machine's, seconds long) outlasting the session expires a live consumer on resume and
		// redelivers what it was retrying. Only a consumer that is killed (runChild) has a short one.
		SessionTimeout: 10 * time.Second,
		Retry: consumer.Retry{
			InitialInterval: time.Millisecond,
			MaxInterval:     20 * time.Millisecond,
			MaxElapsed:      5 * time.Second,
		},
		Transactions:    mode.tx,
		Ordering:        mode.order,
		ShutdownTimeout: 5 * time.Second,
		// Often enough for a test to see the gauges move soon; TestLag and TestGroupLag refresh
		// the lag more often.
		LagInterval:       time.Second,
		ParkStatsInterval: 100 * time.Millisecond,
		Store:             store,
		DeadLetters:       deadletter.NewStore(pool),
		Metrics:           consumer.NewMetrics(prometheus.NewRegistry()),
		Logger:            log,
	}
}

// start runs a consumer for config until the test ends or stop is called.
func (e *env) start(config consumer.Config) (c *consumer.Consumer, stop func()) {
	e.t.Helper()
	c, err := consumer.New(config)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.beforeOffsetCommit != nil {
		consumer.SetBeforeOffsetCommit(c, e.beforeOffsetCommit)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("Run: %v", err)
			}
			checkHandleTimed(e.t, config.Metrics)
		})
	}
	e.t.Cleanup(stop)
	return c, stop
}

// checkHandleTimed fails t unless every message m counted as finished has its handle time observed
// once, topic by topic: whichever executor finished it, it ended in one place.
func checkHandleTimed(t testing.TB, m *consumer.Metrics) {
	t.Helper()
	counted, timed := map[string]float64{}, map[string]uint64{}
	for _, c := range collect(t, m.Messages) {
		counted[label(c, "topic")] += c.GetCounter().GetValue()
	}
	for _, h := range collect(t, m.Handle) {
		timed[label(h, "topic")] += h.GetHistogram().GetSampleCount()
	}
	for topic, n := range counted {
		if uint64(n) != timed[topic] {
			t.Errorf("topic %s: %v messages finished, %d handle times observed", topic, n, timed[topic])
		}
	}
}

// collect is what c holds, a series each.
func collect(t testing.TB, c prometheus.Collector) []*dto.Metric {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var out []*dto.Metric
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		out = append(out, &d)
	}
	return out
}

// label is the value of m's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// produce writes messages with the given idempotency keys (as event_id in JSON values) and returns
// them. Their Kafka keys spread them over the partitions.
func (e *env) produce(keys ...string) []kafka.Message {
	e.t.Helper()
	msgs := make([]kafka.Message, len(keys))
	for i, k := range keys {
		msgs[i] = kafka.Message{Key: []byte("order-" + k), Value: eventValue(k, i)}
	}
	e.kafka.Produce(e.t, topic, msgs...)
	return msgs
}

// produceOrdered writes messages with the given idempotency keys, all with the Kafka key
// orderingKey: they are applied one after another, in this order, in every ordering mode.
func (e *env) produceOrdered(orderingKey string, keys ...string) []kafka.Message {
	e.t.Helper()
	msgs := make([]kafka.Message, len(keys))
	for i, k := range keys {
		msgs[i] = kafka.Message{Key: []byte(orderingKey), Value: eventValue(k, i)}
	}
	e.kafka.Produce(e.t, topic, msgs...)
	return msgs
}

func eventValue(key string, seq int) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"seq":%d}`, key, seq)
}

// keys returns n distinct idempotency keys.
func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + "-" + strconv.Itoa(i)
	}
	return out
}

// waitFor polls cond until it holds. The deadline only keeps a broken test from hanging.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	waitFor(e.t, what, cond)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.For(t, what, cond)
}

// committed is the sum of the group's committed offsets over topic's partitions; 0 until the group
// exists.
func (e *env) committed() int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.offsetFetch(ctx)
	if errors.Is(err, kafka.GroupIdNotFound) || err == nil && errors.Is(resp.Error, kafka.GroupIdNotFound) {
		return 0
	}
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		e.t.Fatalf("committed offsets: %v", err)
	}
	var sum int64
	for _, p := range resp.Topics[topic] {
		if p.Error == nil && p.CommittedOffset > 0 {
			sum += p.CommittedOffset
		}
	}
	return sum
}

// offsetFetch asks the broker for the group's committed offsets of each of topic's partitions.
func (e *env) offsetFetch(ctx context.Context) (*kafka.OffsetFetchResponse, error) {
	partitions := make([]int, e.partitions)
	for p := range partitions {
		partitions[p] = p
	}
	return e.kafka.Client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: partitions}})
}

// committedOffsets says, for a failure, what the group has committed of each of topic's partitions
// ("-" for none), against how many messages each holds.
func (e *env) committedOffsets() string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	committed, err := e.offsetFetch(ctx)
	if err != nil {
		return fmt.Sprintf("committed offsets unknown: %v", err)
	}
	var out []string
	for _, p := range committed.Topics[topic] {
		last, err := e.kafka.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
			Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(p.Partition)}}})
		end := "?"
		if err == nil && len(last.Topics[topic]) == 1 {
			end = fmt.Sprint(last.Topics[topic][0].LastOffset)
		}
		at := "-"
		if p.Error == nil && p.CommittedOffset >= 0 {
			at = fmt.Sprint(p.CommittedOffset)
		}
		out = append(out, fmt.Sprintf("partition %d at %s of %s", p.Partition, at, end))
	}
	return strings.Join(out, ", ")
}

// effects returns how many times each key was applied.
func (e *env) effects() map[string]int {
	e.t.Helper()
	return countBy(e.t, e.db.Pool, `SELECT key, count(*) FROM effects GROUP BY key`)
}

// inboxKeys returns the keys recorded in the inbox.
func (e *env) inboxKeys() map[string]int {
	e.t.Helper()
	return countBy(e.t, e.db.Pool, `SELECT idempotency_key, count(*) FROM inbox GROUP BY idempotency_key`)
}

func countBy(t testing.TB, pool *pgxpool.Pool, sql string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := make(map[string]int)
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// deadLetters returns every message in the dead-letter topic.
func (e *env) deadLetters() []kafka.Message {
	e.t.Helper()
	var out []kafka.Message
	for p := range e.partitions {
		out = append(out, e.kafka.ReadAll(e.t, dlqTopic, p)...)
	}
	return out
}

// retryLogs returns the log records of the retries of the message whose idempotency key is key: the
// records with an attempt and a delay that name the key (in a test with no database outage).
func (e *env) retryLogs(key string) []testlog.Record {
	var out []testlog.Record
	for _, r := range e.logs.All() {
		_, attempt := r.Attrs["attempt"]
		_, delay := r.Attrs["delay"]
		if attempt && delay && r.Has(key) {
			out = append(out, r)
		}
	}
	return out
}

func outcomes(config consumer.Config, outcome string) float64 {
	return testutil.ToFloat64(config.Metrics.Messages.WithLabelValues(topic, outcome))
}

// lazyPool is a pool that never connects, for tests that need one only to exist.
func lazyPool(t testing.TB) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// routeConcurrency is Route.Concurrency's default, the tests' routes'.
const routeConcurrency = 4

// routePaused is the route_paused gauge of the test route, for reason.
func routePaused(config consumer.Config, reason string) float64 {
	return testutil.ToFloat64(config.Metrics.Paused.WithLabelValues(topic, reason))
}
