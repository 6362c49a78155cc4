package main_test

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/busiest"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestRateLimitThroughKill: three workers of one group under SMS_RATE_LIMIT send an SMS stream,
// and one of them is killed (SIGKILL) halfway: the group keeps to the rate before, through and
// after the kill, since the instances book each send's turn in the schedule they share, and the
// dead one's booked turns go unused. Every SMS is delivered, none twice but for the sends the
// dead worker had out. The figures are logged: how close to the rate the busiest second stays
// depends on scheduling as well (docs/benchmarks.md measures it); the test fails at 1.5 × the
// rate, what instances that did not share it would send.
func TestRateLimitThroughKill(t *testing.T) {
	t.Parallel()
	const rate, parts, n = 20, 4, 200
	cluster := kafkatest.Start(t, parts, topicPayments, topicPayments+".dlq", topicSMS, topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)
	var mu sync.Mutex
	var arrivals []time.Time
	provider.SetHook(func(notifytest.Request) notifytest.Reply {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		return notifytest.Reply{}
	})
	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=rate-kill",
		"KAFKA_SESSION_TIMEOUT=2s",
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"SMS_PROVIDER_TIMEOUT=1s", // the dead worker's sends are taken over 2s after the kill
		fmt.Sprintf("SMS_RATE_LIMIT=%d", rate),
		"HTTP_ADDR=127.0.0.1:0",
		"SHUTDOWN_TIMEOUT=10s",
	}
	workers := []*process{startWorker(t, env, "run"), startWorker(t, env, "run"), startWorker(t, env, "run")}
	for _, w := range workers {
		waitReady(t, w.httpAddr(), 200)
	}
	keys := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		keys[i] = fmt.Sprintf("rate-%03d", i)
		msgs[i] = sms(keys[i], fmt.Sprintf("+86139%08d", i))
	}
	produce(t, cluster.Addr, topicSMS, msgs...)
	sent := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(arrivals)
	}
	eventually(t, func() string {
		if got := sent(); got < n/2 {
			return fmt.Sprintf("%d of %d SMS sent before the kill", got, n)
		}
		return ""
	})
	workers[0].signal(syscall.SIGKILL)
	workers[0].wait()
	eventually(t, func() string {
		if got := committedOn(t, cluster.Addr, "rate-kill", topicSMS, parts); got != n {
			return fmt.Sprintf("%d of %d SMS committed", got, n)
		}
		return ""
	})
	for _, key := range keys {
		if calls := provider.Calls(key); calls < 1 {
			t.Errorf("%s: never sent", key)
		}
	}
	if got := countAllNotifications(t, db.Pool); got != n {
		t.Errorf("%d notifications, want %d", got, n)
	}

	mu.Lock()
	defer mu.Unlock()
	most := busiest.Within(arrivals, time.Second)
	if most > rate*3/2 {
		t.Errorf("%d sends within one second, want at most %d: the workers do not share the rate", most, rate*3/2)
	}
	t.Logf("%d sends at SMS_RATE_LIMIT=%d through a SIGKILL, in %s; the busiest second %d", len(arrivals), rate,
		arrivals[len(arrivals)-1].Sub(arrivals[0]).Round(time.Millisecond), most)
}
