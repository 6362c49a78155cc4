package consumer_test

import (
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestRedelivery(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		config := e.config(&recorder{})
		c, _ := e.start(config)

		m := kafka.Message{Key: []byte("order-1"), Value: eventValue("k", 0)}
		e.kafka.Produce(t, topic, m, m, m)
		e.waitFor("three offsets committed", func() bool { return e.committed() == 3 })

		if !c.Ready() {
			t.Error("Ready() = false while consuming")
		}
		if got := e.effects(); got["k"] != 1 || len(got) != 1 {
			t.Errorf("effects = %v, want k applied once", got)
		}
		if applied, dup := outcomes(config, "applied"), outcomes(config, "duplicate"); applied != 1 || dup != 2 {
			t.Errorf("outcomes: applied %v, duplicate %v; want 1, 2", applied, dup)
		}
	})
}

// TestRetry covers each way a handler can fail: what the message becomes, and that the partition
// moves on to the next message.
func TestRetry(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		// fail is the handler's answer to the first message, by attempt.
		fail        func(attempt int) error
		maxElapsed  time.Duration
		wantApplied bool
		wantReason  inboxtype.Reason
		wantError   string
		// wantRetries is how many retries are counted and logged; -1 for at least one (a retry
		// budget running out).
		wantRetries float64
	}{
		{
			name: "RetryableThenApplied",
			fail: func(attempt int) error {
				if attempt <= 2 {
					return fault.Retryable(errBoom)
				}
				return nil
			},
			wantApplied: true,
			wantRetries: 2,
		},
		{
			name:       "Permanent",
			fail:       func(int) error { return fault.Permanent(inboxtype.InvalidPayload, errBoom) },
			wantReason: inboxtype.InvalidPayload,
			wantError:  "boom",
		},
		{
			name: "LongError",
			fail: func(int) error {
				return fault.Permanent(inboxtype.InvalidPayload, errors.New(strings.Repeat("boom ", 20000)))
			},
			wantReason: inboxtype.InvalidPayload,
			wantError:  "boom boom",
		},
		{
			name:       "Unclassified",
			fail:       func(int) error { return errBoom },
			wantReason: inboxtype.HandlerError,
			wantError:  "boom",
		},
		{
			name:        "RetriesExhausted",
			wantRetries: -1,
			fail:        func(int) error { return fault.Retryable(errBoom) },
			maxElapsed:  time.Second, // time for a retry or more even when an attempt is slow
			wantReason:  inboxtype.RetriesExhausted,
			wantError:   "boom",
		},
		{
			name:        "RetriesExhaustedWithReason",
			wantRetries: -1,
			fail:        func(int) error { return fault.RetryableUntil(reasonUnknownOrder, errBoom) },
			maxElapsed:  time.Second, // time for a retry or more even when an attempt is slow
			wantReason:  reasonUnknownOrder,
			wantError:   "boom",
		},
		{
			name:       "Panic",
			fail:       func(int) error { panic("handler bug") },
			wantReason: inboxtype.HandlerError,
			wantError:  "panic: handler bug",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			forEachMode(t, func(t *testing.T, mode testMode) {
				e := setup(t, mode, 1)
				var runs atomic.Int64 // the handler's runs for the first message
				config := e.config(&recorder{fail: func(d inbox.Delivery) error {
					if d.Key == "first" {
						runs.Add(1)
						return tt.fail(d.Attempt)
					}
					return nil
				}})
				if tt.maxElapsed > 0 {
					config.Retry.MaxElapsed = tt.maxElapsed
				}
				e.start(config)

				original := kafka.Message{
					Key:     []byte("order-1"),
					Value:   eventValue("first", 0),
					Headers: []kafka.Header{{Key: "trace-id", Value: []byte("abc")}},
				}
				e.kafka.Produce(t, topic, original, kafka.Message{Key: []byte("order-2"), Value: eventValue("second", 1)})
				e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })

				effects := e.effects()
				if effects["second"] != 1 {
					t.Errorf("the next message was applied %d times, want once", effects["second"])
				}
				retries := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic))
				if tt.wantRetries >= 0 && retries != tt.wantRetries || tt.wantRetries < 0 && retries < 1 {
					t.Errorf("retries = %v, want %v (-1: at least one)", retries, tt.wantRetries)
				}
				checkRetryLogs(t, e, "first", int(retries))
				if tt.wantApplied {
					if effects["first"] != 1 || outcomes(config, "applied") != 2 {
						t.Errorf("first applied %d times (applied outcomes %v), want once (2)", effects["first"], outcomes(config, "applied"))
					}
					return
				}

				if effects["first"] != 0 || e.inboxKeys()["first"] != 0 {
					t.Errorf("a dead-lettered message left an effect (%d) or an inbox row (%d)", effects["first"], e.inboxKeys()["first"])
				}
				if got := outcomes(config, "dead_lettered"); got != 1 {
					t.Errorf("dead_lettered = %v, want 1", got)
				}
				dead := e.deadLetters()
				if len(dead) != 1 {
					t.Fatalf("%d dead letters, want 1", len(dead))
				}
				checkDeadLetter(t, dead[0], original, tt.wantReason, tt.wantError)
				if n := len(kafkatest.Header(dead[0], "dlq-error")); n > 8<<10 {
					t.Errorf("dlq-error is %d bytes long, want it bounded (at most 8 KiB)", n)
				}
				if got := kafkatest.Header(dead[0], "dlq-attempts"); got != strconv.FormatInt(runs.Load(), 10) {
					t.Errorf("dlq-attempts = %q, the handler ran %d times", got, runs.Load())
				}
			})
		})
	}
}

// TestRetryAfter checks that a retryable error's RetryAfter is the least delay before the next
// attempt, and that one longer than what is left of the retry budget dead-letters the message at
// once rather than holding its partition.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	const retryAfter = 300 * time.Millisecond
	errBoom := errors.New("boom")
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		var mu sync.Mutex
		attempts := map[string][]time.Time{}
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			mu.Lock()
			attempts[d.Key] = append(attempts[d.Key], time.Now())
			mu.Unlock()
			switch {
			case d.Key == "throttled" && d.Attempt == 1:
				return &fault.Error{Kind: fault.KindRetryable, RetryAfter: retryAfter, Err: errBoom}
			}
			return nil
		}})
		e.start(config)
		e.produce("throttled", "after")
		e.waitFor("every offset committed", func() bool { return e.committed() == 2 })

		mu.Lock()
		defer mu.Unlock()
		// In a batch, the first failure may come from the batch's run: count from the last run
		// before the successful one.
		throttled := attempts["throttled"]
		if n := len(throttled); n < 2 || throttled[n-1].Sub(throttled[n-2]) < retryAfter {
			t.Errorf("throttled message's attempts %v: want the last two at least %s apart", throttled, retryAfter)
		}
		if effects := e.effects(); effects["throttled"] != 1 || effects["after"] != 1 {
			t.Errorf("effects = %v, want throttled and after once", effects)
		}
		// The delay the worker decided, as it logged it: the Retry-After, not the backoff's 1ms.
		if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != 1 {
			t.Errorf("retries = %v, want 1 (the throttled message's)", got)
		}
		checkRetryLogs(t, e, "throttled", 1)
		if logs := e.retryLogs("throttled"); len(logs) == 1 && logs[0].Attrs["delay"].Duration() < retryAfter {
			t.Errorf("the throttled message's retry was logged with delay %v, want at least its Retry-After %v",
				logs[0].Attrs["delay"], retryAfter)
		}
		if dead := e.deadLetters(); len(dead) != 0 {
			t.Fatalf("dead letters %v, want none", dead)
		}
	})
}

// checkRetryLogs checks that each of the n retries of the message whose idempotency key is key was
// logged with its attempt (1, 2, … in order) and a positive delay.
func checkRetryLogs(t *testing.T, e *env, key string, n int) {
	t.Helper()
	logs := e.retryLogs(key)
	if len(logs) != n {
		t.Errorf("%d retries of %s logged with attempt and delay, want %d", len(logs), key, n)
	}
	for i, r := range logs {
		if delay := r.Attrs["delay"]; delay.Kind() != slog.KindDuration || delay.Duration() <= 0 {
			t.Errorf("retry %d of %s logged with delay %v, want a positive duration", i+1, key, delay)
		}
		if i > 0 && r.Attrs["attempt"].Int64() <= logs[i-1].Attrs["attempt"].Int64() {
			t.Errorf("retries of %s logged with attempts %v then %v, want them rising", key,
				logs[i-1].Attrs["attempt"], r.Attrs["attempt"])
		}
	}
}

// checkDeadLetter checks every header of a dead letter of the first message of a partition.
func checkDeadLetter(t *testing.T, got, original kafka.Message, reason inboxtype.Reason, errText string) {
	t.Helper()
	if string(got.Key) != string(original.Key) || string(got.Value) != string(original.Value) {
		t.Errorf("dead letter key/value = %q/%q, want the original %q/%q", got.Key, got.Value, original.Key, original.Value)
	}
	for _, h := range original.Headers {
		if kafkatest.Header(got, h.Key) != string(h.Value) {
			t.Errorf("original header %s = %q, want %q", h.Key, kafkatest.Header(got, h.Key), h.Value)
		}
	}
	want := map[string]string{
		deadletter.HeaderReason:            string(reason),
		deadletter.HeaderOriginalTopic:     topic,
		deadletter.HeaderOriginalPartition: "0",
		deadletter.HeaderOriginalOffset:    "0",
	}
	for k, v := range want {
		if kafkatest.Header(got, k) != v {
			t.Errorf("header %s = %q, want %q", k, kafkatest.Header(got, k), v)
		}
	}
	if !strings.Contains(kafkatest.Header(got, deadletter.HeaderError), errText) {
		t.Errorf("header dlq-error = %q, want it to contain %q", kafkatest.Header(got, deadletter.HeaderError), errText)
	}
	if n, err := strconv.Atoi(kafkatest.Header(got, deadletter.HeaderAttempts)); err != nil || n < 1 {
		t.Errorf("header dlq-attempts = %q, want a positive count", kafkatest.Header(got, deadletter.HeaderAttempts))
	}
	at, err := time.Parse(time.RFC3339, kafkatest.Header(got, deadletter.HeaderFailedAt))
	if err != nil || time.Since(at) > time.Hour || time.Since(at) < -time.Minute {
		t.Errorf("header dlq-failed-at = %q (%v), want the RFC 3339 time of the failure", kafkatest.Header(got, deadletter.HeaderFailedAt), err)
	}
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	forEachMode(t, testBadKeys)
}

func testBadKeys(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	config := e.config(&recorder{})
	e.start(config)

	msgs := []kafka.Message{
		{Value: []byte(`{"no":"key"}`)},
		{Value: []byte(`{"event_id":"ctl\u0007"}`)},
		{Value: []byte(`{"event_id":"x"}`), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(strings.Repeat("k", 256))}}},
		{Value: []byte(`{"event_id":"x"}`), Headers: []kafka.Header{{Key: "X-Idempotent-Key", Value: []byte{0xff}}}},
		{Value: []byte(`{"event_id":"reused","v":1}`)},
		{Value: []byte(`{"event_id":"reused","v":2}`)},
		{Value: []byte(`{"event_id":"last"}`)},
	}
	wantReasons := []inboxtype.Reason{
		inboxtype.MissingIdempotencyKey, inboxtype.InvalidIdempotencyKey, inboxtype.InvalidIdempotencyKey,
		inboxtype.InvalidIdempotencyKey, "", inboxtype.IdempotencyKeyReused, "",
	}
	e.kafka.Produce(t, topic, msgs...)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(msgs)) })

	var got []inboxtype.Reason
	for _, m := range e.deadLetters() {
		reason := kafkatest.Header(m, deadletter.HeaderReason)
		got = append(got, inboxtype.Reason(reason))
		// No handler ran for a bad key, nor for a reused one: the claim catches it before.
		if n := kafkatest.Header(m, deadletter.HeaderAttempts); n != "0" {
			t.Errorf("%s: dlq-attempts = %q, want 0: no handler ran", reason, n)
		}
	}
	if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != 0 {
		t.Errorf("retries = %v, want none", got)
	}
	var want []inboxtype.Reason
	for _, r := range wantReasons {
		if r != "" {
			want = append(want, r)
		}
	}
	if mode.order == consumer.ByKey {
		// Messages with neither a Kafka key nor a valid idempotency key run in any order.
		slices.Sort(got)
		slices.Sort(want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("dead-letter reasons = %v, want %v", got, want)
	}
	if keys := e.inboxKeys(); len(keys) != 2 || keys["reused"] != 1 || keys["last"] != 1 {
		t.Errorf("inbox keys = %v, want only reused and last", keys)
	}
	if effects := e.effects(); len(effects) != 2 || effects["reused"] != 1 || effects["last"] != 1 {
		t.Errorf("effects = %v, want reused and last once", effects)
	}
}

// TestOrdering checks that one key's messages are applied in offset order, retries in between
// included.
func TestOrdering(t *testing.T) {
	t.Parallel()
	forEachMode(t, testOrdering)
}

func testOrdering(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	var mu sync.Mutex
	failed := make(map[string]bool)
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		// Every third message fails once.
		if n, _ := strconv.Atoi(strings.TrimPrefix(d.Key, "seq-")); n%3 == 0 && !failed[d.Key] {
			failed[d.Key] = true
			return fault.Retryable(errors.New("not yet"))
		}
		return nil
	}})
	e.start(config)
	const n = 60
	e.produceOrdered("order-1", keys("seq", n)...)
	e.waitFor("all offsets committed", func() bool { return e.committed() == n })

	rows, err := e.db.Pool.Query(t.Context(), `SELECT key FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var order []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		order = append(order, k)
	}
	if !slices.Equal(order, keys("seq", n)) {
		t.Errorf("applied in order %v, want %v", order, keys("seq", n))
	}
	if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != n/3 {
		t.Errorf("retries = %v, want %d", got, n/3)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	log := testlog.New(t)
	valid := func() consumer.Config {
		c := testConfig("127.0.0.1:1", lazyPool(t), nil, &recorder{}, testMode{tx: consumer.PerBatch}, log)
		c.Store = &inbox.Store{}
		return c
	}
	tests := []struct {
		name   string
		modify func(*consumer.Config)
		want   string
	}{
		{"NoBrokers", func(c *consumer.Config) { c.Brokers = nil }, "Config.Brokers"},
		{"NoRoutes", func(c *consumer.Config) { c.Routes = nil }, "Config.Routes"},
		{"NoTopic", func(c *consumer.Config) { c.Routes[0].Topic = "" }, "Config.Routes[0].Topic"},
		{"NoName", func(c *consumer.Config) { c.Routes[0].Name = "" }, "Config.Routes[0].Name"},
		{"NoHandler", func(c *consumer.Config) { c.Routes[0].Handler = nil }, "Config.Routes[0] needs a Handler"},
		{"TopicTwice", func(c *consumer.Config) { c.Routes = append(c.Routes, c.Routes[0]) }, "Config.Routes[1].Topic"},
		{"ConsumesDLQ", func(c *consumer.Config) {
			c.Routes = append(c.Routes, consumer.Route{Topic: dlqTopic, Name: "dlq", Handler: &recorder{}})
		}, "Config.Routes[0].Topic"},
		{"ShortSession", func(c *consumer.Config) { c.SessionTimeout = time.Millisecond }, "Config.SessionTimeout"},
		{"NegativeRetry", func(c *consumer.Config) { c.Retry.MaxElapsed = -time.Second }, "Config.Retry.MaxElapsed"},
		{"MaxBelowInitial", func(c *consumer.Config) { c.Retry.MaxInterval = time.Microsecond }, "Config.Retry.MaxInterval"},
		{"NegativeBatch", func(c *consumer.Config) { c.BatchSize = -1 }, "Config.BatchSize"},
		{"UnknownTransactions", func(c *consumer.Config) { c.Transactions = 7 }, "Config.Transactions"},
		{"UnknownOrdering", func(c *consumer.Config) { c.Ordering = 7 }, "Config.Ordering"},
		{"NegativeInFlight", func(c *consumer.Config) { c.MaxInFlight = -1 }, "Config.MaxInFlight"},
		{"NegativeConcurrency", func(c *consumer.Config) { c.Routes[0].Concurrency = -1 }, "Config.Routes[0].Concurrency"},
		{"NameTwice", func(c *consumer.Config) {
			c.Routes = append(c.Routes, consumer.Route{Topic: "other", Name: c.Routes[0].Name, Handler: &recorder{}})
		}, "Config.Routes[1].Name"},
		{"BadTopicName", func(c *consumer.Config) { c.Routes[0].Topic = "bad topic!" }, "Config.Routes[0].Topic"},
		{"DotTopic", func(c *consumer.Config) { c.Routes[0].Topic = ".." }, "Config.Routes[0].Topic"},
		{"LongDeadLetterTopic", func(c *consumer.Config) { c.Routes[0].Topic = strings.Repeat("t", 247) }, "Config.Routes[0].Topic"},
		{"BadSuffix", func(c *consumer.Config) { c.DLQSuffix = "/dlq" }, "Config.DLQSuffix"},
		{"CallLeaseOnHandler", func(c *consumer.Config) { c.Routes[0].CallLease = time.Minute }, "Config.Routes[0].CallLease"},
		{"RateLimitNaN", func(c *consumer.Config) {
			c.Routes[0].Handler, c.Routes[0].Call = nil, newCaller(nil)
			c.Routes[0].RateLimit = math.NaN()
		}, "Config.Routes[0].RateLimit"},
		{"CallLeaseOutlastsAttempt", func(c *consumer.Config) {
			c.Routes[0].Handler, c.Routes[0].Call = nil, newCaller(nil)
			c.Routes[0].CallLease = time.Minute
		}, "Config.Routes[0].CallLease"},
		{"RateLimitInf", func(c *consumer.Config) {
			c.Routes[0].Handler, c.Routes[0].Call = nil, newCaller(nil)
			c.Routes[0].RateLimit = math.Inf(1)
		}, "Config.Routes[0].RateLimit"},
		{"RateLimitTiny", func(c *consumer.Config) {
			c.Routes[0].Handler, c.Routes[0].Call = nil, newCaller(nil)
			c.Routes[0].RateLimit = 1e-12 // a call in 30,000 years
		}, "Config.Routes[0].RateLimit"},
		{"RateLimitHuge", func(c *consumer.Config) {
			c.Routes[0].Handler, c.Routes[0].Call = nil, newCaller(nil)
			c.Routes[0].RateLimit = 1e12
		}, "Config.Routes[0].RateLimit"},
		{"NoStore", func(c *consumer.Config) { c.Store = nil }, "Config.Store"},
		{"NoDeadLetters", func(c *consumer.Config) { c.DeadLetters = nil }, "Config.DeadLetters"},
	}
	if _, err := consumer.New(valid()); err != nil {
		t.Fatalf("New(valid config) = %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := valid()
			tt.modify(&config)
			_, err := consumer.New(config)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New() = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// TestLongRetryAfter: a provider answering 429 with a Retry-After longer than the retry budget
// throttles the route for that long; the wait is the provider's, not the messages' fault, and
// none of them is dead-lettered for it.
func TestLongRetryAfter(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 2)
		var calls atomic.Int64
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			calls.Add(1)
			return fault.RetryableAfter(errors.New("sms provider: 429 Too Many Requests"), 10*time.Minute)
		}})
		parkSoon(&config)
		config.Retry.MaxElapsed = 300 * time.Millisecond
		e.produce(keys("m", 30)...)
		e.start(config)
		e.waitFor("a call", func() bool { return calls.Load() > 0 })
		time.Sleep(5 * config.Retry.MaxElapsed)
		if dead := e.deadLetters(); len(dead) != 0 {
			t.Fatalf("%d dead-lettered (%s) while the provider asked to wait", len(dead), kafkatest.Header(dead[0], "dlq-error"))
		}
		if n := calls.Load(); n > int64(routeConcurrency) {
			t.Errorf("%d calls: the route was not paused for the Retry-After", n)
		}
		if v := routePaused(config, "retry_after"); v != 1 {
			t.Errorf("route_paused{retry_after} = %v while the provider asked to wait, want 1", v)
		}
	})
}
