package main_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// TestReplayDeadLetters runs `worker run`, which dead-letters a payment callback for an order that
// does not exist yet (unknown_order, once RETRY_MAX_ELAPSED is spent). Once the order exists, `worker
// replay` puts the callback back with its headers, so the worker applies it under its
// Idempotency-Key header (not the event_id of its JSON): the order is PAID once. A second replay
// skips it, as replayed before; one told --again puts it back, a duplicate for the inbox that changes
// nothing.
func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := embeddedEnvironment(t)
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + env.brokers,
		"KAFKA_GROUP_ID=replay-e2e",
		"KAFKA_SESSION_TIMEOUT=" + env.sessionTimeout,
		"DATABASE_URL=" + env.databaseURL,
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"RETRY_MAX_INTERVAL=50ms",
		"RETRY_MAX_ELAPSED=300ms",
		"SHUTDOWN_TIMEOUT=10s",
		"STARTUP_TIMEOUT=" + env.startupTimeout,
	}, "run")
	base := p.httpAddr()

	callback := payment("evt-r1", "R-1", "T-R1", "10.00", "SUCCESS")
	callback.Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte("cb-r1")}}
	produce(t, env.brokers, topicPayments, callback)
	dlq := topicPayments + ".dlq"
	eventually(t, func() string {
		if got := deadLetters(t, env.brokers, dlq); len(got) != 1 || got[0].reason != "unknown_order" {
			return fmt.Sprintf("dead letters of %s: %+v, want one unknown_order", dlq, got)
		}
		return ""
	})

	// The cause is fixed: the order service has created the order.
	if _, err := env.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ('R-1', 'u-1', 10.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	replay := func(extra ...string) string {
		t.Helper()
		r := startWorker(t, []string{"KAFKA_BROKERS=" + env.brokers, "DATABASE_URL=" + env.databaseURL,
			"STARTUP_TIMEOUT=" + env.startupTimeout},
			append([]string{"replay", dlq, "--reason", "unknown_order"}, extra...)...)
		if code := r.wait(); code != 0 {
			t.Fatalf("worker replay: exit code %d", code)
		}
		stdout, _ := r.output()
		return stdout
	}
	stdout := replay()
	if !strings.Contains(stdout, "reason=unknown_order to="+topicPayments+" key=cb-r1\n") ||
		!strings.HasSuffix(stdout, "replayed 1, skipped 0 from "+dlq+"\n") {
		t.Errorf("worker replay printed:\n%s", stdout)
	}
	eventually(t, func() string {
		if n := messagesTotal(scrape(t, base))[topicPayments]["applied"]; n != 1 {
			return fmt.Sprintf("%v callbacks applied, want the replayed one", n)
		}
		return ""
	})
	checkPaidOnce(t, env.pool)

	// A second replay skips the letter it put back; told --again, it puts it back a second time.
	if stdout := replay(); !strings.HasSuffix(stdout, "replayed 0, skipped 1 ((replayed before; --again replays them) 1) from "+dlq+"\n") {
		t.Errorf("a second worker replay printed:\n%s", stdout)
	}
	replay("--again")
	eventually(t, func() string {
		if n := messagesTotal(scrape(t, base))[topicPayments]["duplicate"]; n != 1 {
			return fmt.Sprintf("%v duplicates, want the callback replayed a second time", n)
		}
		return ""
	})
	checkPaidOnce(t, env.pool)
	if got := deadLetters(t, env.brokers, dlq); len(got) != 1 {
		t.Errorf("%d dead letters, want the one first written: a replay is not dead-lettered again", len(got))
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("worker run: exit code %d after SIGTERM, want 0", code)
	}
}

// checkPaidOnce checks that order R-1 is PAID by T-R1 with one payment and one inbox row, both
// under the callback's Idempotency-Key header, and no anomaly.
func checkPaidOnce(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var order, paymentKeys, inboxKeys string
	var anomalies int
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT status || ' ' || coalesce(provider_txn_id, '') FROM orders WHERE order_no = 'R-1'),
		(SELECT coalesce(string_agg(idempotency_key, ','), '') FROM payments),
		(SELECT coalesce(string_agg(idempotency_key, ','), '') FROM inbox),
		(SELECT count(*) FROM payment_anomalies)`).Scan(&order, &paymentKeys, &inboxKeys, &anomalies)
	if err != nil {
		t.Fatal(err)
	}
	if order != "PAID T-R1" || paymentKeys != "cb-r1" || inboxKeys != "cb-r1" || anomalies != 0 {
		t.Errorf("order R-1 %q, payments by key %q, inbox keys %q, anomalies %d; want PAID T-R1, one payment "+
			"and one inbox row under cb-r1, no anomaly", order, paymentKeys, inboxKeys, anomalies)
	}
}
