package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

const (
	replayPayments = "payments.callbacks"
	replaySMS      = "notifications.sms"
	replayV2       = "payments.callbacks.v2" // a topic only a dead letter's header names
	replayDLQ      = "payments.callbacks.dlq"
	replaySMSDLQ   = "notifications.sms.dlq"
)

// replayCluster is a broker with the worker's topics, two partitions each, and the worker's database.
type replayCluster struct {
	*kafkatest.Cluster
	t  *testing.T
	db *pgtest.DB
}

func setupReplay(t *testing.T) *replayCluster {
	t.Helper()
	return &replayCluster{Cluster: kafkatest.Start(t, 2, replayPayments, replaySMS, replayV2, replayDLQ, replaySMSDLQ),
		t: t, db: pgtest.Schema(t)}
}

// deadLetter writes msgs to partition 0 of topic, whatever their key, as a dead-letter topic may hold
// them: the replay must choose the target partition by key, not copy the dead letter's.
func (c *replayCluster) deadLetter(topic string, msgs ...kafka.Message) {
	c.t.Helper()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(c.Addr), Transport: transport, Topic: topic,
		Balancer:     kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 }),
		RequiredAcks: kafka.RequireAll, BatchSize: len(msgs), BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		c.t.Fatalf("write dead letters to %s: %v", topic, err)
	}
}

// read returns every message of topic, partition 0 first.
func (c *replayCluster) read(topic string) []kafka.Message {
	c.t.Helper()
	return append(c.ReadAll(c.t, topic, 0), c.ReadAll(c.t, topic, 1)...)
}

// replay runs `worker replay` in-process against the cluster.
func (c *replayCluster) replay(args ...string) result {
	c.t.Helper()
	env := map[string]string{"KAFKA_BROKERS": c.Addr, "DATABASE_URL": c.db.URL, "STARTUP_TIMEOUT": "5s",
		"LOG_FORMAT": "text"}
	r := runMain(c.t, env, append([]string{"replay"}, args...)...)
	c.t.Logf("worker replay %s: exit %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// dead makes msg a dead letter of originalTopic ("" for none), as the consumer writes it: its own
// headers, then the dlq-* ones.
func dead(msg kafka.Message, reason, originalTopic string) kafka.Message {
	letter := deadletter.Letter{Reason: inboxtype.Reason(reason), Error: "order not found", Topic: originalTopic,
		Partition: 1, Offset: 42, Attempts: 7, FailedAt: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
	msg.Headers = slices.DeleteFunc(letter.Headers(msg.Headers), func(h kafka.Header) bool {
		return originalTopic == "" && h.Key == deadletter.HeaderOriginalTopic
	})
	return msg
}

// store keeps d, a dead letter (see dead), in the table dead_letters as one dlqTopic refused, as the
// consumer does.
func (c *replayCluster) store(dlqTopic string, d kafka.Message) int64 {
	c.t.Helper()
	letter, _ := deadletter.Read(d.Headers)
	id, err := deadletter.NewStore(c.db.Pool).Save(context.Background(), deadletter.Stored{DLQTopic: dlqTopic,
		Letter: letter, Key: d.Key, Value: d.Value, Headers: d.Headers, WriteError: "[10] Message Size Too Large"})
	if err != nil {
		c.t.Fatal(err)
	}
	return id
}

// pending returns the Kafka keys of the dead letters of dlqTopic in the table not yet replayed.
func (c *replayCluster) pending(dlqTopic string) []string {
	c.t.Helper()
	var out []string
	err := deadletter.NewStore(c.db.Pool).Pending(context.Background(), dlqTopic, func(d deadletter.Stored) (bool, error) {
		out = append(out, string(d.Key))
		return true, nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

func callback(eventID, orderNo string, headers ...string) kafka.Message {
	m := kafka.Message{Key: []byte(orderNo),
		Value: fmt.Appendf(nil, `{"event_id":%q,"order_no":%q,"provider":"wechat","provider_txn_id":"T-%s",`+
			`"amount":"10.00","currency":"CNY","result":"SUCCESS","paid_at":"2025-06-01T12:00:00Z"}`, eventID, orderNo, orderNo)}
	for i := 0; i+1 < len(headers); i += 2 {
		m.Headers = append(m.Headers, kafka.Header{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return m
}

// keys returns the Kafka keys of msgs, sorted.
func keys(msgs []kafka.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.Key))
	}
	slices.Sort(out)
	return out
}

func hashPartition(key []byte) int {
	return (&kafka.Hash{}).Balance(kafka.Message{Key: key}, 0, 1)
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("KeepsKeyValueAndHeaders", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		var originals []kafka.Message
		for i := range 4 {
			orderNo := fmt.Sprintf("A-%d", i)
			originals = append(originals, callback("evt-"+orderNo, orderNo,
				"Idempotency-Key", "cb-"+orderNo, "traceparent", "00-trace-"+orderNo))
		}
		if !slices.ContainsFunc(originals, func(m kafka.Message) bool { return hashPartition(m.Key) != 0 }) {
			t.Fatal("every key hashes to partition 0: the test could not tell hashing from copying the partition")
		}
		var letters []kafka.Message
		for _, m := range originals {
			letters = append(letters, dead(m, "unknown_order", replayPayments))
		}
		c.deadLetter(replayDLQ, letters...)

		r := c.replay(replayDLQ)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		got := c.read(replayPayments)
		if len(got) != len(originals) {
			t.Fatalf("%d messages on %s, want %d", len(got), replayPayments, len(originals))
		}
		for _, want := range originals {
			i := slices.IndexFunc(got, func(m kafka.Message) bool { return string(m.Key) == string(want.Key) })
			if i < 0 {
				t.Errorf("key %s was not replayed", want.Key)
				continue
			}
			m := got[i]
			if string(m.Value) != string(want.Value) {
				t.Errorf("%s: value %s, want %s", want.Key, m.Value, want.Value)
			}
			if fmt.Sprint(headerList(m.Headers)) != fmt.Sprint(headerList(want.Headers)) {
				t.Errorf("%s: headers %v, want %v", want.Key, headerList(m.Headers), headerList(want.Headers))
			}
			if p := hashPartition(want.Key); m.Partition != p {
				t.Errorf("%s: replayed to partition %d, want %d (the key's)", want.Key, m.Partition, p)
			}
		}
		for i, m := range originals {
			line := fmt.Sprintf("replayed %s partition=0 offset=%d reason=unknown_order to=%s key=cb-%s\n",
				replayDLQ, i, replayPayments, m.Key)
			if !strings.Contains(r.stdout, line) {
				t.Errorf("stdout lacks %q", line)
			}
		}
		if !strings.HasSuffix(r.stdout, "\nreplayed 4, skipped 0 from "+replayDLQ+"\n") {
			t.Errorf("stdout does not end with the summary:\n%s", r.stdout)
		}
		// The dead letters stay: Kafka topics are append-only.
		if n := len(c.read(replayDLQ)); n != len(letters) {
			t.Errorf("%d dead letters left, want all %d", n, len(letters))
		}
	})

	t.Run("TargetFromHeader", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ, dead(callback("evt-1", "B-1"), "unknown_order", replayV2))
		if r := c.replay(replayDLQ); r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := keys(c.read(replayV2)); !slices.Equal(got, []string{"B-1"}) {
			t.Errorf("%s holds %v, want the dead letter B-1", replayV2, got)
		}
		if got := c.read(replayPayments); len(got) != 0 {
			t.Errorf("%s holds %v, want nothing: the header names %s", replayPayments, keys(got), replayV2)
		}
	})

	t.Run("ReasonFilter", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		noReason := callback("evt-4", "C-4")
		noReason.Headers = []kafka.Header{{Key: deadletter.HeaderOriginalTopic, Value: []byte(replayPayments)}}
		c.deadLetter(replayDLQ,
			dead(callback("evt-1", "C-1"), "unknown_order", replayPayments),
			dead(callback("evt-2", "C-2"), "invalid_payload", replayPayments),
			dead(callback("evt-3", "C-3"), "unknown_order", replayPayments),
			noReason,
		)
		r := c.replay(replayDLQ, "--reason", "unknown_order")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"C-1", "C-3"}) {
			t.Errorf("replayed %v, want the unknown_order ones C-1 and C-3", got)
		}
		want := "replayed 2, skipped 2 ((no dlq-reason) 1, invalid_payload 1) from " + replayDLQ + "\n"
		if !strings.HasSuffix(r.stdout, want) {
			t.Errorf("summary: want %q in\n%s", want, r.stdout)
		}
	})

	t.Run("DryRunWritesNothing", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ,
			dead(callback("evt-1", "D-1"), "unknown_order", replayPayments),
			dead(callback("evt-2", "D-2"), "invalid_payload", replayPayments))
		r := c.replay(replayDLQ, "--dry-run", "--reason=unknown_order")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := c.read(replayPayments); len(got) != 0 {
			t.Errorf("a dry run wrote %v to %s", keys(got), replayPayments)
		}
		want := fmt.Sprintf("would replay %s partition=0 offset=0 reason=unknown_order to=%s key=evt-1\n"+
			"dry run: would replay 1, skipped 1 (invalid_payload 1) from %s\n", replayDLQ, replayPayments, replayDLQ)
		if r.stdout != want {
			t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
		}
	})

	t.Run("MissingOriginalTopicSkipped", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ,
			dead(callback("evt-1", "E-1"), "unknown_order", ""),
			dead(callback("evt-2", "E-2"), "unknown_order", replayPayments))
		r := c.replay(replayDLQ)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"E-2"}) {
			t.Errorf("replayed %v, want only E-2", got)
		}
		for _, topic := range []string{replayV2, replaySMS} {
			if got := c.read(topic); len(got) != 0 {
				t.Errorf("the dead letter without dlq-original-topic went to %s", topic)
			}
		}
		if !strings.Contains(r.stderr, "level=WARN") || !strings.Contains(r.stderr, "dlq-original-topic") {
			t.Errorf("no warning about the skipped dead letter:\n%s", r.stderr)
		}
		if want := "replayed 1, skipped 1 ((no dlq-original-topic) 1) from " + replayDLQ + "\n"; !strings.HasSuffix(r.stdout, want) {
			t.Errorf("summary: want %q in\n%s", want, r.stdout)
		}
	})

	t.Run("Limit", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ,
			dead(callback("evt-1", "F-1"), "unknown_order", replayPayments),
			dead(callback("evt-2", "F-2"), "unknown_order", replayPayments),
			dead(callback("evt-3", "F-3"), "unknown_order", replayPayments))
		r := c.replay(replayDLQ, "--limit", "2")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"F-1", "F-2"}) {
			t.Errorf("replayed %v, want the first two", got)
		}
		if want := "replayed 2, skipped 0 from " + replayDLQ + "; stopped at --limit 2\n"; !strings.HasSuffix(r.stdout, want) {
			t.Errorf("summary: want %q in\n%s", want, r.stdout)
		}
	})

	t.Run("EmptyTopic", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		r := c.replay(replayDLQ)
		if r.code != 0 || r.stdout != "replayed 0, skipped 0 from "+replayDLQ+"\n" {
			t.Errorf("exit %d, stdout %q", r.code, r.stdout)
		}
	})

	// The output names the idempotency key the worker will read, and never the Kafka key of an SMS,
	// which is a phone number.
	t.Run("OutputShowsIdempotencyKey", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		phone := "+8613800138000"
		c.deadLetter(replaySMSDLQ,
			dead(kafka.Message{Key: []byte(phone), Value: []byte(`{"event_id":"sms-1","phone":"` + phone + `"}`)},
				"provider_rejected", replaySMS),
			dead(kafka.Message{Key: []byte(phone), Value: []byte(`{"event_id":"sms-2"}`),
				Headers: []kafka.Header{{Key: "x-idempotent-key", Value: []byte("sms-hdr-2")}}}, "provider_rejected", replaySMS),
			dead(kafka.Message{Key: []byte(phone), Value: []byte(`{"phone":"` + phone + `"}`),
				Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte("two\nlines")}}}, "provider_rejected", replaySMS),
			dead(kafka.Message{Key: []byte(phone), Value: []byte(`not json`)}, "invalid_payload", replaySMS),
		)
		r := c.replay(replaySMSDLQ)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		for i, tail := range []string{"reason=provider_rejected to=notifications.sms key=sms-1",
			"reason=provider_rejected to=notifications.sms key=sms-hdr-2",
			"reason=provider_rejected to=notifications.sms key=(invalid)",
			"reason=invalid_payload to=notifications.sms key=(none: the value is not JSON)"} {
			line := fmt.Sprintf("replayed %s partition=0 offset=%d %s\n", replaySMSDLQ, i, tail)
			if !strings.Contains(r.stdout, line) {
				t.Errorf("stdout lacks %q", line)
			}
		}
		if strings.Contains(r.stdout+r.stderr, "13800138000") {
			t.Errorf("the phone number is in the output:\n%s%s", r.stdout, r.stderr)
		}
		if n := len(c.read(replaySMS)); n != 4 {
			t.Errorf("%d messages replayed to %s, want 4", n, replaySMS)
		}
	})
}

// TestReplayStored checks that replay takes the dead letters their topic refused, which the worker
// kept in dead_letters, after the topic's: with --reason, --dry-run and --limit, each put back once.
func TestReplayStored(t *testing.T) {
	t.Parallel()

	t.Run("AfterTheTopics", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ, dead(callback("evt-1", "S-1"), "unknown_order", replayPayments))
		big := callback("evt-2", "S-2", "Idempotency-Key", "cb-s2", "traceparent", "00-trace")
		id := c.store(replayDLQ, dead(big, "unknown_order", replayPayments))
		c.store(replayDLQ, dead(callback("evt-3", "S-3"), "invalid_payload", replayPayments))
		c.store(replaySMSDLQ, dead(callback("evt-4", "S-4"), "unknown_order", replaySMS))

		r := c.replay(replayDLQ, "--reason", "unknown_order")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		got := c.read(replayPayments)
		if keys := keys(got); !slices.Equal(keys, []string{"S-1", "S-2"}) {
			t.Fatalf("replayed %v, want S-1 from the topic and S-2 from the table", keys)
		}
		i := slices.IndexFunc(got, func(m kafka.Message) bool { return string(m.Key) == "S-2" })
		if m := got[i]; string(m.Value) != string(big.Value) || fmt.Sprint(headerList(m.Headers)) != fmt.Sprint(headerList(big.Headers)) {
			t.Errorf("S-2 replayed as %s %v, want %s %v", m.Value, headerList(m.Headers), big.Value, headerList(big.Headers))
		}
		line := fmt.Sprintf("replayed %s dead_letters_id=%d reason=unknown_order to=%s key=cb-s2\n", replayDLQ, id, replayPayments)
		if !strings.Contains(r.stdout, line) {
			t.Errorf("stdout lacks %q", line)
		}
		want := "replayed 2, skipped 1 (invalid_payload 1) from " + replayDLQ + " (1 of them from the table dead_letters)\n"
		if !strings.HasSuffix(r.stdout, want) {
			t.Errorf("summary: want %q in\n%s", want, r.stdout)
		}
		if got := c.pending(replayDLQ); !slices.Equal(got, []string{"S-3"}) {
			t.Errorf("pending in the table after the replay: %v, want only the invalid_payload one", got)
		}
		if got := c.pending(replaySMSDLQ); !slices.Equal(got, []string{"S-4"}) {
			t.Errorf("the other dead-letter topic's row: pending %v, want it untouched", got)
		}

		// Each is replayed once: the topic's dead letter is skipped, and counted, by a second replay;
		// --again puts it back again.
		r = c.replay(replayDLQ, "--reason", "unknown_order")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if keys := keys(c.read(replayPayments)); !slices.Equal(keys, []string{"S-1", "S-2"}) {
			t.Errorf("after a second replay %s holds %v, want S-1 and S-2 once", replayPayments, keys)
		}
		want = "replayed 0, skipped 2 ((replayed before; --again replays them) 1, invalid_payload 1) from " + replayDLQ + "\n"
		if r.stdout != want {
			t.Errorf("second replay: stdout %q, want %q", r.stdout, want)
		}
		if r := c.replay(replayDLQ, "--reason", "unknown_order", "--again"); r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if keys := keys(c.read(replayPayments)); !slices.Equal(keys, []string{"S-1", "S-1", "S-2"}) {
			t.Errorf("after a replay --again %s holds %v, want S-1 twice and S-2 once", replayPayments, keys)
		}
	})

	t.Run("DryRunAndLimit", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		c.deadLetter(replayDLQ, dead(callback("evt-1", "L-1"), "unknown_order", replayPayments))
		first := c.store(replayDLQ, dead(callback("evt-2", "L-2"), "unknown_order", replayPayments))
		c.store(replayDLQ, dead(callback("evt-3", "L-3"), "unknown_order", replayPayments))

		r := c.replay(replayDLQ, "--dry-run", "--limit", "2")
		want := fmt.Sprintf("would replay %s partition=0 offset=0 reason=unknown_order to=%s key=evt-1\n"+
			"would replay %s dead_letters_id=%d reason=unknown_order to=%s key=evt-2\n"+
			"dry run: would replay 2, skipped 0 from %s (1 of them from the table dead_letters); stopped at --limit 2\n",
			replayDLQ, replayPayments, replayDLQ, first, replayPayments, replayDLQ)
		if r.code != 0 || r.stdout != want {
			t.Errorf("exit %d, stdout:\n%s\nwant:\n%s", r.code, r.stdout, want)
		}
		if got := c.read(replayPayments); len(got) != 0 {
			t.Errorf("a dry run wrote %v", keys(got))
		}
		if got := c.pending(replayDLQ); len(got) != 2 {
			t.Errorf("a dry run marked rows replayed: pending %v", got)
		}

		if r := c.replay(replayDLQ, "--limit", "2"); r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"L-1", "L-2"}) {
			t.Errorf("replayed %v, want L-1 and L-2", got)
		}
		if got := c.pending(replayDLQ); !slices.Equal(got, []string{"L-3"}) {
			t.Errorf("pending %v, want L-3, beyond the limit", got)
		}
	})

	t.Run("LoopIntoDeadLetterTopic", func(t *testing.T) {
		t.Parallel()
		c := setupReplay(t)
		id := c.store(replayDLQ, dead(callback("evt-1", "M-1"), "unknown_order", replaySMSDLQ))
		r := c.replay(replayDLQ)
		want := fmt.Sprintf(`worker: %s row %d of dead_letters: its dlq-original-topic "%s" ends with DLQ_SUFFIX ".dlq": `+
			"refusing to replay into a dead-letter topic; nothing was replayed\n", replayDLQ, id, replaySMSDLQ)
		if r.code != 1 || !strings.HasSuffix(r.stderr, want) {
			t.Errorf("exit %d, stderr:\n%s\nwant it to end with %q", r.code, r.stderr, want)
		}
	})
}

// TestReplayRefuses checks the errors that stop a replay before anything is written: exit 1 and one
// line naming the problem.
func TestReplayRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		letters []kafka.Message // written to replayDLQ first
		args    []string
		want    string // the last line of stderr
	}{
		{
			name: "LoopIntoDeadLetterTopic",
			letters: []kafka.Message{
				dead(callback("evt-1", "G-1"), "unknown_order", replayPayments),
				dead(callback("evt-2", "G-2"), "unknown_order", replaySMSDLQ),
			},
			args: []string{replayDLQ},
			want: `worker: ` + replayDLQ + `/0 offset 1: its dlq-original-topic "notifications.sms.dlq" ends with ` +
				`DLQ_SUFFIX ".dlq": refusing to replay into a dead-letter topic; nothing was replayed`,
		},
		{
			name:    "TargetTopicMissing",
			letters: []kafka.Message{dead(callback("evt-1", "G-1"), "unknown_order", "payments.old")},
			args:    []string{replayDLQ},
			want:    `worker: topic "payments.old", the dlq-original-topic of 1 dead letter(s), does not exist; nothing was replayed`,
		},
		{
			name: "DLQTopicMissing",
			args: []string{"orders.dlq"},
			want: `worker: DLQ_TOPIC: topic "orders.dlq" does not exist`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := setupReplay(t)
			if len(tt.letters) > 0 {
				c.deadLetter(replayDLQ, tt.letters...)
			}
			r := c.replay(tt.args...)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != 1 || lines[len(lines)-1] != tt.want {
				t.Errorf("exit %d, last line %q; want exit 1 and %q", r.code, lines[len(lines)-1], tt.want)
			}
			for _, topic := range []string{replayPayments, replaySMS, replayV2, replaySMSDLQ} {
				if got := c.read(topic); len(got) != 0 {
					t.Errorf("wrote %v to %s", keys(got), topic)
				}
			}
		})
	}
}

// TestReplayArgumentErrors checks the errors found before Kafka is reached: exit 1 and one line.
func TestReplayArgumentErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"NoTopic", nil, []string{"replay"},
			`worker: missing DLQ_TOPIC, the dead-letter topic to replay (see worker replay --help)`},
		{"NotADeadLetterTopic", nil, []string{"replay", "payments.callbacks"},
			`worker: DLQ_TOPIC: "payments.callbacks" is not a dead-letter topic: it does not end with DLQ_SUFFIX ".dlq"`},
		{"OtherSuffix", map[string]string{"DLQ_SUFFIX": ".dead"}, []string{"replay", "payments.callbacks.dlq"},
			`worker: DLQ_TOPIC: "payments.callbacks.dlq" is not a dead-letter topic: it does not end with DLQ_SUFFIX ".dead"`},
		{"BadTopicName", nil, []string{"replay", "payments callbacks.dlq"},
			`worker: DLQ_TOPIC: invalid topic name "payments callbacks.dlq" (letters, digits, '.', '_' and '-', at most 249)`},
		{"TwoTopics", nil, []string{"replay", "a.dlq", "b.dlq"},
			`worker: unexpected argument "b.dlq" (see worker replay --help)`},
		{"BadLimit", nil, []string{"replay", "a.dlq", "--limit", "0"},
			`worker: --limit: must be a positive number, got "0"`},
		{"LimitNotANumber", nil, []string{"replay", "a.dlq", "--limit=all"},
			`worker: --limit: must be a positive number, got "all"`},
		{"FlagOfAnotherCommand", nil, []string{"replay", "a.dlq", "--kafka-group-id=x"},
			`worker: unknown flag --kafka-group-id (see worker replay --help)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runMain(t, tt.env, tt.args...)
			if r.code != 1 || r.stdout != "" || r.stderr != tt.want+"\n" {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 1 and stderr %q", r.code, r.stdout, r.stderr, tt.want)
			}
		})
	}
}

func TestReplayHelp(t *testing.T) {
	t.Parallel()
	r := runMain(t, nil, "replay", "--help")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, want := range []string{"Usage: worker replay [flags] DLQ_TOPIC", "--dry-run", "--reason REASON",
		"--limit N", "--kafka-brokers LIST", "--dlq-suffix SUFFIX", "--database-url URL", "dead_letters",
		"Each dead letter is replayed once", "--again", "--since TIME", "--from-offset N"} {
		if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), want) {
			t.Errorf("worker replay --help lacks %q:\n%s", want, r.stdout)
		}
	}
	for _, unwanted := range []string{"--kafka-group-id", "--http-addr"} {
		if strings.Contains(r.stdout, unwanted) {
			t.Errorf("worker replay --help offers %s, which it does not use", unwanted)
		}
	}
}

// headerList is headers as "key=value" strings, in order.
func headerList(headers []kafka.Header) []string {
	var out []string
	for _, h := range headers {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// TestReplayStopsAtEndOffsets writes more dead letters while the replay reads the dead-letter topic,
// held at its first fetch: the replay puts back only those up to the end offsets it saw at its
// start, not the ones that arrived after.
func TestReplayStopsAtEndOffsets(t *testing.T) {
	t.Parallel()
	c := setupReplay(t)
	letter := func(orderNo string) kafka.Message {
		return dead(callback("evt-"+orderNo, orderNo), "unknown_order", replayPayments)
	}
	c.deadLetter(replayDLQ, letter("E-1"), letter("E-2"))

	var once sync.Once
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		once.Do(func() {
			// Written by another connection while this fetch sleeps: the fetch then finds them.
			written := make(chan struct{})
			go func() {
				defer close(written)
				if err := writeAll(c.Addr, replayDLQ, letter("LATE-1"), letter("LATE-2")); err != nil {
					t.Errorf("write the late dead letters: %v", err)
				}
			}()
			c.SleepControl(func() { <-written })
		})
		return nil, nil, false
	})

	r := c.replay(replayDLQ)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if got := len(c.read(replayDLQ)); got != 4 {
		t.Fatalf("%d dead letters, want 4: the late ones were not written during the replay", got)
	}
	if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"E-1", "E-2"}) {
		t.Errorf("replayed %v, want only E-1 and E-2, the dead letters there when the replay started", got)
	}
}

// writeAll writes msgs to partition 0 of topic, from a goroutine other than the test's.
func writeAll(addr, topic string, msgs ...kafka.Message) error {
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Transport: transport, Topic: topic,
		Balancer:     kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 }),
		RequiredAcks: kafka.RequireAll, BatchSize: len(msgs), BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.WriteMessages(ctx, msgs...)
}

// TestReplayStoredConcurrently runs two replays of one dead-letter topic at once, as two operators
// might: each dead letter, of the topic or a row of dead_letters, is put back once, by one of them,
// and both succeed.
func TestReplayStoredConcurrently(t *testing.T) {
	t.Parallel()
	c := setupReplay(t)
	const n = 40
	var want []string
	var inTopic []kafka.Message
	for i := range n {
		key := fmt.Sprintf("C-%02d", i)
		c.store(replayDLQ, dead(callback(fmt.Sprintf("evt-%d", i), key), "unknown_order", replayPayments))
		topicKey := fmt.Sprintf("T-%02d", i)
		inTopic = append(inTopic, dead(callback(fmt.Sprintf("evt-t%d", i), topicKey), "unknown_order", replayPayments))
		want = append(want, key, topicKey)
	}
	c.deadLetter(replayDLQ, inTopic...)
	slices.Sort(want)
	n2 := 2 * n
	start := make(chan struct{})
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			<-start
			results[i] = c.replay(replayDLQ)
		})
	}
	close(start)
	wg.Wait()
	replayed := 0
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("replay %d: exit %d: %s", i, r.code, r.stderr)
		}
		var count int
		if _, err := fmt.Sscanf(r.stdout[strings.LastIndex(strings.TrimSuffix(r.stdout, "\n"), "\n")+1:], "replayed %d,", &count); err != nil {
			t.Fatalf("replay %d: no summary in %q: %v", i, r.stdout, err)
		}
		replayed += count
	}
	if got := keys(c.read(replayPayments)); !slices.Equal(got, want) {
		t.Errorf("%s holds %d messages, want each of the %d dead letters once: %v", replayPayments, len(got), n2, got)
	}
	if replayed != n2 {
		t.Errorf("the two replays say they replayed %d, want %d between them", replayed, n2)
	}
	if got := c.pending(replayDLQ); len(got) != 0 {
		t.Errorf("pending after both: %v, want none", got)
	}
}

// TestReplayStoredClaims checks the claims on rows of dead_letters: a row another replay holds is
// skipped and left to it; a row whose replay died (its claim lapsed) is put back by the next one.
func TestReplayStoredClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := setupReplay(t)
	held := c.store(replayDLQ, dead(callback("evt-1", "H-1"), "unknown_order", replayPayments))
	lapsed := c.store(replayDLQ, dead(callback("evt-2", "H-2"), "unknown_order", replayPayments))
	c.store(replayDLQ, dead(callback("evt-3", "H-3"), "unknown_order", replayPayments))
	if _, err := c.db.Pool.Exec(ctx, `UPDATE dead_letters SET replay_claimed_by = 'another replay',
		replay_claimed_until = CASE id WHEN $1 THEN now() + interval '1 hour' ELSE now() - interval '1 second' END
		WHERE id IN ($1, $2)`, held, lapsed); err != nil {
		t.Fatal(err)
	}

	r := c.replay(replayDLQ)
	want := "replayed 2, skipped 1 ((taken by another replay) 1) from " + replayDLQ + " (2 of them from the table dead_letters)\n"
	if r.code != 0 || !strings.HasSuffix(r.stdout, want) {
		t.Errorf("exit %d, stdout:\n%s\nwant it to end with %q", r.code, r.stdout, want)
	}
	if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"H-2", "H-3"}) {
		t.Errorf("replayed %v, want H-2 (its claim had lapsed) and H-3", got)
	}
	if got := c.pending(replayDLQ); !slices.Equal(got, []string{"H-1"}) {
		t.Errorf("pending %v, want H-1, which the other replay holds", got)
	}

	// The other replay died too: once its claim lapses, the row is put back.
	if _, err := c.db.Pool.Exec(ctx, `UPDATE dead_letters SET replay_claimed_until = now() - interval '1 second' WHERE id = $1`, held); err != nil {
		t.Fatal(err)
	}
	if r := c.replay(replayDLQ); r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 1, skipped 0 from "+replayDLQ+" (1 of them from the table dead_letters)\n") {
		t.Errorf("exit %d, stdout:\n%s", r.code, r.stdout)
	}
	if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"H-1", "H-2", "H-3"}) {
		t.Errorf("replayed %v, want each row once", got)
	}
	if got := c.pending(replayDLQ); len(got) != 0 {
		t.Errorf("pending %v, want none", got)
	}
}

// TestReplayKeepsTheRecordTimestamp: a dead letter replayed an hour after its message was produced,
// from the dead-letter topic and from the table dead_letters, goes back with its original record
// timestamp (dlq-original-timestamp), so that what the timestamp means — when the receiver produced
// a signed callback — is not the time of the replay.
func TestReplayKeepsTheRecordTimestamp(t *testing.T) {
	t.Parallel()
	c := setupReplay(t)
	produced := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	withTimestamp := func(m kafka.Message) kafka.Message {
		letter, original := deadletter.Read(m.Headers)
		letter.Produced = produced
		m.Headers = letter.Headers(original)
		return m
	}
	c.deadLetter(replayDLQ, withTimestamp(dead(callback("e-topic", "ORD-TOPIC"), "bad_signature", replayPayments)))
	c.store(replayDLQ, withTimestamp(dead(callback("e-table", "ORD-TABLE"), "bad_signature", replayPayments)))
	c.deadLetter(replayDLQ, dead(callback("e-none", "ORD-NONE"), "bad_signature", replayPayments)) // an older worker's

	if r := c.replay(replayDLQ); r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	replayed := c.read(replayPayments)
	if len(replayed) != 3 {
		t.Fatalf("%d messages replayed, want 3", len(replayed))
	}
	for _, m := range replayed {
		switch string(m.Key) {
		case "ORD-NONE":
			if m.Time.Before(produced.Add(30 * time.Minute)) {
				t.Errorf("%s, without the header, replayed with timestamp %s: want the replay's", m.Key, m.Time)
			}
		default:
			if !m.Time.Equal(produced) {
				t.Errorf("%s replayed with timestamp %s, want the original's, %s", m.Key, m.Time, produced)
			}
		}
		if _, original := deadletter.Read(m.Headers); len(original) != len(m.Headers) {
			t.Errorf("%s replayed with dlq-* headers: %v", m.Key, m.Headers)
		}
	}
}

// TestReplayTwice is an operator replaying the same dead-letter topic again after the letters it put
// back failed once more and were dead-lettered again: the second replay offers only the new letters,
// says how many it skips as replayed before, and --since and --from-offset bound it.
func TestReplayTwice(t *testing.T) {
	t.Parallel()
	c := setupReplay(t)
	failedAt := func(msg kafka.Message, at time.Time) kafka.Message {
		letter, original := deadletter.Read(msg.Headers)
		letter.FailedAt = at
		msg.Headers = letter.Headers(original)
		return msg
	}
	first := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	c.deadLetter(replayDLQ,
		failedAt(dead(callback("evt-1", "R-1"), "unknown_order", replayPayments), first),
		failedAt(dead(callback("evt-2", "R-2"), "unknown_order", replayPayments), first))
	r := c.replay(replayDLQ)
	if r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 2, skipped 0 from "+replayDLQ+"\n") {
		t.Fatalf("first replay: exit %d, stdout %q", r.code, r.stdout)
	}
	// A command a person runs at a terminal says what it does on stdout; its configuration, at
	// debug, is not in the way.
	if strings.Contains(r.stderr, "msg=starting") {
		t.Errorf("worker replay logged its starting line at info:\n%s", r.stderr)
	}
	// The worker takes them again and they fail again: two new dead letters, at offsets 2 and 3.
	again := first.Add(time.Hour)
	c.deadLetter(replayDLQ,
		failedAt(dead(callback("evt-1", "R-1"), "unknown_order", replayPayments), again),
		failedAt(dead(callback("evt-2", "R-2"), "unknown_order", replayPayments), again))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dry-run"}, "would replay " + replayDLQ + " partition=0 offset=2 reason=unknown_order to=" + replayPayments + " key=evt-1\n" +
			"would replay " + replayDLQ + " partition=0 offset=3 reason=unknown_order to=" + replayPayments + " key=evt-2\n" +
			"dry run: would replay 2, skipped 2 ((replayed before; --again replays them) 2) from " + replayDLQ + "\n"},
		{[]string{"--dry-run", "--again"}, "dry run: would replay 4, skipped 0 from " + replayDLQ + "\n"},
		{[]string{"--dry-run", "--since", again.Add(time.Second).Format(time.RFC3339)}, "dry run: would replay 0, skipped 4 ((before --since) 4) from " + replayDLQ + "\n"},
		{[]string{"--dry-run", "--again", "--since", again.Format(time.RFC3339)}, "dry run: would replay 2, skipped 2 ((before --since) 2) from " + replayDLQ + "\n"},
		{[]string{"--dry-run", "--from-offset", "3"}, "dry run: would replay 1, skipped 0 from " + replayDLQ + "\n"},
	} {
		r := c.replay(append([]string{replayDLQ}, tc.args...)...)
		if r.code != 0 || !strings.HasSuffix(r.stdout, tc.want) {
			t.Errorf("worker replay %v: exit %d, stdout\n%s\nwant it to end with\n%s", tc.args, r.code, r.stdout, tc.want)
		}
	}
	// The replay itself: the two new letters, once; a replay after it has nothing left.
	if r := c.replay(replayDLQ); r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 2, skipped 2 ((replayed before; --again replays them) 2) from "+replayDLQ+"\n") {
		t.Errorf("second replay: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := c.replay(replayDLQ); r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 0, skipped 4 ((replayed before; --again replays them) 4) from "+replayDLQ+"\n") {
		t.Errorf("third replay: exit %d, stdout %q", r.code, r.stdout)
	}
	if got := keys(c.read(replayPayments)); !slices.Equal(got, []string{"R-1", "R-1", "R-2", "R-2"}) {
		t.Errorf("%s holds %v, want each letter put back once: R-1 and R-2 twice (each was dead-lettered twice)", replayPayments, got)
	}
}

// TestReplayTopicCreatedAgain: a dead-letter topic deleted and created again starts its offsets over;
// the letter now at a place a replay marked is another letter, and is offered, not skipped.
func TestReplayTopicCreatedAgain(t *testing.T) {
	t.Parallel()
	c := setupReplay(t)
	// What a replay marked at offset 0 of the topic as it was before.
	if _, err := c.db.Pool.Exec(context.Background(), `INSERT INTO dead_letter_replays
		(dlq_topic, dlq_partition, dlq_offset, letter, claimed_by, replayed_at, replays)
		VALUES ($1, 0, 0, 'payments.callbacks/0/7@2026-01-01T00:00:00Z', 'worker replay on old-host', now(), 1)`,
		replayDLQ); err != nil {
		t.Fatal(err)
	}
	c.deadLetter(replayDLQ, dead(callback("evt-n1", "N-1"), "unknown_order", replayPayments))
	r := c.replay(replayDLQ)
	if r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 1, skipped 0 from "+replayDLQ+"\n") {
		t.Errorf("exit %d, stdout %q: want the new letter at offset 0 replayed", r.code, r.stdout)
	}
	if r := c.replay(replayDLQ); !strings.HasSuffix(r.stdout, "replayed 0, skipped 1 ((replayed before; --again replays them) 1) from "+replayDLQ+"\n") {
		t.Errorf("a replay after it: stdout %q, want the new letter skipped as replayed", r.stdout)
	}
}
