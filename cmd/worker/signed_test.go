package main_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/signature"
)

// TestSignedCallbackReplayed runs `worker run` with PAYMENT_SIGNATURE=standard-webhooks. A callback
// the provider signed, produced by the receiver an hour ago for an order that does not exist yet, is
// dead-lettered unknown_order; a forged one bad_signature. Once the order exists, `worker replay`
// puts the signed one back with its original record timestamp: it verifies as it did an hour ago,
// and pays the order, naming the key. The forged one, replayed too, is refused again.
func TestSignedCallbackReplayed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := embeddedEnvironment(t)
	secret := []byte("the-provider-webhook-secret-2026")
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + env.brokers,
		"KAFKA_GROUP_ID=signed-e2e",
		"KAFKA_SESSION_TIMEOUT=" + env.sessionTimeout,
		"DATABASE_URL=" + env.databaseURL,
		"HTTP_ADDR=127.0.0.1:0",
		"SHUTDOWN_TIMEOUT=10s",
		"STARTUP_TIMEOUT=" + env.startupTimeout,
		"PAYMENT_SIGNATURE=standard-webhooks",
		"PAYMENT_SIGNING_KEYS=prov-2026:whsec_" + base64.StdEncoding.EncodeToString(secret),
		"RETRY_INITIAL_INTERVAL=10ms", "RETRY_MAX_INTERVAL=50ms", "RETRY_MAX_ELAPSED=500ms", "RETRY_PARK_AFTER=100ms",
	}, "run")
	base := p.httpAddr()

	produced := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	sign := func(m kafka.Message, id string, key []byte) kafka.Message {
		m.Time = produced
		m.Headers = []kafka.Header{
			{Key: "webhook-id", Value: []byte(id)},
			{Key: "webhook-timestamp", Value: []byte(strconv.FormatInt(produced.Unix(), 10))},
			{Key: "webhook-signature", Value: []byte(signature.Sign(key, id, produced.Unix(), m.Value))},
		}
		return m
	}
	produce(t, env.brokers, topicPayments,
		sign(payment("evt-s1", "S-1", "T-S1", "10.00", "SUCCESS"), "msg_s1", secret),
		sign(payment("evt-s2", "S-2", "T-S2", "10.00", "SUCCESS"), "msg_s2", []byte("somebody-elses-secret-entirely")))
	eventually(t, func() string {
		families := scrape(t, base)
		if outcomes := messagesTotal(families)[topicPayments]; outcomes["dead_lettered"] != 2 {
			return fmt.Sprintf("outcomes %v, want both dead-lettered", outcomes)
		}
		return ""
	})
	if p.findLog("payment callbacks are verified (Standard Webhooks)", "keys", "prov-2026") == nil {
		t.Error("no line at start says the callbacks are verified, and by which keys")
	}
	if _, stderr := p.output(); strings.Contains(strings.Join(stderr, "\n"), base64.StdEncoding.EncodeToString(secret)) {
		t.Error("the log shows the signing secret")
	}

	for _, orderNo := range []string{"S-1", "S-2"} {
		if _, err := env.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency) VALUES ($1, 'u', 10.00, 'CNY')`,
			orderNo); err != nil {
			t.Fatal(err)
		}
	}
	r := startWorker(t, []string{"KAFKA_BROKERS=" + env.brokers, "DATABASE_URL=" + env.databaseURL,
		"STARTUP_TIMEOUT=" + env.startupTimeout}, "replay", topicPayments+".dlq")
	if code := r.wait(); code != 0 {
		t.Fatalf("worker replay: exit code %d", code)
	}
	eventually(t, func() string {
		if n := committedTotal(t, env.brokers, "signed-e2e", topicPayments); n != 4 {
			return fmt.Sprintf("%d offsets committed, want 4: the two callbacks and their replays", n)
		}
		return ""
	})
	var got string
	err := env.pool.QueryRow(ctx, `
		SELECT string_agg(o.order_no || ' ' || o.status || coalesce(' by ' || p.verified_by, ''), ', ' ORDER BY o.order_no)
		FROM orders o LEFT JOIN payments p USING (order_no) WHERE o.order_no IN ('S-1', 'S-2')`).Scan(&got)
	if want := "S-1 PAID by prov-2026, S-2 PENDING"; err != nil || got != want {
		t.Errorf("orders: %q (%v), want %q", got, err, want)
	}
	var failures float64
	for _, m := range scrape(t, base)["inboxworker_signature_failures_total"].GetMetric() {
		failures += m.GetCounter().GetValue()
	}
	if failures != 2 {
		t.Errorf("%v signature failures, want 2: the forged callback and its replay", failures)
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("worker run: exit code %d after SIGTERM, want 0", code)
	}
}
