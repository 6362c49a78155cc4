package main_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestMigrate runs `worker migrate` and `worker migrate status` on an empty schema.
func TestMigrate(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + pgtest.EmptySchema(t).URL}

	migrate := func(args ...string) string {
		t.Helper()
		p := startWorker(t, env, append([]string{"migrate"}, args...)...)
		if code := p.wait(); code != 0 {
			t.Fatalf("worker migrate %s: exit code %d", strings.Join(args, " "), code)
		}
		stdout, _ := p.output()
		return stdout
	}
	states := func(status string) map[string]int {
		out := map[string]int{}
		for line := range strings.Lines(status) {
			if f := strings.Fields(line); len(f) == 3 && f[0] != "VERSION" {
				out[f[2]]++
			}
		}
		return out
	}

	before := states(migrate("status"))
	if before["pending"] == 0 || before["applied"] != 0 {
		t.Fatalf("status of an empty schema: %v, want every migration pending", before)
	}
	if got, want := migrate(), fmt.Sprintf("applied %d migration(s)\n", before["pending"]); got != want {
		t.Errorf("worker migrate printed %q, want %q", got, want)
	}
	if after := states(migrate("status")); after["applied"] != before["pending"] || after["pending"] != 0 {
		t.Errorf("status after migrate: %v, want all %d applied", after, before["pending"])
	}
	if got := migrate(); got != "no pending migrations\n" {
		t.Errorf("worker migrate again printed %q", got)
	}
}

// TestDev runs `worker dev`: its embedded broker takes messages from any Kafka client, which the
// worker applies, and serves the topics of DEV_TOPICS, for a team's own binary; SIGTERM stops both.
func TestDev(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	p := startWorker(t, []string{
		"DEV_TOPICS=orders.created, shipments",
		"DEV_KAFKA_ADDR=127.0.0.1:0",
		"HTTP_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + db.URL,
		"LOG_FORMAT=json", // for the test to read; text by default (TestDevLogsText)
	}, "dev")
	broker, _ := p.waitLog("embedded Kafka broker listening")["addr"].(string)
	base := p.httpAddr()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})
	// The inbox remembers keys as long as the embedded broker's topics can redeliver them: the
	// worker read each topic's retention and took it, and warned of nothing, a failed read included.
	for _, topic := range []string{topicPayments, topicSMS} {
		if l := p.findLog("inbox retention", "topic", topic); l == nil || l["source"] != "topic" {
			t.Errorf("worker dev did not take %s's inbox retention from the topic: %v", topic, l)
		}
	}
	for _, l := range p.allLogs() {
		if msg, _ := l["msg"].(string); msg == retentionWarning || strings.Contains(msg, "retention.ms") {
			t.Errorf("worker dev logged %q about its own topics' retention: %v", msg, l)
		}
	}
	stdout, _ := p.output()
	if !strings.Contains(stdout, "kcat -P -b "+broker+" -t "+topicPayments) {
		t.Errorf("worker dev does not say how to produce to %s:\n%s", broker, stdout)
	}
	if !strings.Contains(stdout, "VALUES ('A-1',") || !strings.Contains(stdout, "orders.created, shipments") {
		t.Errorf("worker dev does not say how to create the order its example callback pays, or which topics it serves:\n%s", stdout)
	}
	// A team's own topics, each with its dead-letter topic.
	for _, topic := range []string{"orders.created", "orders.created.dlq", "shipments", "shipments.dlq"} {
		produce(t, broker, topic, kafka.Message{Key: []byte("k"), Value: []byte(`{"event_id":"e-1"}`)})
	}

	produce(t, broker, topicSMS, sms("sms-dev", "+8613800138000"))
	eventually(t, func() string {
		var n int
		err := db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM notifications WHERE idempotency_key = 'sms-dev'`).Scan(&n)
		if err != nil || n != 1 {
			return fmt.Sprintf("the SMS event was not applied (%d notifications, %v)", n, err)
		}
		return ""
	})
	// Ctrl-C stops it as SIGTERM does (the end-to-end test sends SIGTERM).
	p.signal(syscall.SIGINT)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGINT, want 0", code)
	}
}

// TestDevLogsText checks that `worker dev` logs as text, for the person watching it, unless
// LOG_FORMAT says otherwise.
func TestDevLogsText(t *testing.T) {
	t.Parallel()
	p := startWorker(t, []string{
		"DEV_KAFKA_ADDR=127.0.0.1:0",
		"HTTP_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + pgtest.Schema(t).URL,
	}, "dev")
	p.waitLine(`level=INFO msg="embedded Kafka broker listening" addr=127.0.0.1:`)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if _, lines := p.output(); len(lines) == 0 || strings.HasPrefix(lines[0], "{") {
		t.Errorf("worker dev logs JSON by default: %q", lines)
	}
}
