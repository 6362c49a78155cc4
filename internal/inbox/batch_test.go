package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// recordEach is a batch effect that writes the key of each claimed message into the effects table,
// in the order it is given them, and reports what it was given in claimed.
func recordEach(msgs []inbox.Message, claimed *[]int) inbox.BatchEffect {
	return func(ctx context.Context, tx pgx.Tx, indexes []int) []error {
		*claimed = slices.Clone(indexes)
		results := make([]error, len(indexes))
		for j, i := range indexes {
			results[j] = record(msgs[i].Key)(ctx, tx)
		}
		return results
	}
}

// withValue returns msg with the fingerprint of another value.
func withValue(msg inbox.Message, value string) inbox.Message {
	msg.Fingerprint = inbox.Fingerprint([]byte(value))
	return msg
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Outcomes", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// Recorded before the batch: "dup" with the same payload, "reused" with another.
		for _, key := range []string{"dup", "reused"} {
			if _, err := e.store.Process(ctx, message(key), record(key)); err != nil {
				t.Fatal(err)
			}
		}
		msgs := []inbox.Message{
			message("b"),                        // new
			message("dup"),                      // recorded, same payload
			message("a"),                        // new
			withValue(message("reused"), "v2"),  // recorded, another payload
			message("b"),                        // earlier in the batch, same payload
			withValue(message("a"), "other"),    // earlier in the batch, another payload
			message("c"),                        // new
			withValue(message("reused"), "v2"),  // recorded, another payload, twice
			withValue(message("new2"), "first"), // new ...
			withValue(message("new2"), "first"), // ... and again
		}
		var claimed []int
		got, err := e.store.ProcessBatch(ctx, msgs, recordEach(msgs, &claimed))
		if err != nil {
			t.Fatal(err)
		}
		want := []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Applied, inbox.KeyReused, inbox.Duplicate,
			inbox.KeyReused, inbox.Applied, inbox.KeyReused, inbox.Applied, inbox.Duplicate}
		if !slices.Equal(got, want) {
			t.Fatalf("outcomes = %v, want %v", got, want)
		}
		if want := []int{0, 2, 6, 8}; !slices.Equal(claimed, want) {
			t.Fatalf("the effect was given %v, want %v: the first occurrence of each new key, in order", claimed, want)
		}
		if got, want := e.effects(t), []string{"dup", "reused", "b", "a", "c", "new2"}; !slices.Equal(got, want) {
			t.Fatalf("effects = %q, want %q", got, want)
		}
		// The first occurrence of a key is the one recorded.
		var fingerprint []byte
		if err := e.db.Pool.QueryRow(ctx, `SELECT fingerprint FROM inbox WHERE idempotency_key = 'a'`).Scan(&fingerprint); err != nil {
			t.Fatal(err)
		}
		if want := message("a").Fingerprint; string(fingerprint) != string(want[:]) {
			t.Error("key a was recorded with the fingerprint of its second occurrence")
		}

		// Redelivered, the whole batch is duplicates (and the same reuses), and the effect does not run.
		claimed = nil
		again, err := e.store.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) []error {
			t.Error("the effect ran for a batch of recorded keys")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want = []inbox.Outcome{inbox.Duplicate, inbox.Duplicate, inbox.Duplicate, inbox.KeyReused, inbox.Duplicate,
			inbox.KeyReused, inbox.Duplicate, inbox.KeyReused, inbox.Duplicate, inbox.Duplicate}
		if !slices.Equal(again, want) {
			t.Fatalf("outcomes of the redelivery = %v, want %v", again, want)
		}
	})

	t.Run("MatchesProcess", func(t *testing.T) {
		t.Parallel()
		// The same deliveries, by Process one at a time and by ProcessBatch, give the same outcomes.
		msgs := []inbox.Message{message("x"), message("y"), withValue(message("x"), "2"), message("x"),
			message("z"), withValue(message("y"), "2"), withValue(message("y"), "2")}
		single := setup(t, inbox.Config{})
		var want []inbox.Outcome
		for _, msg := range msgs {
			got, err := single.store.Process(ctx, msg, record(msg.Key))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, got)
		}
		batch := setup(t, inbox.Config{})
		var claimed []int
		got, err := batch.store.ProcessBatch(ctx, msgs, recordEach(msgs, &claimed))
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("ProcessBatch = %v, %v; Process gave %v", got, err, want)
		}
		if a, b := single.effects(t), batch.effects(t); !slices.Equal(a, b) {
			t.Fatalf("effects %q, Process wrote %q", b, a)
		}
	})

	t.Run("RecordsOrigin", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{Retention: map[string]time.Duration{"payments": 72 * time.Hour}})
		var msgs []inbox.Message
		for i := range 3 {
			msgs = append(msgs, inbox.Message{Handler: "payments", Key: "evt-" + strconv.Itoa(i),
				Fingerprint: inbox.Fingerprint([]byte{byte(i)}), Topic: "payments.callbacks",
				Partition: int32(i), Offset: 1234567890123 + int64(i)})
		}
		var claimed []int
		if _, err := e.store.ProcessBatch(ctx, msgs, recordEach(msgs, &claimed)); err != nil {
			t.Fatal(err)
		}
		rows, _ := e.db.Pool.Query(ctx, `
			SELECT handler, idempotency_key, fingerprint, topic, "partition", "offset",
			       (extract(epoch FROM expires_at - processed_at) * 1e6)::bigint
			FROM inbox ORDER BY idempotency_key`)
		var got []inbox.Message
		var key, handler, topic string
		var fingerprint []byte
		var partition int32
		var offset, retention int64
		_, err := pgx.ForEachRow(rows, []any{&handler, &key, &fingerprint, &topic, &partition, &offset, &retention}, func() error {
			got = append(got, inbox.Message{Handler: handler, Key: key, Fingerprint: [32]byte(fingerprint),
				Topic: topic, Partition: partition, Offset: offset})
			if d := time.Duration(retention) * time.Microsecond; d != 72*time.Hour {
				t.Errorf("%s: expires_at - processed_at = %s, want 72h", key, d)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, msgs) {
			t.Fatalf("inbox rows = %+v, want %+v", got, msgs)
		}
	})

	t.Run("AlreadyApplied", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		msgs := []inbox.Message{message("a"), message("b"), message("c")}
		got, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			if err := record("looked at b")(ctx, tx); err != nil {
				t.Fatal(err)
			}
			return []error{nil, fmt.Errorf("paid by the same transaction: %w", inbox.ErrAlreadyApplied), nil}
		})
		if want := []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Applied}; err != nil || !slices.Equal(got, want) {
			t.Fatalf("got %v, %v; want %v", got, err, want)
		}
		if got := e.keys(t); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("inbox keys = %q, want all three: a duplicate's key commits", got)
		}
		if got := e.effects(t); !slices.Equal(got, []string{"looked at b"}) {
			t.Fatalf("effects = %q: the effect's writes commit", got)
		}
	})

	t.Run("EffectFails", func(t *testing.T) {
		t.Parallel()
		errBoom := fault.Permanent(inboxtype.InvalidPayload, errors.New("boom"))
		tests := []struct {
			name      string
			results   func(claimed []int) []error
			wantIndex int
			wantErr   error
		}{
			{"FirstFailureCounts", func(claimed []int) []error {
				return []error{nil, errBoom, errEffect, nil}
			}, 2, errBoom}, // claimed are 0, 2, 3, 4: message 1 is a duplicate of 0
			{"LaterResultsUnset", func(claimed []int) []error {
				return []error{nil, nil, nil, errEffect}
			}, 4, errEffect},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, inbox.Config{})
				msgs := []inbox.Message{message("a"), message("a"), message("b"), message("c"), message("d")}
				_, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
					for _, i := range claimed {
						if err := record(msgs[i].Key)(ctx, tx); err != nil {
							t.Fatal(err)
						}
					}
					return tt.results(claimed)
				})
				var be *inbox.BatchError
				if !errors.As(err, &be) || be.Index != tt.wantIndex || !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v, want a *BatchError at %d wrapping %v", err, tt.wantIndex, tt.wantErr)
				}
				e.assertNothingRecorded(t)
				e.assertRetryApplies(t, "a")
			})
		}
	})

	t.Run("PostgresErrorClassified", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		msgs := []inbox.Message{message("a"), message("b")}
		_, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return []error{nil, err}
		})
		var be *inbox.BatchError
		if !errors.As(err, &be) || be.Index != 1 {
			t.Fatalf("got %v, want a *BatchError at 1", err)
		}
		if kind := faultKind(err); kind != fault.KindPermanent {
			t.Errorf("division by zero classified %v, want permanent", kind)
		}
		_, err = e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return []error{err, nil}
		})
		if !errors.As(err, &be) || be.Index != 0 || faultKind(err) != fault.KindUnavailable {
			t.Fatalf("got %v (%v), want an unavailable *BatchError at 0", err, faultKind(err))
		}
		e.assertNothingRecorded(t)
	})

	t.Run("CommitFails", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		e.exec(t, `CREATE TABLE parents (id int PRIMARY KEY);
			CREATE TABLE children (parent_id int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`)
		msgs := []inbox.Message{message("a"), message("b")}
		_, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			_, err := tx.Exec(ctx, `INSERT INTO children VALUES (1)`)
			return []error{nil, err}
		})
		var be *inbox.BatchError
		if err == nil || errors.As(err, &be) {
			t.Fatalf("got %v, want an error of the commit, which no one message is to blame for", err)
		}
		e.assertNothingRecorded(t)
	})

	t.Run("WrongNumberOfResults", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		msgs := []inbox.Message{message("a"), message("b")}
		_, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			return []error{record("a")(ctx, tx)}
		})
		var be *inbox.BatchError
		if err == nil || errors.As(err, &be) {
			t.Fatalf("got %v, want an error that is not a *BatchError", err)
		}
		e.assertNothingRecorded(t)
	})

	t.Run("EffectPanics", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the effect's panic", r)
				}
			}()
			_, _ = e.store.ProcessBatch(ctx, []inbox.Message{message("a")}, func(ctx context.Context, tx pgx.Tx, _ []int) []error {
				if err := record("panicked")(ctx, tx); err != nil {
					t.Fatal(err)
				}
				panic("boom")
			})
		}()
		if n := e.pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still acquired after the panic", n)
		}
		e.assertNothingRecorded(t)
	})

	t.Run("Rejects", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		other := message("b")
		other.Handler = "other"
		for name, msgs := range map[string][]inbox.Message{
			"NoKey":         {message("a"), {Handler: "h"}},
			"NoHandler":     {{Key: "k"}},
			"OtherHandlers": {message("a"), other},
		} {
			if got, err := e.store.ProcessBatch(ctx, msgs, recordEach(msgs, new([]int))); err == nil {
				t.Errorf("%s: ProcessBatch = %v, nil; want an error", name, got)
			}
		}
		if got, err := e.store.ProcessBatch(ctx, nil, nil); err != nil || len(got) != 0 {
			t.Errorf("ProcessBatch(nil) = %v, %v; want nothing", got, err)
		}
		e.assertNothingRecorded(t)
	})
}

// TestProcessBatchConcurrent races batches over overlapping keys, in opposite orders, and single
// messages over the same keys: each key's effect runs once, and no batch fails.
func TestProcessBatchConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	const n, racers = 200, 6
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
	}
	var mu sync.Mutex
	applied := map[string]int{}
	var wg sync.WaitGroup
	for r := range racers {
		wg.Go(func() {
			order := slices.Clone(keys)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			msgs := make([]inbox.Message, 0, n)
			for _, k := range order[r*10:] { // overlapping, not identical
				msgs = append(msgs, message(k))
			}
			outcomes, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
				results := make([]error, len(claimed))
				for j, i := range claimed {
					results[j] = record(msgs[i].Key)(ctx, tx)
				}
				return results
			})
			if err != nil {
				t.Errorf("racer %d: %v", r, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, o := range outcomes {
				if o == inbox.Applied {
					applied[msgs[i].Key]++
				}
			}
		})
	}
	for _, k := range keys[:50] {
		wg.Go(func() {
			outcome, err := e.store.Process(ctx, message(k), record(k))
			if err != nil {
				t.Errorf("Process %s: %v", k, err)
				return
			}
			if outcome == inbox.Applied {
				mu.Lock()
				defer mu.Unlock()
				applied[k]++
			}
		})
	}
	wg.Wait()

	want := map[string]int{}
	for _, k := range keys {
		want[k] = 1
	}
	if !maps.Equal(applied, want) {
		t.Errorf("Applied outcomes per key = %v, want each key once", applied)
	}
	effects := map[string]int{}
	for _, k := range e.effects(t) {
		effects[k]++
	}
	if !maps.Equal(effects, want) {
		t.Errorf("effects per key = %v, want each key once", effects)
	}
}
