package main_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestIdleLogsNoWarning runs two instances of `worker run`, configured as in production, with
// nothing to consume: while they join, share the partitions, refresh their lag, hand the outbox
// relay's lease on and rebalance as one of them stops, neither logs a warning or an error. A
// warning is something for an operator to look at; a normal timeout or rebalance is not.
func TestIdleLogsNoWarning(t *testing.T) {
	t.Parallel()
	cluster := startBroker(t, 2, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)
	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=idle",
		"KAFKA_SESSION_TIMEOUT=2s",
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"LAG_INTERVAL=200ms",
	}
	first := startWorker(t, env, "run")
	waitReady(t, first.httpAddr(), 200)
	second := startWorker(t, env, "run")
	waitReady(t, second.httpAddr(), 200)
	// Both hold partitions: the group settled with two members.
	for _, p := range []*process{first, second} {
		awaitHolding(p, 1)
	}
	// Idle a while: lag refreshes, heartbeats, the relay's empty rounds and lease renewals.
	time.Sleep(3 * time.Second)

	second.signal(syscall.SIGTERM)
	if code := second.wait(); code != 0 {
		t.Errorf("the second instance exited %d, want 0", code)
	}
	// The first takes every partition over: both of each topic.
	awaitHolding(first, 4)
	// A third joins, and both stop at once: the one that leaves last sees its group rebalancing.
	third := startWorker(t, env, "run")
	waitReady(t, third.httpAddr(), 200)
	awaitHolding(third, 1)
	first.signal(syscall.SIGTERM)
	third.signal(syscall.SIGTERM)
	for i, p := range []*process{first, third} {
		if code := p.wait(); code != 0 {
			t.Errorf("instance %d exited %d, want 0", []int{1, 3}[i], code)
		}
	}

	for i, p := range []*process{first, second, third} {
		levels := map[string]int{}
		for _, l := range p.allLogs() {
			level := fmt.Sprint(l["level"])
			levels[level]++
			if level == "WARN" || level == "ERROR" {
				t.Errorf("instance %d logged at %s: %v", i+1, level, l)
			}
		}
		t.Logf("instance %d: %v", i+1, levels)
	}
}

// awaitHolding waits until p joins a generation in which it holds at least n partitions, of every
// topic together.
func awaitHolding(p *process, n int) {
	p.t.Helper()
	awaitEntry(p, fmt.Sprintf("join a generation holding %d partitions", n), func() []map[string]any { return p.logs },
		func(l map[string]any) bool {
			assigned, _ := l["assignments"].(map[string]any)
			held := 0
			for _, partitions := range assigned {
				list, _ := partitions.([]any)
				held += len(list)
			}
			return l["msg"] == "joined a generation of the consumer group" && held >= n
		})
}
