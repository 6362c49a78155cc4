package main_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestOutboxRelayOff runs `worker run` with OUTBOX_RELAY=false, as a team relaying the outbox with
// Debezium does: a callback applied still writes its order event to the outbox table, and the
// worker runs no relay — it never takes the relay's lease, so nothing publishes the event twice —
// and writes the event a row of the table outbox, the shape Debezium's router reads.
func TestOutboxRelayOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := startBroker(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq",
		"payments.events", "payments.events.dlq")
	db := pgtest.Schema(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ('D-1', 'u-1', 10.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=relay-off",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_RELAY=false",
	}, "run")
	base := p.httpAddr()
	produce(t, cluster.Addr, topicPayments, payment("evt-d1", "D-1", "T-D1", "10.00", "SUCCESS"))
	eventually(t, func() string {
		if n := messagesTotal(scrape(t, base))[topicPayments]["applied"]; n != 1 {
			return fmt.Sprintf("%v callbacks applied, want 1", n)
		}
		return ""
	})
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}

	// The event is a row of outbox, the table Debezium's outbox event router reads, with its
	// columns; none is in outbox_batches, which only the worker's relay reads.
	var events, emissions, leases int
	if err := db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox WHERE aggregatetype = 'order' AND aggregateid = 'D-1' AND type = 'order.paid'
			AND payload->>'order_no' = 'D-1'),
		(SELECT count(*) FROM outbox_batches),
		(SELECT count(*) FROM outbox_relay_lease)`).Scan(&events, &emissions, &leases); err != nil {
		t.Fatal(err)
	}
	if events != 1 || emissions != 0 {
		t.Errorf("%d order.paid rows of order D-1 in outbox and %d rows in outbox_batches, want 1 and 0: "+
			"the event written a row in the router's shape, for another relay", events, emissions)
	}
	if leases != 0 {
		t.Errorf("%d rows in outbox_relay_lease: the worker ran its relay though OUTBOX_RELAY=false", leases)
	}
	for _, l := range p.allLogs() {
		if msg := fmt.Sprint(l["msg"]); strings.HasPrefix(msg, "outbox relay") {
			t.Errorf("logged %q: the worker ran its relay though OUTBOX_RELAY=false", msg)
		}
	}
}
