package inbox_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestPurgeMillionRows measures what purging a large backlog of expired keys costs the claims that
// run meanwhile. It inserts INBOX_PURGE_ROWS expired keys (1,000,000 by default), then purges them
// once per batch size in INBOX_PURGE_BATCH (a comma-separated list; the default batch size by
// default) while a goroutine keeps processing new messages, and reports the purge's time and rate
// and the claims' latency, next to the claims' latency without a purge. It takes about a minute, so
// it runs only when INBOX_PURGE_MEASURE is set:
//
//	INBOX_PURGE_MEASURE=1 go test -run TestPurgeMillionRows -v -timeout 30m ./internal/inbox
func TestPurgeMillionRows(t *testing.T) {
	if os.Getenv("INBOX_PURGE_MEASURE") == "" {
		t.Skip("set INBOX_PURGE_MEASURE=1 to measure purging a million expired keys")
	}
	rows := envInt(t, "INBOX_PURGE_ROWS", 1_000_000)
	var batchSizes []int
	for _, s := range strings.Split(cmp.Or(os.Getenv("INBOX_PURGE_BATCH"), "0"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("INBOX_PURGE_BATCH: %v", err)
		}
		batchSizes = append(batchSizes, n)
	}
	ctx := context.Background()
	e := setup(t, inbox.Config{})

	baseline := claimLatencies(t, e.store, "baseline", func(n int, _ time.Duration) bool { return n < 5000 })
	t.Logf("claims without a purge: %s", baseline)

	for _, batchSize := range batchSizes {
		start := time.Now()
		e.exec(t, `
			INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset",
			                   processed_at, expires_at)
			SELECT 'payments', 'expired-' || i, sha256(i::text::bytea), 'payments.callbacks', i % 12, i,
			       now() - interval '5 days' + i * interval '100 ms',
			       now() - interval '2 days' + i * interval '100 ms'
			FROM generate_series(1, $1::int) AS i`, rows)
		e.exec(t, `VACUUM ANALYZE inbox`)
		t.Logf("inserted and vacuumed %d expired keys in %s", rows, time.Since(start).Round(time.Millisecond))

		store := e.newStore(t, e.pool, inbox.Config{PurgeBatchSize: batchSize, Logger: testlog.New(t)})
		purged := make(chan struct{})
		claims := make(chan latencies, 1)
		go func() {
			claims <- claimLatencies(t, store, fmt.Sprintf("during-%d", batchSize), func(int, time.Duration) bool {
				select {
				case <-purged:
					return false
				default:
					return true
				}
			})
		}()
		before := e.serverActivity(t)
		start = time.Now()
		deleted, err := store.Purge(ctx)
		took := time.Since(start)
		close(purged)
		during := <-claims
		after := e.serverActivity(t)
		if err != nil || deleted != int64(rows) {
			t.Fatalf("Purge = %d, %v; want %d", deleted, err, rows)
		}
		label := "default"
		if batchSize > 0 {
			label = strconv.Itoa(batchSize)
		}
		t.Logf("batch size %s: purged %d keys in %s (%.0f keys/s); claims during the purge: %s",
			label, deleted, took.Round(time.Millisecond),
			float64(deleted)/took.Seconds(), during)
		t.Logf("during the purge: %d MB of WAL written, %d checkpoints started; load average %s",
			(after.wal-before.wal)>>20, after.checkpoints-before.checkpoints, loadAverage())
	}
}

// latencies are the durations of a run of claims.
type latencies []time.Duration

func (l latencies) String() string {
	if len(l) == 0 {
		return "none"
	}
	s := slices.Sorted(slices.Values(l))
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("%d claims, p50 %s, p99 %s, max %s", len(s), at(0.50).Round(time.Microsecond),
		at(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}

// claimLatencies processes new messages one after another, with an effect that does nothing, for
// as long as more(claims so far, time so far) says, and returns how long each took.
func claimLatencies(t *testing.T, store *inbox.Store, prefix string, more func(int, time.Duration) bool) latencies {
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	var out latencies
	start := time.Now()
	for i := 0; more(i, time.Since(start)); i++ {
		begin := time.Now()
		outcome, err := store.Process(ctx, message(prefix+"-"+strconv.Itoa(i)), noop)
		out = append(out, time.Since(begin))
		if err != nil || outcome != inbox.Applied {
			t.Errorf("claim %d: %q, %v", i, outcome, err)
			break
		}
	}
	return out
}

// serverActivity is a snapshot of the server's WAL position and checkpoint count: claims stall on
// a checkpoint's fsyncs, whoever wrote the WAL that caused it.
type serverActivity struct{ wal, checkpoints int64 }

func (e *testEnv) serverActivity(t *testing.T) serverActivity {
	var a serverActivity
	err := e.db.Pool.QueryRow(context.Background(), `
		SELECT pg_current_wal_lsn() - '0/0', checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).
		Scan(&a.wal, &a.checkpoints)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// loadAverage is the machine's 1-, 5- and 15-minute load, when the system tells.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}
