package notify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
)

const (
	smsTopic = "notifications.sms"
	smsGroup = "sms-traffic"
)

// workerEnv is env with a broker holding the SMS topic and its dead-letter topic, and the workers
// of one group started on it, each sending through the SMS handler to env's provider.
type workerEnv struct {
	*env
	kafka      *kafkatest.Cluster
	partitions int
}

func setupWorkers(t *testing.T, partitions int) *workerEnv {
	t.Helper()
	return &workerEnv{env: setup(t), kafka: kafkatest.Start(t, int32(partitions), smsTopic, smsTopic+".dlq"),
		partitions: partitions}
}

// start runs a worker of the group with the SMS handler of config until the test ends, and
// returns it and the registry of its metrics.
func (e *workerEnv) start(t *testing.T, config notify.Config) (*inboxworker.Worker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := inboxworker.New(inboxworker.Config{
		Brokers: []string{e.kafka.Addr},
		GroupID: smsGroup,
		Pool:    e.pool,
		Routes: []inboxworker.Route{{Topic: smsTopic, Name: "sms", Call: e.limitedHandler(t, config),
			Concurrency: 32}},
		Retry:           inboxworker.Retry{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxElapsed: 5 * time.Minute},
		ParkAfter:       300 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
		LagInterval:     time.Second,
		Registerer:      reg,
		Logger:          e.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, reg
}

// committed returns how many offsets the group has committed, over every partition.
func (e *workerEnv) committed(t *testing.T) int64 {
	t.Helper()
	var n int64
	for p := range e.partitions {
		n += max(e.kafka.CommittedOffset(t, smsGroup, smsTopic, p), 0)
	}
	return n
}

// deadLetters counts the messages of the dead-letter topic.
func (e *workerEnv) deadLetters(t *testing.T) int {
	t.Helper()
	n := 0
	for p := range e.partitions {
		n += len(e.kafka.ReadAll(t, smsTopic+".dlq", p))
	}
	return n
}

// statuses counts the notifications rows by status.
func (e *workerEnv) statuses(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT status, count(*)::int FROM notifications GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			t.Fatal(err)
		}
		out[status] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// outcomes sums inboxworker_messages_total of the SMS topic by outcome over regs.
func outcomes(t *testing.T, regs ...*prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, reg := range regs {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "inboxworker_messages_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["topic"] == smsTopic {
					out[labels["outcome"]] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// code is a verification code SMS event of event id key to phone, under the Kafka key kafkaKey.
func code(key, phone, kafkaKey string) kafka.Message {
	return kafka.Message{Key: []byte(kafkaKey), Value: fmt.Appendf(nil,
		`{"event_id":%q,"phone":%q,"template":"verify_code","params":{"code":"123456"}}`, key, phone)}
}

// TestExpiryThroughAnOutage is the shape of a provider outage with codes waiting: validity 2s,
// the provider down 6s (three validities, as 10s and 30s would be) with 200 codes waiting. None of
// them is sent: each is retried, parked and paused behind the outage, and once it is over, its
// Check finds it expired and records it so, never a dead letter. Codes produced after the provider
// is back are sent; an expired code delivered again stays a no-op.
func TestExpiryThroughAnOutage(t *testing.T) {
	t.Parallel()
	e := setupWorkers(t, 4)
	var down atomic.Bool
	down.Store(true)
	var callsWhileDown atomic.Int32
	e.provider.SetHook(func(notifytest.Request) notifytest.Reply {
		if down.Load() {
			callsWhileDown.Add(1)
			return notifytest.Reply{Status: http.StatusServiceUnavailable}
		}
		return notifytest.Reply{}
	})
	_, reg := e.start(t, notify.Config{Validity: notify.Validity{"verify_code": 2 * time.Second}})

	const waiting = 200
	var msgs []kafka.Message
	for i := range waiting {
		phone := fmt.Sprintf("+8613800%06d", i)
		msgs = append(msgs, code(fmt.Sprintf("waiting-%d", i), phone, phone))
	}
	e.kafka.Produce(t, smsTopic, msgs...)
	waitFor(t, "the codes tried while the provider is down", func() bool { return callsWhileDown.Load() > 0 })
	time.Sleep(6 * time.Second) // the outage
	down.Store(false)

	waitFor(t, "every waiting code finished", func() bool {
		return e.committed(t) == waiting && outcomes(t, reg)["expired"] == waiting
	})
	if got := e.statuses(t); got["EXPIRED"] != waiting || got["SENT"] != 0 {
		t.Fatalf("notifications %v, want %d EXPIRED and none SENT", got, waiting)
	}
	if n := len(e.provider.Delivered()); n != 0 {
		t.Fatalf("%d of the waiting codes sent, want none", n)
	}
	t.Logf("%d calls while the provider was down", callsWhileDown.Load())

	// The provider is back: new codes go out.
	var fresh []kafka.Message
	for i := range 20 {
		phone := fmt.Sprintf("+8613900%06d", i)
		fresh = append(fresh, code(fmt.Sprintf("fresh-%d", i), phone, phone))
	}
	e.kafka.Produce(t, smsTopic, fresh...)
	waitFor(t, "the new codes sent", func() bool { return e.committed(t) == waiting+20 && outcomes(t, reg)["applied"] == 20 })
	if got := e.statuses(t); got["SENT"] != 20 || len(e.provider.Delivered()) != 20 {
		t.Fatalf("notifications %v, %d delivered; want the 20 new codes SENT and delivered", got, len(e.provider.Delivered()))
	}

	// An expired code delivered again: a duplicate, no call.
	calls := e.provider.Calls("waiting-7")
	e.kafka.Produce(t, smsTopic, msgs[7])
	waitFor(t, "the redelivery finished", func() bool {
		return e.committed(t) == waiting+21 && outcomes(t, reg)["duplicate"] == 1
	})
	if got := e.provider.Calls("waiting-7"); got != calls {
		t.Fatalf("the redelivered expired code was called %d times more", got-calls)
	}
	if got := outcomes(t, reg); got["expired"] != waiting || got["dead_lettered"] != 0 || e.deadLetters(t) != 0 {
		t.Fatalf("outcomes %v, %d dead letters; want %d expired and no dead letter", got, e.deadLetters(t), waiting)
	}
}

// kafkaKeys returns two Kafka keys of a phone's codes that go to different partitions of n.
func kafkaKeys(t *testing.T, n int) (string, string) {
	t.Helper()
	partitions := make([]int, n)
	for p := range partitions {
		partitions[p] = p
	}
	partition := func(key string) int { return (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(key)}, partitions...) }
	first := "device-0"
	for i := 1; i < 100; i++ {
		if other := fmt.Sprintf("device-%d", i); partition(other) != partition(first) {
			return first, other
		}
	}
	t.Fatal("no two keys of different partitions")
	return "", ""
}

// TestRecipientLimitTwoInstances: SMS_RECIPIENT_LIMIT verify_code=1/1m, five codes to one phone
// within a second, under two Kafka keys (two partitions), consumed by two workers of one group:
// exactly one is sent, four are suppressed, each recorded with its key; replaying the four changes
// nothing.
func TestRecipientLimitTwoInstances(t *testing.T) {
	t.Parallel()
	e := setupWorkers(t, 2)
	// The first send is slow: the others are checked while it is out.
	e.provider.SetHook(func(notifytest.Request) notifytest.Reply { return notifytest.Reply{Delay: 300 * time.Millisecond} })
	config := notify.Config{RecipientLimits: limitsOf(t, "verify_code=1/1m")}
	w1, reg1 := e.start(t, config)
	w2, reg2 := e.start(t, config)
	waitFor(t, "both workers ready", func() bool { return w1.Ready() == nil && w2.Ready() == nil })

	a, b := kafkaKeys(t, e.partitions)
	msgs := []kafka.Message{code("c1", testPhone, a), code("c2", testPhone, b), code("c3", testPhone, a),
		code("c4", testPhone, b), code("c5", testPhone, a)}
	e.kafka.Produce(t, smsTopic, msgs...)
	waitFor(t, "the five codes finished", func() bool {
		o := outcomes(t, reg1, reg2)
		return e.committed(t) == 5 && o["applied"]+o["suppressed"] == 5
	})
	if got := outcomes(t, reg1, reg2); got["applied"] != 1 || got["suppressed"] != 4 {
		t.Fatalf("outcomes %v, want 1 applied and 4 suppressed", got)
	}
	for i, reg := range []*prometheus.Registry{reg1, reg2} {
		if o := outcomes(t, reg); o["applied"]+o["suppressed"] == 0 {
			t.Fatalf("worker %d handled none of the codes: want both workers sending to the phone", i+1)
		}
	}
	delivered := e.provider.Delivered()
	if len(delivered) != 1 || e.statuses(t)["SUPPRESSED"] != 4 || e.statuses(t)["SENT"] != 1 {
		t.Fatalf("%d delivered, notifications %v; want 1 delivered and SENT, 4 SUPPRESSED", len(delivered), e.statuses(t))
	}

	// Replayed, the suppressed codes are duplicates: nothing is sent, nothing changes.
	var suppressed []kafka.Message
	for _, m := range msgs {
		if n, _ := e.recorded(t, keyOf(m)); n != nil && n.status == "SUPPRESSED" {
			suppressed = append(suppressed, m)
		}
	}
	e.kafka.Produce(t, smsTopic, suppressed...)
	waitFor(t, "the replay finished", func() bool {
		return e.committed(t) == 9 && outcomes(t, reg1, reg2)["duplicate"] == 4
	})
	if got := outcomes(t, reg1, reg2); got["applied"] != 1 || got["suppressed"] != 4 || got["dead_lettered"] != 0 {
		t.Fatalf("outcomes after the replay %v, want 1 applied, 4 suppressed, 4 duplicates", got)
	}
	for _, m := range suppressed {
		if got := e.provider.Calls(keyOf(m)); got != 0 {
			t.Fatalf("%s: %d calls, want none", keyOf(m), got)
		}
	}
	if n := len(e.provider.Delivered()); n != 1 || e.deadLetters(t) != 0 {
		t.Fatalf("%d delivered, %d dead letters after the replay; want 1 and none", n, e.deadLetters(t))
	}
}

// keyOf is the event id of a message of code.
func keyOf(m kafka.Message) string {
	var event struct {
		ID string `json:"event_id"`
	}
	_ = json.Unmarshal(m.Value, &event)
	return event.ID
}
