package main_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// What a refused offset commit is expected to look like from outside. The names are the ones the
// operations work settles on; align them here if it settles otherwise.
const (
	// commitFailuresMetric counts the offset commits that failed, from 0 at start.
	commitFailuresMetric = "inboxworker_offset_commit_failures_total"
	// commitFailureLog is the message of the log entry of a failed commit; its error attribute
	// carries the broker's error.
	commitFailureLog = "cannot commit the offset; messages from the last commit on will be delivered again"
	// commitFailureSetting is how long commits must fail without a success in between before
	// /readyz answers 503.
	commitFailureSetting = "OFFSET_COMMIT_FAILURE_TIMEOUT"
	commitFailureTimeout = 2 * time.Second
)

// TestRefusedOffsetCommit runs `worker run` against a broker (Kafka 4.1's protocol floor) that
// starts refusing OffsetCommit while callbacks keep arriving: answered GROUP_AUTHORIZATION_FAILED
// (30), as a broker refuses a group the client may not commit to, then with the connection closed,
// as a 4.x broker answers a version it no longer serves. Each time the worker logs the failure with
// the cause, counts it in inboxworker_offset_commit_failures_total, and, once commits have failed
// for OFFSET_COMMIT_FAILURE_TIMEOUT without a success, answers /readyz with 503 — not before; once
// the broker takes commits again, it commits what it applied meanwhile and is ready again. It never
// leaves its group for it.
func TestRefusedOffsetCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := kafkatest.StartKafka41(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ('C-1', 'u-1', 10.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=commit-refused",
		"KAFKA_SESSION_TIMEOUT=1s",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
		commitFailureSetting + "=" + commitFailureTimeout.String(),
		"SHUTDOWN_TIMEOUT=10s",
		"STARTUP_TIMEOUT=10s",
	}, "run")
	base := p.httpAddr()
	if n, ok := commitFailures(t, base); !ok || n != 0 {
		t.Fatalf("%s = %v (present %v) at start, want 0", commitFailuresMetric, n, ok)
	}

	// A failed payment leaves its order PENDING, so every callback of this stream is applied.
	stream := &callbackStream{brokers: cluster.Addr}
	if err := stream.next(); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, cluster, stream.count())
	waitReady(t, base, 200)

	for _, refusal := range []struct {
		name   string
		answer kafkatest.Answer
		cause  string // in the log entry's error
	}{
		{"GroupAuthorizationFailed", kafkatest.CommitError(30), "Group Authorization Failed"},
		{"ConnectionClosed", nil, ""},
	} {
		t.Run(refusal.name, func(t *testing.T) {
			before, _ := commitFailures(t, base)
			seen := len(p.allLogs())
			cluster.Floor.Refuse(8, refusal.answer)
			stop := stream.keep(t)

			entry := awaitEntry(p, "log a failed commit", func() []map[string]any { return p.logs[seen:] },
				func(l map[string]any) bool { return l["msg"] == commitFailureLog })
			if cause, _ := entry["error"].(string); cause == "" || !strings.Contains(cause, refusal.cause) {
				t.Errorf("the failed commit's log entry has error %q, want the broker's %q", cause, refusal.cause)
			}
			// Not ready at the first failure: a commit may fail once in a rebalance.
			if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(entry["time"])); err == nil && time.Since(at) < commitFailureTimeout/2 {
				if code, body := get(t, base+"/readyz"); code != 200 {
					t.Errorf("/readyz %d %q right after the first failed commit, want 200 until commits have failed for %v",
						code, body, commitFailureTimeout)
				}
			}
			eventually(t, func() string {
				if n, _ := commitFailures(t, base); n <= before {
					return fmt.Sprintf("%s = %v, want more than %v", commitFailuresMetric, n, before)
				}
				return ""
			})
			waitReady(t, base, 503)

			cluster.Floor.Allow(8)
			stop()
			waitCommitted(t, cluster, stream.count())
			waitReady(t, base, 200)
			// The membership is the heartbeats': a refused commit, even one whose connection the
			// broker closed, is tried again in the same generation.
			rejoins := 0
			for _, l := range p.allLogs()[seen:] {
				if l["msg"] == "joined a generation of the consumer group" {
					rejoins++
				}
			}
			if rejoins != 0 {
				t.Errorf("the worker joined its group %d times while its commits were refused, want 0", rejoins)
			}
		})
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

// commitFailures returns the sum of inboxworker_offset_commit_failures_total's series, and whether
// there is one.
func commitFailures(t *testing.T, base string) (float64, bool) {
	t.Helper()
	family := scrape(t, base)[commitFailuresMetric]
	var total float64
	for _, m := range family.GetMetric() {
		total += m.GetCounter().GetValue()
	}
	return total, family != nil
}

// callbackStream produces payment callbacks, each under a key of its own, for order C-1.
type callbackStream struct {
	brokers string
	mu      sync.Mutex
	n       int
}

func (s *callbackStream) next() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := fmt.Sprintf("c-%d", s.n+1)
	transport := &kafka.Transport{ClientID: kafkatest.ClientID}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(s.brokers), Transport: transport, Topic: topicPayments,
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, payment(key, "C-1", "T-"+key, "10.00", "FAILED")); err != nil {
		return fmt.Errorf("produce %s: %w", key, err)
	}
	s.n++
	return nil
}

// count is how many callbacks were produced.
func (s *callbackStream) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// keep produces a callback every 200ms until the returned function is called.
func (s *callbackStream) keep(t *testing.T) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := s.next(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-finished }) }
	t.Cleanup(stop)
	return stop
}

func waitCommitted(t *testing.T, cluster *kafkatest.Cluster, n int) {
	t.Helper()
	eventually(t, func() string {
		if got := cluster.CommittedOffset(t, "commit-refused", topicPayments, 0); got != int64(n) {
			return fmt.Sprintf("committed offset %d, want %d", got, n)
		}
		return ""
	})
}

func waitReady(t *testing.T, base string, want int) {
	t.Helper()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != want {
			return fmt.Sprintf("/readyz: %d %q, want %d", code, body, want)
		}
		return ""
	})
}
