package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
)

// The tests of what is particular to batches. The rest of the suite runs in both modes.

// batchSpy is a recorder that remembers the keys of every batch it was given.
type batchSpy struct {
	recorder
	mu      sync.Mutex
	batches [][]string
}

func (h *batchSpy) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	keys := make([]string, len(ds))
	for i, d := range ds {
		keys[i] = d.Key
	}
	h.mu.Lock()
	h.batches = append(h.batches, keys)
	h.mu.Unlock()
	return h.recorder.HandleBatch(ctx, tx, ds)
}

// firstBatch returns the keys of the first batch the handler was given.
func (h *batchSpy) firstBatch() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.batches) == 0 {
		return nil
	}
	return h.batches[0]
}

// runBatch produces msgs to a one-partition topic, then consumes them with h in PerBatch mode,
// with a BatchWait long enough for all of them to be fetched as one batch, until every offset is
// committed.
func runBatch(t *testing.T, h inboxtype.Handler, msgs ...kafka.Message) (*env, consumer.Config) {
	t.Helper()
	e := setup(t, testMode{tx: consumer.PerBatch}, 1)
	e.kafka.Produce(t, topic, msgs...)
	config := e.config(h)
	config.BatchWait = time.Second
	e.start(config)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(msgs)) })
	return e, config
}

func messages(keys ...string) []kafka.Message {
	msgs := make([]kafka.Message, len(keys))
	for i, k := range keys {
		msgs[i] = kafka.Message{Key: []byte("order-" + k), Value: eventValue(k, i)}
	}
	return msgs
}

// appliedInOrder returns the keys of the effects, in the order they were applied.
func (e *env) appliedInOrder() []string {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT key FROM effects ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return order
}

// TestBatchFailure fails one message in the middle of a batch: the others are applied exactly once,
// in offset order, and the failed one gets the per-message rules.
func TestBatchFailure(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		// fail is the handler's answer to "mid", by attempt.
		fail        func(attempt int) error
		wantApplied bool
		wantReason  inboxtype.Reason
		wantError   string
		wantRetries float64
		// wantAttempts is the dead letter's count of runs of mid's handler.
		wantAttempts string
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
			name:         "Permanent",
			fail:         func(int) error { return fault.Permanent(inboxtype.InvalidPayload, errBoom) },
			wantReason:   inboxtype.InvalidPayload,
			wantError:    "boom",
			wantAttempts: "2", // in the batch, then alone to confirm
		},
		{
			name:         "Panic",
			fail:         func(int) error { panic("handler bug") },
			wantReason:   inboxtype.HandlerError,
			wantError:    "panic: handler bug",
			wantAttempts: "2", // a panic in a batch is no one message's: each is run again alone
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var midAttempts []int
			h := &batchSpy{recorder: recorder{fail: func(d inbox.Delivery) error {
				if d.Key != "mid" {
					return nil
				}
				mu.Lock()
				midAttempts = append(midAttempts, d.Attempt)
				mu.Unlock()
				return tt.fail(d.Attempt)
			}}}
			all := []string{"a", "b", "c", "mid", "d", "e", "f"}
			e, config := runBatch(t, h, messages(all...)...)

			if got := h.firstBatch(); !slices.Equal(got, all) {
				t.Fatalf("first batch = %v, want all of %v: the test does not test a batch", got, all)
			}
			want := slices.DeleteFunc(slices.Clone(all), func(k string) bool { return k == "mid" && !tt.wantApplied })
			if got := e.appliedInOrder(); !slices.Equal(got, want) {
				t.Errorf("applied %v, want each of %v once, in offset order", got, want)
			}
			if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != tt.wantRetries {
				t.Errorf("retries = %v, want %v", got, tt.wantRetries)
			}
			if tt.wantRetries > 0 && !slices.Equal(midAttempts, []int{1, 2, 3}) {
				t.Errorf("mid's attempts = %v, want 1 (in the batch), 2, 3", midAttempts)
			}
			if got := outcomes(config, "applied"); got != float64(len(want)) {
				t.Errorf("applied outcomes = %v, want %d", got, len(want))
			}
			dead := e.deadLetters()
			if tt.wantApplied {
				if len(dead) != 0 {
					t.Errorf("%d dead letters, want none", len(dead))
				}
				return
			}
			if len(dead) != 1 || kafkatest.Header(dead[0], deadletter.HeaderReason) != string(tt.wantReason) ||
				kafkatest.Header(dead[0], deadletter.HeaderOriginalOffset) != "3" || kafkatest.Header(dead[0], deadletter.HeaderAttempts) != tt.wantAttempts {
				t.Fatalf("dead letters = %v, want mid (offset 3) with reason %s after %s attempts",
					dead, tt.wantReason, tt.wantAttempts)
			}
			if got := kafkatest.Header(dead[0], deadletter.HeaderError); !strings.Contains(got, tt.wantError) {
				t.Errorf("dlq-error = %q, want it to contain %q", got, tt.wantError)
			}
			if got := outcomes(config, "dead_lettered"); got != 1 {
				t.Errorf("dead_lettered outcomes = %v, want 1", got)
			}
		})
	}
}

// TestBatchDuplicates redelivers messages inside one batch, and redelivers the whole batch.
func TestBatchDuplicates(t *testing.T) {
	t.Parallel()
	h := &batchSpy{}
	msgs := messages("a", "b", "c")
	stream := []kafka.Message{msgs[0], msgs[1], msgs[0], msgs[2], msgs[0], msgs[1]}
	e, config := runBatch(t, h, stream...)
	if got := h.firstBatch(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("first batch = %v, want the first occurrence of each key", got)
	}
	if got := e.appliedInOrder(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("applied %v, want a, b, c once", got)
	}
	if applied, dup := outcomes(config, "applied"), outcomes(config, "duplicate"); applied != 3 || dup != 3 {
		t.Errorf("outcomes: applied %v, duplicate %v; want 3, 3", applied, dup)
	}
}

// TestBatchKeyReused reuses a key with another payload inside one batch: the later message is
// dead-lettered, the others applied.
func TestBatchKeyReused(t *testing.T) {
	t.Parallel()
	h := &batchSpy{}
	reused := kafka.Message{Key: []byte("order-k"), Value: eventValue("k", 99)}
	stream := append(messages("k", "x"), reused, messages("y")[0])
	e, config := runBatch(t, h, stream...)
	if got := e.appliedInOrder(); !slices.Equal(got, []string{"k", "x", "y"}) {
		t.Errorf("applied %v, want k, x, y once", got)
	}
	dead := e.deadLetters()
	if len(dead) != 1 || kafkatest.Header(dead[0], deadletter.HeaderReason) != string(inboxtype.IdempotencyKeyReused) ||
		kafkatest.Header(dead[0], deadletter.HeaderOriginalOffset) != "2" || string(dead[0].Value) != string(reused.Value) {
		t.Fatalf("dead letters = %v, want the reused key's message (offset 2)", dead)
	}
	if applied, dl := outcomes(config, "applied"), outcomes(config, "dead_lettered"); applied != 3 || dl != 1 {
		t.Errorf("outcomes: applied %v, dead_lettered %v; want 3, 1", applied, dl)
	}
}

// deferredFailure records like recorder, and for the key bad also writes a row that breaks a
// deferred foreign key: the statement succeeds, the commit fails.
type deferredFailure struct {
	recorder
	batched atomic.Bool // whether it was given a batch of more than one
}

func (h *deferredFailure) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	if d.Key == "bad" {
		if _, err := tx.Exec(ctx, `INSERT INTO children VALUES (1)`); err != nil {
			return err
		}
	}
	return h.recorder.Handle(ctx, tx, d)
}

func (h *deferredFailure) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	if len(ds) > 1 {
		h.batched.Store(true)
	}
	return handleEach(ctx, tx, ds, h.Handle)
}

// TestBatchCommitFails fails a batch at its commit, where no one message is to blame: its messages
// are applied one by one, and only the culprit fails.
func TestBatchCommitFails(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{tx: consumer.PerBatch}, 1)
	if _, err := e.db.Pool.Exec(t.Context(), `CREATE TABLE parents (id int PRIMARY KEY);
		CREATE TABLE children (parent_id int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	all := []string{"a", "b", "bad", "c"}
	e.kafka.Produce(t, topic, messages(all...)...)
	h := &deferredFailure{}
	config := e.config(h)
	config.BatchWait = time.Second
	e.start(config)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })

	if !h.batched.Load() {
		t.Fatal("the handler was never given a batch: the test does not test a batch")
	}
	if got := e.appliedInOrder(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("applied %v, want a, b, c once, in order", got)
	}
	dead := e.deadLetters()
	if len(dead) != 1 || kafkatest.Header(dead[0], deadletter.HeaderOriginalOffset) != "2" || kafkatest.Header(dead[0], deadletter.HeaderReason) != string(inboxtype.HandlerError) {
		t.Fatalf("dead letters = %v, want bad (offset 2) with reason %s", dead, inboxtype.HandlerError)
	}
	if got := e.inboxKeys(); got["bad"] != 0 || len(got) != 3 {
		t.Errorf("inbox keys = %v, want a, b, c", got)
	}
}
