package main_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestShutdown sends SIGTERM to `worker run` while an SMS is in flight, held by the provider between
// accepting it and answering: /readyz turns 503 at once, and the held message either finishes
// (released in time) or is rolled back whole when SHUTDOWN_TIMEOUT runs out. Either way the worker
// exits 0.
func TestShutdown(t *testing.T) {
	t.Parallel()
	t.Run("InFlightFinishes", func(t *testing.T) {
		t.Parallel()
		testShutdown(t, false)
	})
	t.Run("TimeoutRunsOut", func(t *testing.T) {
		t.Parallel()
		testShutdown(t, true)
	})
}

func testShutdown(t *testing.T, timeoutRunsOut bool) {
	cluster := startBroker(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)
	delivered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	provider.SetOnDelivered(func(ctx context.Context, _ notifytest.Request) {
		once.Do(func() { close(delivered) })
		select {
		case <-release:
		case <-ctx.Done(): // the worker gave up the request
		}
	})
	shutdownTimeout := "30s" // far longer than the test takes: the handler is released long before
	if timeoutRunsOut {
		// Short: in-flight work is cancelled at half of it, and the worker still exits 0 in time.
		shutdownTimeout = "1s"
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=shutdown",
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"SHUTDOWN_TIMEOUT=" + shutdownTimeout,
	}, "run")
	base := p.httpAddr()
	const key = "sms-in-flight"
	produce(t, cluster.Addr, topicSMS, sms(key, "+8613800138000"))
	select {
	case <-delivered:
	case <-time.After(waitTimeout):
		t.Fatal("the provider never received the SMS")
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz before SIGTERM: %d %s, want 200", code, body)
	}

	p.signal(syscall.SIGTERM)
	// The held message keeps the worker running, and its endpoints up, until it is released or the
	// timeout runs out: /readyz must say 503 meanwhile, so that no new traffic is routed to it.
	p.waitLog("stopping: finishing in-flight messages")
	if code, body := get(t, base+"/readyz"); code != 503 {
		t.Errorf("/readyz after SIGTERM: %d %s, want 503", code, body)
	}
	if !timeoutRunsOut {
		close(release)
	} else {
		defer close(release)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}

	notifications := countNotifications(t, db.Pool, key)
	committed := cluster.CommittedOffset(t, "shutdown", topicSMS, 0)
	if timeoutRunsOut {
		// Rolled back whole: nothing recorded, nothing committed, so the next worker sends it again.
		if notifications != 0 || committed > 0 {
			t.Errorf("after the timeout ran out: %d notifications, committed offset %d; want none",
				notifications, committed)
		}
		if l := p.findLog("shutdown timeout: cancelling in-flight work", "level", "WARN"); l == nil {
			t.Error("no warning that the shutdown timeout cancelled in-flight work")
		}
		return
	}
	if notifications != 1 || committed != 1 {
		t.Errorf("the in-flight message: %d notifications, committed offset %d; want 1 and 1",
			notifications, committed)
	}
	if n := len(provider.Delivered()); n != 1 {
		t.Errorf("the provider delivered %d messages, want 1", n)
	}
}
