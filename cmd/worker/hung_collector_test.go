package main_test

import (
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestHungCollector: a trace collector that accepts the spans' request and never answers costs
// the stop a few seconds, not SHUTDOWN_TIMEOUT: the worker stops consuming, commits its offsets,
// says which spans it could not export, and exits 0. With SHUTDOWN_TIMEOUT=10m, a stop that waited
// for the collector as long as the timeout allows would outlast the test's guard on the exit.
func TestHungCollector(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(collector.Close)
	t.Cleanup(func() { close(hang) }) // runs first: the handlers return before the server closes

	cluster := startBroker(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=hung-collector",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"SHUTDOWN_TIMEOUT=10m",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_BSP_SCHEDULE_DELAY=600000", // ms: the spans wait for the flush at the stop
	}, "run")
	produce(t, cluster.Addr, topicSMS, sms("hung-1", "+8613800138000"))
	eventually(t, func() string {
		if cluster.CommittedOffset(t, "hung-collector", topicSMS, 0) != 1 {
			return "the SMS is not committed"
		}
		return ""
	})
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	p.waitLog("tracing: not every span was exported before the worker stopped")
}
