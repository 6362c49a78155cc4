package main_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestSlowProvider: an SMS gateway that takes 6s to answer each request, slower than the 5s the
// sender used to allow whatever the settings said, is called once per key under an
// SMS_PROVIDER_TIMEOUT above its pace, and each SMS it accepted is recorded; the route never looks
// paused. Before SMS_PROVIDER_TIMEOUT, each call timed out, was never recorded, and was made again
// and again once its lease expired.
func TestSlowProvider(t *testing.T) {
	t.Parallel()
	cluster := startBroker(t, 2, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)
	const delay = 6 * time.Second
	provider.SetHook(func(notifytest.Request) notifytest.Reply { return notifytest.Reply{Delay: delay} })

	w := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=slow-provider",
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"SMS_PROVIDER_TIMEOUT=12s",
		"HTTP_ADDR=127.0.0.1:0",
	}, "run")
	const n = 4
	for i := range n {
		produce(t, cluster.Addr, topicSMS, sms(fmt.Sprintf("slow-%d", i), fmt.Sprintf("+861380013800%d", i)))
	}
	eventually(t, func() string {
		if got := countAllNotifications(t, db.Pool); got != n {
			return fmt.Sprintf("%d of %d SMS recorded", got, n)
		}
		return ""
	})
	for i := range n {
		key := fmt.Sprintf("slow-%d", i)
		if calls := provider.Calls(key); calls != 1 {
			t.Errorf("the provider got %d requests for %s, want 1", calls, key)
		}
	}
	paused := gauges(scrape(t, w.httpAddr()), "inboxworker_route_paused")
	if len(paused) == 0 {
		t.Error("no inboxworker_route_paused series")
	}
	for labels, v := range paused {
		if v != 0 {
			t.Errorf("route_paused%s = %v for a provider that answers every request", labels, v)
		}
	}
	w.signal(syscall.SIGTERM)
	if code := w.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}
