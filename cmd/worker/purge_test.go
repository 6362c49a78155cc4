package main_test

import (
	"context"
	"syscall"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestRunPurges checks that `worker run` runs the inbox purger with its defaults: it purges once at
// start (then every 10 minutes), deleting expired keys and keeping the others.
func TestRunPurges(t *testing.T) {
	t.Parallel()
	cluster := startBroker(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ('payments', 'expired-1', '\x00', 'payments.callbacks', 0, 0, now() - interval '1 hour'),
		       ('sms',      'expired-2', '\x00', 'notifications.sms', 0, 0, now() - interval '1 minute'),
		       ('payments', 'kept',      '\x00', 'payments.callbacks', 0, 1, now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=purge",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
	}, "run")
	l := p.waitLog("inbox purged expired keys")
	if deleted, _ := l["deleted"].(float64); deleted != 2 {
		t.Errorf("the purge at start deleted %v keys, want 2: %v", l["deleted"], l)
	}
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT idempotency_key FROM inbox ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		left = append(left, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "kept" {
		t.Errorf("inbox keys after the purge: %v, want [kept]", left)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}
