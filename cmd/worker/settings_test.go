package main_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestRunSettings runs `worker run` with the topics, the dead-letter suffix, the inbox retentions
// and the batch size set, and no SMS provider, and checks that each setting is used, not only
// parsed: the messages are read from the named topics, a dead letter goes to topic + DLQ_SUFFIX,
// each key is remembered for its retention, BATCH_SIZE=1 applies each message in a transaction of
// its own, and the SMS are only logged, with a warning at start.
func TestRunSettings(t *testing.T) {
	t.Parallel()
	const pay, sms2 = "shop.payments", "shop.sms"
	cluster := startBroker(t, 1, pay, sms2, pay+".dead", sms2+".dead")
	db := pgtest.Schema(t)
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=settings",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"TOPIC_PAYMENTS=" + pay,
		"TOPIC_SMS=" + sms2,
		"DLQ_SUFFIX=.dead",
		"INBOX_RETENTION_PAYMENTS=1h",
		"INBOX_RETENTION_SMS=2h",
		"BATCH_SIZE=1",
	}, "run")
	if l := p.waitLog("SMS_PROVIDER_URL is unset: SMS are written to the log, not sent"); l["level"] != "WARN" {
		t.Errorf("the missing SMS provider is logged at %v, want WARN", l["level"])
	}
	base := p.httpAddr()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})

	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status) VALUES
		('S-1', 'u-1', 10.00, 'CNY', 'PENDING'), ('S-2', 'u-2', 20.00, 'CNY', 'PENDING'),
		('S-3', 'u-3', 30.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	// One write, one partition: a worker free to batch would apply them in one transaction.
	produce(t, cluster.Addr, pay,
		payment("ps-1", "S-1", "T-1", "10.00", "SUCCESS"),
		payment("ps-2", "S-2", "T-2", "20.00", "SUCCESS"),
		payment("ps-3", "S-3", "T-3", "30.00", "SUCCESS"))
	produce(t, cluster.Addr, sms2, sms("ss-1", "+8613800138000"), sms("ss-bad", "8613800138000"))
	eventually(t, func() string {
		if n := committedTotal1(t, cluster, "settings", pay) + committedTotal1(t, cluster, "settings", sms2); n != 5 {
			return fmt.Sprintf("%d of 5 offsets committed", n)
		}
		return ""
	})

	// Each key is remembered for its handler's retention, to the microsecond. xmin tells the
	// transactions apart.
	rows, err := db.Pool.Query(ctx, `SELECT idempotency_key, (expires_at - processed_at)::text, xmin::text FROM inbox ORDER BY idempotency_key`)
	if err != nil {
		t.Fatal(err)
	}
	retention := map[string]string{}
	transactions := map[string]bool{}
	for rows.Next() {
		var key, kept, xmin string
		if err := rows.Scan(&key, &kept, &xmin); err != nil {
			t.Fatal(err)
		}
		retention[key] = kept
		if strings.HasPrefix(key, "ps-") {
			transactions[xmin] = true
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ps-1": "01:00:00", "ps-2": "01:00:00", "ps-3": "01:00:00", "ss-1": "02:00:00"}
	if fmt.Sprint(retention) != fmt.Sprint(want) {
		t.Errorf("keys kept for %v, want %v", retention, want)
	}
	if len(transactions) != 3 {
		t.Errorf("the 3 callbacks were applied in %d transactions, want one each (BATCH_SIZE=1)", len(transactions))
	}
	var sent int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE idempotency_key = 'ss-1' AND status = 'SENT'`).Scan(&sent); err != nil || sent != 1 {
		t.Errorf("the logged SMS: %d notifications (%v), want 1", sent, err)
	}
	logged := false
	for _, l := range p.allLogs() {
		id, _ := l["provider_message_id"].(string)
		logged = logged || l["msg"] == "sms accepted by the provider" && strings.HasPrefix(id, "log-") &&
			strings.Contains(fmt.Sprint(l["sms"]), "ss-1")
	}
	if !logged {
		t.Error("the SMS was not logged by the log-only provider")
	}

	dead := cluster.ReadAll(t, sms2+".dead", 0)
	if len(dead) != 1 || kafkatest.Header(dead[0], "dlq-original-topic") != sms2 || kafkatest.Header(dead[0], "dlq-reason") != "invalid_payload" {
		t.Errorf("dead letters in %s.dead: %d, want the bad SMS as invalid_payload", sms2, len(dead))
	}
	if n := len(cluster.ReadAll(t, pay+".dead", 0)); n != 0 {
		t.Errorf("%d dead letters in %s.dead, want none", n, pay)
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	_, lines := p.output()
	for _, l := range lines {
		if strings.Contains(l, "13800138000") {
			t.Errorf("a full phone number in the logs: %s", l)
		}
	}
}

func committedTotal1(t *testing.T, cluster *kafkatest.Cluster, group, topic string) int64 {
	return max(0, cluster.CommittedOffset(t, group, topic, 0))
}
