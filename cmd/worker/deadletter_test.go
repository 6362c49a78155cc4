package main_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestDeadLetterTopicRefuses runs `worker run` against a dead-letter topic that takes smaller records
// than its source topic. A bad callback too large for it is kept in the table dead_letters, counted
// and logged, and the valid callback behind it on the same partition is applied: the partition moves
// on. `worker replay` then puts the kept dead letter back on its original topic, where the worker
// consumes it again (and, still too large, keeps it again).
func TestDeadLetterTopicRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := embeddedEnvironment(t)
	dlq := topicPayments + ".dlq"
	setTopicConfig(t, env.brokers, dlq, "max.message.bytes", "2000")
	if _, err := env.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ('R-1', 'u-1', 10.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + env.brokers,
		"KAFKA_GROUP_ID=refused-e2e",
		"KAFKA_SESSION_TIMEOUT=" + env.sessionTimeout,
		"DATABASE_URL=" + env.databaseURL,
		"HTTP_ADDR=127.0.0.1:0",
		"SHUTDOWN_TIMEOUT=10s",
		"STARTUP_TIMEOUT=" + env.startupTimeout,
	}, "run")
	base := p.httpAddr()

	// Same order, so same partition: the valid callback waits behind the bad one.
	big := kafka.Message{Key: []byte("R-1"), Value: fmt.Appendf(nil, `{"event_id":"evt-big","order_no":"R-1","note":%q}`,
		strings.Repeat("x", 4000))}
	produce(t, env.brokers, topicPayments, big, payment("evt-ok", "R-1", "T-R1", "10.00", "SUCCESS"))

	// Today's failure: the dead letter was written again and again, and nothing behind it moved.
	eventually(t, func() string {
		families := scrape(t, base)
		outcomes := messagesTotal(families)[topicPayments]
		stored := counter(families, "inboxworker_dead_letters_stored_total", topicPayments)
		if outcomes["applied"] != 1 || outcomes["dead_lettered"] != 1 || stored != 1 {
			return fmt.Sprintf("outcomes %v, %v kept in Postgres; want the valid callback applied and the bad one "+
				"dead-lettered and kept", outcomes, stored)
		}
		if n := committedTotal(t, env.brokers, "refused-e2e", topicPayments); n != 2 {
			return fmt.Sprintf("%d offsets committed, want 2", n)
		}
		return ""
	})
	if got := deadLetters(t, env.brokers, dlq); len(got) != 0 {
		t.Errorf("%d messages in %s, which refused them", len(got), dlq)
	}
	var reason, originalTopic, writeError string
	err := env.pool.QueryRow(ctx, `SELECT reason, original_topic, write_error FROM dead_letters WHERE dlq_topic = $1`,
		dlq).Scan(&reason, &originalTopic, &writeError)
	if err != nil {
		t.Fatalf("the dead letter in dead_letters: %v", err)
	}
	if reason != "invalid_payload" || originalTopic != topicPayments || !strings.Contains(writeError, "Too Large") {
		t.Errorf("dead_letters row: reason %q, original topic %q, write error %q", reason, originalTopic, writeError)
	}
	if p.findLog("the dead-letter topic refused the dead letter; kept it in the database table dead_letters for worker replay",
		"dlq_topic", dlq) == nil {
		t.Error("no log line says where the dead letter went")
	}
	var status string
	if err := env.pool.QueryRow(ctx, `SELECT status FROM orders WHERE order_no = 'R-1'`).Scan(&status); err != nil || status != "PAID" {
		t.Errorf("order R-1 is %q (%v), want PAID by the callback behind the bad one", status, err)
	}

	r := startWorker(t, []string{"KAFKA_BROKERS=" + env.brokers, "DATABASE_URL=" + env.databaseURL,
		"STARTUP_TIMEOUT=" + env.startupTimeout}, "replay", dlq)
	if code := r.wait(); code != 0 {
		t.Fatalf("worker replay: exit code %d", code)
	}
	if stdout, _ := r.output(); !strings.Contains(stdout, "dead_letters_id=") ||
		!strings.HasSuffix(stdout, "replayed 1, skipped 0 from "+dlq+" (1 of them from the table dead_letters)\n") {
		t.Errorf("worker replay printed:\n%s", stdout)
	}
	// Back on its original topic, consumed again, and kept again: it is still too large.
	eventually(t, func() string {
		families := scrape(t, base)
		if n := counter(families, "inboxworker_dead_letters_stored_total", topicPayments); n != 2 {
			return fmt.Sprintf("%v dead letters kept in Postgres, want the replayed one kept a second time", n)
		}
		if n := committedTotal(t, env.brokers, "refused-e2e", topicPayments); n != 3 {
			return fmt.Sprintf("%d offsets committed, want 3", n)
		}
		return ""
	})
	var replayed, pending int
	err = env.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE replayed_at IS NOT NULL),
		count(*) FILTER (WHERE replayed_at IS NULL) FROM dead_letters`).Scan(&replayed, &pending)
	if err != nil || replayed != 1 || pending != 1 {
		t.Errorf("dead_letters: %d replayed, %d pending (%v); want the first replayed and the second pending",
			replayed, pending, err)
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("worker run: exit code %d after SIGTERM, want 0", code)
	}
}

// setTopicConfig sets one configuration of topic, as an operator would.
func setTopicConfig(t *testing.T, brokers, topic, name, value string) {
	t.Helper()
	resp, err := kafkaClient(t, brokers).AlterConfigs(context.Background(), &kafka.AlterConfigsRequest{
		Resources: []kafka.AlterConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic,
			ResourceName: topic,
			Configs:      []kafka.AlterConfigRequestConfig{{Name: name, Value: value}},
		}},
	})
	if err == nil {
		for _, e := range resp.Errors {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		t.Fatalf("set %s of %s: %v", name, topic, err)
	}
}
