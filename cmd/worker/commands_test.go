package main_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
// worker applies; SIGTERM stops both.
func TestDev(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	p := startWorker(t, []string{
		"DEV_KAFKA_ADDR=127.0.0.1:0",
		"HTTP_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + db.URL,
	}, "dev")
	broker, _ := p.waitLog("embedded Kafka broker listening")["addr"].(string)
	base := p.httpAddr()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})
	// The embedded broker keeps messages no longer than the inbox remembers keys: the topics say so
	// themselves, the worker could read that, and so did not warn.
	for topic, inboxRetention := range map[string]time.Duration{topicPayments: 72 * time.Hour, topicSMS: 24 * time.Hour} {
		if kept := topicRetention(t, broker, topic); kept < 0 || kept > inboxRetention {
			t.Errorf("worker dev's %s keeps messages %v, longer than the inbox's %v", topic, kept, inboxRetention)
		}
	}
	for _, l := range p.allLogs() {
		if msg, _ := l["msg"].(string); msg == retentionWarning || strings.Contains(msg, "retention.ms") {
			t.Errorf("worker dev logged %q about its own topics' retention: %v", msg, l)
		}
	}
	if stdout, _ := p.output(); !strings.Contains(stdout, "kcat -P -b "+broker+" -t "+topicPayments) {
		t.Errorf("worker dev does not say how to produce to %s:\n%s", broker, stdout)
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

// topicRetention reads topic's retention.ms from the broker at addr; negative means forever.
func topicRetention(t *testing.T, addr, topic string) time.Duration {
	t.Helper()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(addr), Transport: transport}
	resp, err := client.DescribeConfigs(t.Context(), &kafka.DescribeConfigsRequest{
		Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"}}},
	})
	if err != nil {
		t.Fatalf("describe %s: %v", topic, err)
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			t.Fatalf("describe %s: %v", topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "retention.ms" {
				ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
				if err != nil {
					t.Fatalf("%s: retention.ms %q: %v", topic, e.ConfigValue, err)
				}
				return time.Duration(ms) * time.Millisecond
			}
		}
	}
	t.Fatalf("%s has no retention.ms", topic)
	return 0
}
