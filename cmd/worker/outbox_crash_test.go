package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/outbox"
	paymentevents "github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestOutboxCrash runs 2,000 payment callbacks (1,000 orders, half of them with a FAILED attempt
// before the payment, and 500 redeliveries) through two worker processes, and kills the one whose
// relay holds the outbox lease (SIGKILL) twice while the stream flows, starting another each time.
// On the events topic then: every paid order has its order.paid, every failed attempt its
// payment.failed, each with the id derived from its provider transaction, and nothing else; each
// order's events in order (a failed attempt before the payment), counting each id at its first
// appearance; an event appears more than once only with the same id. The time from each kill to
// the next holder taking the lease is logged. It runs with the workers connected to Postgres
// directly and through PgBouncer in transaction mode, where a killed worker's transactions end on
// server connections that go on serving the others.
func TestOutboxCrash(t *testing.T) {
	t.Parallel()
	directAndPooled(t, testOutboxCrash)
}

// testOutboxCrash is TestOutboxCrash with the workers reaching db at databaseURL.
func testOutboxCrash(t *testing.T, db *pgtest.DB, databaseURL string) {
	const parts, orders = 4, 1000
	const eventsTopic = "payments.events"
	cluster := kafkatest.Start(t, parts, topicPayments, topicPayments+".dlq", topicSMS, topicSMS+".dlq",
		eventsTopic, eventsTopic+".dlq")
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency)
		SELECT 'X-' || i, 'u', 10.00, 'CNY' FROM generate_series(1, $1) AS i`, orders); err != nil {
		t.Fatal(err)
	}
	// The stream: per order, a FAILED attempt first for every other order, then the payment; every
	// other payment delivered twice.
	var msgs []kafka.Message
	want := map[string][]string{} // by order: its event ids, in order
	for i := 1; i <= orders; i++ {
		orderNo := fmt.Sprintf("X-%d", i)
		if i%2 == 0 {
			msgs = append(msgs, payment("f-"+orderNo, orderNo, "TF-"+orderNo, "10.00", "FAILED"))
			want[orderNo] = append(want[orderNo], outbox.EventID(paymentevents.EventPaymentFailed, paymentevents.EventCause("wechat", "TF-"+orderNo)))
		}
		paid := payment("p-"+orderNo, orderNo, "TP-"+orderNo, "10.00", "SUCCESS")
		msgs = append(msgs, paid)
		if i%2 == 1 {
			msgs = append(msgs, paid)
		}
		want[orderNo] = append(want[orderNo], outbox.EventID(paymentevents.EventOrderPaid, paymentevents.EventCause("wechat", "TP-"+orderNo)))
	}
	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=outbox-crash",
		"KAFKA_SESSION_TIMEOUT=1s",
		"DATABASE_URL=" + databaseURL,
		"HTTP_ADDR=127.0.0.1:0",
		"TOPIC_PAYMENT_EVENTS=" + eventsTopic,
		"LOG_LEVEL=info",
		"SHUTDOWN_TIMEOUT=10s",
	}
	workers := []*process{startWorker(t, env, "run"), startWorker(t, env, "run")}
	all := append([]*process(nil), workers...) // the killed ones too

	// The lease's holder names its process: "outbox relay on <host>, pid <pid>, <random>".
	holder := func() (string, int64) {
		var h string
		var epoch int64
		if err := db.Pool.QueryRow(ctx, `SELECT holder, epoch FROM outbox_relay_lease`).Scan(&h, &epoch); err != nil {
			return "", 0
		}
		return h, epoch
	}
	published := func() int {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events) - (SELECT count(*) FROM outbox_waiting)`).Scan(&n)
		return n
	}
	chunk := len(msgs) / 3
	var failovers []time.Duration
	for kill := range 2 {
		produce(t, cluster.Addr, topicPayments, msgs[kill*chunk:(kill+1)*chunk]...)
		eventually(t, func() string {
			if n := published(); n < (kill+1)*chunk/3 {
				return fmt.Sprintf("%d events published before kill %d", n, kill+1)
			}
			return ""
		})
		h, epoch := holder()
		victim := -1
		for i, w := range workers {
			if w != nil && strings.Contains(h, fmt.Sprintf(", pid %d, ", w.cmd.Process.Pid)) {
				victim = i
			}
		}
		if victim < 0 {
			t.Fatalf("no worker holds the relay's lease, held by %q", h)
		}
		killed := time.Now()
		workers[victim].signal(syscall.SIGKILL)
		workers[victim].wait()
		workers[victim] = startWorker(t, env, "run")
		all = append(all, workers[victim])
		eventually(t, func() string {
			if h2, e2 := holder(); e2 <= epoch || h2 == h {
				return fmt.Sprintf("the lease is still epoch %d of %s, whose process was killed", e2, h)
			}
			return ""
		})
		failovers = append(failovers, time.Since(killed))
	}
	produce(t, cluster.Addr, topicPayments, msgs[2*chunk:]...)
	eventually(t, func() string {
		if n := committedOn(t, cluster.Addr, "outbox-crash", topicPayments, parts); n != int64(len(msgs)) {
			return fmt.Sprintf("%d of %d callbacks committed", n, len(msgs))
		}
		var waiting int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_waiting`).Scan(&waiting)
		if waiting != 0 {
			return fmt.Sprintf("%d events waiting", waiting)
		}
		return ""
	})
	// Each callback applied once: every order paid, a payments row per attempt, no dead letter.
	var paid, attempts int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE status = 'PAID'),
		(SELECT count(*) FROM payments)`).Scan(&paid, &attempts); err != nil {
		t.Fatal(err)
	}
	if paid != orders || attempts != orders+orders/2 {
		t.Errorf("%d orders paid and %d payments rows, want %d and %d", paid, attempts, orders, orders+orders/2)
	}
	if dl := deadLetters(t, cluster.Addr, topicPayments+".dlq"); len(dl) != 0 {
		t.Errorf("%d dead letters, want none: %+v", len(dl), dl[0])
	}
	t.Logf("failover after each kill of the relay's instance (lease 5s, measured up to the lease's new epoch): %v", failovers)

	// Every event, from the topic, in partition order.
	got := map[string][]string{} // by order: the ids as they appear
	total := 0
	for p := range parts {
		for _, m := range cluster.ReadAll(t, eventsTopic, p) {
			var v paymentevents.Event
			if err := json.Unmarshal(m.Value, &v); err != nil {
				t.Fatal(err)
			}
			key := kafkatest.Header(m, "Idempotency-Key")
			if key != v.EventID || string(m.Key) != v.OrderNo {
				t.Errorf("event %s with key %s and Idempotency-Key %s", m.Value, m.Key, key)
			}
			got[v.OrderNo] = append(got[v.OrderNo], v.EventID)
			total++
		}
	}
	distinct := 0
	for orderNo, ids := range want {
		var first []string // the ids in the order of their first appearance
		seen := map[string]bool{}
		for _, id := range got[orderNo] {
			if !seen[id] {
				seen[id] = true
				first = append(first, id)
			}
		}
		distinct += len(first)
		if fmt.Sprint(first) != fmt.Sprint(ids) {
			t.Errorf("order %s: events %v (first appearances %v), want %v", orderNo, got[orderNo], first, ids)
		}
	}
	if len(got) != len(want) {
		t.Errorf("events of %d orders, want %d", len(got), len(want))
	}
	t.Logf("%d events on the topic, %d distinct: %d published again after the kills, with their ids",
		total, distinct, total-distinct)
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&rows); err != nil || rows != distinct {
		t.Errorf("%d rows in the outbox (%v), %d distinct events on the topic", rows, err, distinct)
	}

	// One relay at a time: no epoch was taken by two processes.
	epochs := map[float64]int{}
	for _, w := range workers {
		w.signal(syscall.SIGTERM)
		if code := w.wait(); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
	}
	for _, w := range all {
		for _, l := range w.allLogs() {
			if l["msg"] == "outbox relay: took the lease; publishing" {
				epochs[l["epoch"].(float64)]++
			}
		}
		// Nothing in this stream, nor a kill of another worker, makes Postgres refuse a statement.
		_, lines := w.output()
		for _, l := range lines {
			if strings.Contains(l, "SQLSTATE") {
				t.Errorf("Postgres refused a statement: %s", l)
			}
		}
	}
	for epoch, n := range epochs {
		if n > 1 {
			t.Errorf("epoch %v taken %d times", epoch, n)
		}
	}
}
