package main_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestKillSwitch breaks the database under a stream of callbacks the ways a DBA can: every write
// refused alike. The route must pause instead of emptying the stream into the dead-letter topic
// (fewer than KILL_SWITCH_AFTER dead letters), say so once in its logs and in route_paused{reason="failing"}, and,
// once the cause is fixed, apply every callback it held, once, without a replay.
func TestKillSwitch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		break_, fix string
		// beforeStart: the break holds only for new sessions, so it is made before the worker
		// opens its own.
		beforeStart bool
		reason      string // route_paused's
		logged      string // the one line that says the route is held
	}{
		// INSERT on the inbox revoked: every claim fails with 42501, a permanent error.
		{name: "PrivilegeRevoked", break_: "REVOKE INSERT ON inbox FROM %s", fix: "GRANT INSERT ON inbox TO %s",
			reason: "failing", logged: "pausing the route: its messages are all refused alike"},
		// The database read-only to every session of the worker's (a failover that left it on a
		// demoted primary): 25006 on every write, an outage waited out, and the sessions keep it
		// after the fix, so they must be dropped, not reused.
		{name: "ReadOnly", break_: "ALTER ROLE %s SET default_transaction_read_only = on",
			fix: "ALTER ROLE %s RESET default_transaction_read_only", beforeStart: true,
			reason: "database", logged: "holding the route: the database does not take its writes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testKillSwitch(t, tt.break_, tt.fix, tt.beforeStart, tt.reason, tt.logged)
		})
	}
}

func testKillSwitch(t *testing.T, breakSQL, fixSQL string, beforeStart bool, reason, logged string) {
	ctx := context.Background()
	const orders = 200
	// Half the default: a worker that ignored the setting would dead-letter up to 9.
	const killSwitchAfter = 5
	cluster := startBroker(t, partitions, topicPayments, topicPayments+".dlq", topicSMS, topicSMS+".dlq")
	db := pgtest.Schema(t)
	role := db.Role(t)
	u, err := url.Parse(pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency)
		SELECT 'K-' || i, 'u', 10.00, 'CNY' FROM generate_series(1, $1) AS i`, orders); err != nil {
		t.Fatal(err)
	}
	breakIt := func() {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(breakSQL, role)); err != nil {
			t.Fatal(err)
		}
	}
	if beforeStart {
		breakIt()
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=kill-switch",
		"KAFKA_SESSION_TIMEOUT=1s",
		"DATABASE_URL=" + u.String(),
		"TOPIC_PAYMENT_EVENTS=-",
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"RETRY_MAX_INTERVAL=100ms",
		"STARTUP_TIMEOUT=30s",
		"KILL_SWITCH_AFTER=" + fmt.Sprint(killSwitchAfter),
	}, "run", "--no-migrate")
	base := p.httpAddr()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})

	if !beforeStart {
		breakIt()
	}
	msgs := make([]kafka.Message, orders)
	for i := range msgs {
		n := fmt.Sprint(i + 1)
		msgs[i] = payment("k-"+n, "K-"+n, "T-"+n, "10.00", "SUCCESS")
	}
	broken := time.Now()
	produce(t, cluster.Addr, topicPayments, msgs...)
	eventually(t, func() string {
		if v := labelled(scrape(t, base), "inboxworker_route_paused", "reason", reason); v < 1 {
			return fmt.Sprintf("route_paused{reason=%s} = %v", reason, v)
		}
		return ""
	})
	tripped := time.Since(broken)
	deadLettered := messagesTotal(scrape(t, base))[topicPayments]["dead_lettered"]
	if deadLettered >= killSwitchAfter {
		t.Errorf("%v dead letters before the route paused, want fewer than KILL_SWITCH_AFTER=%d", deadLettered, killSwitchAfter)
	}
	// Held, not dead-lettered: a while later, still as many.
	time.Sleep(500 * time.Millisecond)
	if n := messagesTotal(scrape(t, base))[topicPayments]["dead_lettered"]; n != deadLettered {
		t.Errorf("%v dead letters while the route is paused, after %v when it paused", n, deadLettered)
	}

	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(fixSQL, role)); err != nil {
		t.Fatal(err)
	}
	fixed := time.Now()
	eventually(t, func() string {
		var paid int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'PAID'`).Scan(&paid); err != nil {
			return err.Error()
		}
		if want := orders - int(deadLettered); paid != want {
			return fmt.Sprintf("%d orders paid, want %d (all but the %v dead-lettered)", paid, want, deadLettered)
		}
		return ""
	})
	resumed := time.Since(fixed)
	var payments, inboxRows int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM inbox)`).
		Scan(&payments, &inboxRows); err != nil {
		t.Fatal(err)
	}
	if want := orders - int(deadLettered); payments != want || inboxRows != want {
		t.Errorf("%d payments and %d inbox rows, want %d of each: each held callback applied once", payments, inboxRows, want)
	}
	if v := labelled(scrape(t, base), "inboxworker_route_paused", "reason", reason); v != 0 {
		t.Errorf("route_paused{reason=%s} = %v after the fix, want 0", reason, v)
	}
	var pauses int
	for _, l := range p.allLogs() {
		if msg, _ := l["msg"].(string); strings.HasPrefix(msg, logged) && l["topic"] == topicPayments {
			pauses++
		}
	}
	if pauses != 1 {
		t.Errorf("%d log lines %q, want 1", pauses, logged)
	}
	t.Logf("%v dead letters; tripped %.1fs after the break; every held callback applied %.1fs after the fix",
		deadLettered, tripped.Seconds(), resumed.Seconds())
}

// labelled is the value of the series of metric name whose label key is value, summed.
func labelled(families map[string]*dto.MetricFamily, name, key, value string) float64 {
	var sum float64
	for _, m := range families[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == key && l.GetValue() == value {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
