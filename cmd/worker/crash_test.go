package main_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestSMSCrashAfterProviderAccepted kills the worker (SIGKILL) after the SMS provider has accepted a
// message and before the worker committed it. The next worker sends it again with the same
// Idempotency-Key, so the provider, which honours the key, delivers it once; the notification is
// recorded once.
func TestSMSCrashAfterProviderAccepted(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)

	// The first delivery is held between the provider's acceptance and its answer until released.
	delivered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	provider.SetOnDelivered(func(ctx context.Context, _ notifytest.Request) {
		once.Do(func() { close(delivered) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	})

	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=crash",
		"KAFKA_SESSION_TIMEOUT=500ms", // the dead worker's partitions are handed on quickly
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"SHUTDOWN_TIMEOUT=10s",
	}
	first := startWorker(t, env, "run")
	const key = "sms-crash"
	produce(t, cluster.Addr, topicSMS, sms(key, "+8613800138000"))

	select {
	case <-delivered:
	case <-time.After(waitTimeout):
		t.Fatal("the provider never received the SMS")
	}
	first.signal(syscall.SIGKILL)
	first.wait()
	close(release)
	if n := countNotifications(t, db.Pool, key); n != 0 {
		t.Fatalf("%d notifications committed by the killed worker, want 0", n)
	}

	second := startWorker(t, env, "run")
	eventually(t, func() string {
		if countNotifications(t, db.Pool, key) != 1 {
			return "the second worker did not record the notification"
		}
		return ""
	})
	second.signal(syscall.SIGTERM)
	if code := second.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}

	if calls := provider.Calls(key); calls != 2 {
		t.Errorf("the provider got %d requests with key %s, want 2 (the send and the resend)", calls, key)
	}
	if n := len(provider.Delivered()); n != 1 {
		t.Errorf("the provider delivered %d messages, want 1", n)
	}
	var messageID string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT provider_message_id FROM notifications WHERE idempotency_key = $1`, key).Scan(&messageID)
	if err != nil {
		t.Fatal(err)
	}
	if messageID != provider.MessageID(key) {
		t.Errorf("recorded provider message id %q, the provider's is %q", messageID, provider.MessageID(key))
	}
	if committed := cluster.CommittedOffset(t, "crash", topicSMS, 0); committed != 1 {
		t.Errorf("committed offset %d, want 1", committed)
	}
}

func countNotifications(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE idempotency_key = $1`, key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
