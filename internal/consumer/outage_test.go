package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestDatabaseOutage cuts the consumer off Postgres for longer than the retry budget: nothing may be
// dead-lettered, and every message is applied once after the database is back.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	forEachMode(t, testDatabaseOutage)
}

func testDatabaseOutage(t *testing.T, mode testMode) {
	// One partition, one key: the messages after "held" wait behind it, so no other transaction is
	// in flight when the connection is cut.
	e := setup(t, mode, 1)
	proxy, pool, store := e.behindProxy()
	// The handler of "held" waits, its transaction open, until the connection is cut.
	// Only its first run waits: a rebalance under load may run it again from attempt 1.
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce sync.Once
	config := testConfig(e.kafka.Addr, pool, store, &recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "held" {
			holdOnce.Do(func() {
				close(held)
				<-release
			})
		}
		return nil
	}}, mode, e.log)
	config.Retry.MaxElapsed = 100 * time.Millisecond
	e.start(config)

	before := keys("before", 10)
	e.produce(before...)
	e.waitFor("the first messages applied", func() bool { return len(e.effects()) == len(before) })

	during := append([]string{"held"}, keys("during", 20)...)
	e.produceOrdered("order-held", during...)
	<-held
	cut := time.Now()
	proxy.Cut()
	close(release)
	// The worker keeps trying the database: wait for that evidence (each refused connection is a
	// try), and for the retry budget to have run out several times over, were the outage counted
	// against it.
	const tries = 60
	e.waitFor(fmt.Sprintf("%d connections refused during the outage", tries), func() bool {
		return proxy.Refused() >= tries && time.Since(cut) > 3*config.Retry.MaxElapsed
	})
	t.Logf("%d connections refused in %v", proxy.Refused(), time.Since(cut))
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Fatalf("%d messages dead-lettered during the outage", len(dead))
	}
	if got := len(e.effects()); got != len(before) {
		t.Fatalf("%d messages applied while the database was unreachable", got-len(before))
	}
	proxy.Restore()

	all := append(before, during...)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	checkOnce(t, e, all)
	if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != 0 {
		t.Errorf("%v retries counted: waiting for the database is no retry of a message", got)
	}
	if got := outcomes(config, "dead_lettered"); got != 0 {
		t.Errorf("%v messages dead-lettered during the outage, want none", got)
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}

// behindProxy returns a proxy in front of the test's database, and a pool and an inbox store that
// reach the database through it, closed when the test ends.
func (e *env) behindProxy() (*pgtest.Proxy, *pgxpool.Pool, *inbox.Store) {
	e.t.Helper()
	proxy := pgtest.StartProxy(e.t, e.db.URL)
	pool, err := pgxpool.New(context.Background(), proxy.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, inbox.Config{Logger: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	return proxy, pool, store
}

// TestNoTransactionWhileWaiting checks that nothing is held open while a message waits for its
// retry: during the wait, no session of the consumer's pool is idle in a transaction.
func TestNoTransactionWhileWaiting(t *testing.T) {
	t.Parallel()
	forEachMode(t, testNoTransactionWhileWaiting)
}

func testNoTransactionWhileWaiting(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	poolConfig, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	app := "consumer_test_" + e.db.Schema // the consumer's sessions, told apart in pg_stat_activity
	poolConfig.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), poolConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, inbox.Config{Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	// Long enough a wait to look at the sessions during it, on a loaded machine too; checked below.
	const retryAfter = 3 * time.Second
	var attempts atomic.Int64
	config := testConfig(e.kafka.Addr, pool, store, &recorder{fail: func(d inbox.Delivery) error {
		if attempts.Add(1) == 1 {
			return &fault.Error{Kind: fault.KindRetryable, RetryAfter: retryAfter, Err: errors.New("try later")}
		}
		return nil
	}}, mode, e.log)
	e.start(config)
	e.produce("waits")

	e.waitFor("the retry to be logged", func() bool { return len(e.retryLogs("waits")) == 1 })
	var open []string
	rows, err := e.db.Pool.Query(context.Background(), `SELECT state || ': ' || query FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app)
	if err != nil {
		t.Fatal(err)
	}
	open, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if attempts.Load() != 1 {
		t.Fatalf("the retry ran before the sessions were read: the check came too late to mean anything")
	}
	if len(open) != 0 {
		t.Errorf("while the message waits for its retry, the consumer holds transactions open: %q", open)
	}
	e.waitFor("the message applied", func() bool { return e.committed() == 1 })
	checkOnce(t, e, []string{"waits"})
}

// TestDatabaseOutageBeforeBatch cuts the database before any message arrives, so that the first
// statement to fail is the crash-loop guard's record of the batch: the outage must not be counted
// as a start, nor dead-letter anything, and every message is applied once after it.
func TestDatabaseOutageBeforeBatch(t *testing.T) {
	t.Parallel()
	forEachMode(t, testDatabaseOutageBeforeBatch)
}

func testDatabaseOutageBeforeBatch(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	proxy, pool, store := e.behindProxy()
	config := testConfig(e.kafka.Addr, pool, store, &recorder{}, mode, e.log)
	config.Retry.MaxElapsed = 100 * time.Millisecond
	e.start(config)
	// A first message applied: the partition is consuming, its guard's lookup done.
	e.produce("first")
	e.waitFor("the first message committed", func() bool { return e.committed() == 1 })

	cut := time.Now()
	proxy.Cut()
	held := []string{"held"} // alone in its batch: the case where starts decide a dead letter
	e.produce(held...)
	all := append([]string{"first"}, held...)
	const tries = 60
	e.waitFor(fmt.Sprintf("%d connections refused during the outage", tries), func() bool {
		return proxy.Refused() >= tries && time.Since(cut) > 3*config.Retry.MaxElapsed
	})
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Fatalf("%d messages dead-lettered during the outage (%s)", len(dead), kafkatest.Header(dead[0], "dlq-reason"))
	}
	proxy.Restore()

	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	checkOnce(t, e, all)
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	var starts int
	err := e.db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(starts), 0) FROM inbox_attempts`).Scan(&starts)
	if err != nil {
		t.Fatal(err)
	}
	if starts > 1 {
		t.Errorf("a batch is recorded as started %d times: the outage was counted as deaths", starts)
	}
}
