package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// parkLease is long enough never to lapse within a test; tests make a lease lapse with lapse.
const parkLease = time.Hour

// parked returns a message of handler "h" read from topic "t", partition 0, at offset, whose
// ordering key is orderKey and idempotency key "<orderKey>@<offset>".
func parked(orderKey string, offset int64) inbox.Parked {
	return inbox.Parked{
		Handler:        "h",
		Topic:          "t",
		Partition:      0,
		Offset:         offset,
		OrderingKey:    []byte(orderKey),
		IdempotencyKey: fmt.Sprintf("%s@%d", orderKey, offset),
		MessageKey:     []byte(orderKey),
		Value:          []byte(fmt.Sprintf(`{"order_no":%q,"offset":%d}`, orderKey, offset)),
		Headers:        []inbox.Header{{Key: "Idempotency-Key", Value: []byte(fmt.Sprintf("%s@%d", orderKey, offset))}},
	}
}

// park parks each message, due now once it is its key's head, and fails the test unless each is
// parked anew.
func (e *testEnv) park(tb testing.TB, ps ...inbox.Parked) {
	tb.Helper()
	for _, p := range ps {
		if ok, err := e.store.Park().Add(context.Background(), p, 0); err != nil || !ok {
			tb.Fatalf("Park(%s) = %t, %v; want true", p.IdempotencyKey, ok, err)
		}
	}
}

// take takes the due messages of topic "t", partition 0 for owner and returns their idempotency keys.
func (e *testEnv) take(tb testing.TB, owner string, limit int) []inbox.Parked {
	tb.Helper()
	taken, err := e.store.Park().TakeDue(context.Background(), "t", 0, owner, parkLease, limit)
	if err != nil {
		tb.Fatal(err)
	}
	return taken
}

func idempotencyKeys(ps []inbox.Parked) []string {
	keys := make([]string, len(ps))
	for i, p := range ps {
		keys[i] = p.IdempotencyKey
	}
	return keys
}

// parkedKeys returns the idempotency keys in the park, in key order.
func (e *testEnv) parkedKeys(tb testing.TB) []string {
	tb.Helper()
	return e.strings(tb, `SELECT idempotency_key FROM inbox_parked ORDER BY topic, "partition", ordering_key, "offset"`)
}

// lapse makes the claims on the parked messages of idempotency keys look as if they lapsed a second ago.
func (e *testEnv) lapse(tb testing.TB, keys ...string) {
	tb.Helper()
	e.exec(tb, `UPDATE inbox_parked SET held_until = now() - interval '1 second' WHERE idempotency_key = ANY ($1)`, keys)
}

func TestPark(t *testing.T) {
	t.Parallel()

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		failedAt := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		want := inbox.Parked{
			Handler:        "payments",
			Topic:          "payments.callbacks",
			Partition:      3,
			Offset:         1 << 40,
			OrderingKey:    []byte("A-1001\x00\xff"), // any bytes
			IdempotencyKey: "evt-1",
			MessageKey:     nil, // none
			Value:          []byte(`{"event_id":"evt-1"}`),
			Headers: []inbox.Header{
				{Key: "Idempotency-Key", Value: []byte("evt-1")},
				{Key: "empty", Value: nil},
				{Key: "binary", Value: []byte{0, 1, 0xff}},
				{Key: "Idempotency-Key", Value: []byte("evt-1 again")}, // repeated, kept in order
			},
			Attempts:      4,
			Reason:        reasonUnknownOrder,
			FirstError:    "no order A-1001",
			LastError:     "still no order A-1001",
			FirstFailedAt: failedAt,
			BudgetSpent:   1500 * time.Millisecond,
			Produced:      failedAt.Add(-time.Minute),
		}
		ok, err := e.store.Park().Add(ctx, want, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Park = %t, %v; want true", ok, err)
		}
		list, err := e.store.Park().List(ctx, "", 0)
		if err != nil || len(list) != 1 {
			t.Fatalf("List = %d messages, %v; want 1", len(list), err)
		}
		got := list[0]
		if got.ID == 0 || got.ParkedAt.IsZero() || time.Until(got.NextAttemptAt) < 59*time.Minute {
			t.Errorf("ID %d, ParkedAt %v, NextAttemptAt %v; want an id, a time and about an hour from now",
				got.ID, got.ParkedAt, got.NextAttemptAt)
		}
		want.ID, want.ParkedAt, want.NextAttemptAt = got.ID, got.ParkedAt, got.NextAttemptAt
		want.Headers[1].Value = []byte{}
		if !equalParked(got, want) {
			t.Errorf("List returned\n%+v\nwant\n%+v", got, want)
		}
		if again, err := e.store.Park().Get(ctx, got.ID); err != nil || !equalParked(again, want) {
			t.Errorf("Get = %+v, %v; want %+v", again, err, want)
		}
		if _, err := e.store.Park().Get(ctx, got.ID+1); !errors.Is(err, inbox.ErrNotParked) {
			t.Errorf("Get of another id: %v, want ErrNotParked", err)
		}
	})

	t.Run("RedeliveryParkedOnce", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		first := parked("A", 7)
		first.LastError = "first"
		e.park(t, first)
		again := parked("A", 7)
		again.LastError = "second"
		if ok, err := e.store.Park().Add(ctx, again, 0); err != nil || ok {
			t.Fatalf("Park of a redelivery = %t, %v; want false", ok, err)
		}
		if got := e.strings(t, `SELECT last_error FROM inbox_parked`); !slices.Equal(got, []string{"first"}) {
			t.Errorf("last_error %q, want the first parking's kept", got)
		}
	})

	t.Run("AnotherMessageAtTheOrigin", func(t *testing.T) {
		// Offsets that started again (a recreated topic): another message at a parked one's
		// origin is parked beside it, and the heads of the key come out oldest first.
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 7))
		other := parked("A", 7)
		other.IdempotencyKey, other.Value = "A-7-again", []byte(`{"event_id":"A-7-again"}`)
		if ok, err := e.store.Park().Add(ctx, other, 0); err != nil || !ok {
			t.Fatalf("Park of another message at a parked origin = %t, %v; want true", ok, err)
		}
		list, err := e.store.Park().List(ctx, "", 0)
		if err != nil || len(list) != 2 {
			t.Fatalf("List = %d messages, %v; want both", len(list), err)
		}
		if list[0].IdempotencyKey != "A@7" || list[1].IdempotencyKey != "A-7-again" || list[1].Ahead != 1 {
			t.Errorf("List = %q (ahead %d), %q (ahead %d); want the first parked first",
				list[0].IdempotencyKey, list[0].Ahead, list[1].IdempotencyKey, list[1].Ahead)
		}
	})

	t.Run("ErrorTextsStored", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		p := parked("A", 1)
		p.FirstError = "bad \x00 byte and \xff invalid UTF-8"
		p.LastError = strings.Repeat("é", 5000) // 10,000 bytes
		e.park(t, p)
		got, err := e.store.Park().List(ctx, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := "bad  byte and \uFFFD invalid UTF-8"; got[0].FirstError != want {
			t.Errorf("FirstError %q, want %q", got[0].FirstError, want)
		}
		if n := len(got[0].LastError); n > 4096 || n < 4094 || strings.Trim(got[0].LastError, "é") != "" {
			t.Errorf("LastError of %d bytes, want at most 4096 of whole characters", n)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		for _, p := range []inbox.Parked{
			{Topic: "t", IdempotencyKey: "k", OrderingKey: []byte("o")},
			{Handler: "h", IdempotencyKey: "k", OrderingKey: []byte("o")},
			{Handler: "h", Topic: "t", OrderingKey: []byte("o")},
			{Handler: "h", Topic: "t", IdempotencyKey: "k"},
		} {
			if _, err := e.store.Park().Add(context.Background(), p, 0); err == nil {
				t.Errorf("Park(%+v) succeeded, want an error", p)
			}
		}
	})
}

func equalParked(a, b inbox.Parked) bool {
	eqHeaders := slices.EqualFunc(a.Headers, b.Headers, func(x, y inbox.Header) bool {
		return x.Key == y.Key && string(x.Value) == string(y.Value)
	})
	eqTime := func(x, y time.Time) bool { return x.Equal(y) }
	return a.ID == b.ID && a.Handler == b.Handler && a.Topic == b.Topic && a.Partition == b.Partition &&
		a.Offset == b.Offset && string(a.OrderingKey) == string(b.OrderingKey) &&
		a.IdempotencyKey == b.IdempotencyKey && (a.MessageKey == nil) == (b.MessageKey == nil) &&
		string(a.MessageKey) == string(b.MessageKey) && string(a.Value) == string(b.Value) && eqHeaders &&
		a.Attempts == b.Attempts && a.Starts == b.Starts && a.Reason == b.Reason && a.FirstError == b.FirstError &&
		a.LastError == b.LastError && eqTime(a.FirstFailedAt, b.FirstFailedAt) &&
		a.BudgetSpent == b.BudgetSpent && eqTime(a.NextAttemptAt, b.NextAttemptAt) &&
		eqTime(a.ParkedAt, b.ParkedAt) && a.HeldBy == b.HeldBy && eqTime(a.HeldUntil, b.HeldUntil) && eqTime(a.Produced, b.Produced) &&
		a.Ahead == b.Ahead
}

func TestIsParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	other := parked("B", 5)
	other.Partition = 1
	otherTopic := parked("C", 5)
	otherTopic.Topic = "u"
	e.park(t, parked("A", 1), parked("A", 2), other, otherTopic)

	for _, c := range []struct {
		topic     string
		partition int32
		key       string
		want      bool
	}{
		{"t", 0, "A", true},
		{"t", 0, "B", false}, // parked from another partition
		{"t", 1, "B", true},
		{"t", 0, "C", false}, // parked from another topic
		{"u", 0, "C", true},
		{"t", 0, "a", false},
	} {
		got, err := e.store.Park().HasKey(ctx, c.topic, c.partition, []byte(c.key))
		if err != nil || got != c.want {
			t.Errorf("IsParked(%s, %d, %s) = %t, %v; want %t", c.topic, c.partition, c.key, got, err, c.want)
		}
	}
	keys, err := e.store.Park().Keys(ctx, "t", 0)
	if err != nil || len(keys) != 1 || string(keys[0]) != "A" {
		t.Errorf("ParkedKeys(t, 0) = %q, %v; want [A]", keys, err)
	}
	if keys, err := e.store.Park().Keys(ctx, "t", 9); err != nil || len(keys) != 0 {
		t.Errorf("ParkedKeys(t, 9) = %q, %v; want none", keys, err)
	}
}

func TestTakeDue(t *testing.T) {
	t.Parallel()

	t.Run("HeadsOnlyInKeyOrder", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		// Parked out of offset order: B's head is offset 3 whatever the order of parking.
		e.park(t, parked("A", 10), parked("B", 4), parked("A", 11), parked("B", 3), parked("C", 20))
		other := parked("D", 1)
		other.Partition = 1
		e.park(t, other)

		got := e.take(t, "o1", 10)
		if keys := idempotencyKeys(got); !slices.Equal(sorted(keys), []string{"A@10", "B@3", "C@20"}) {
			t.Fatalf("took %q, want the heads A@10, B@3, C@20", keys)
		}
		for _, p := range got {
			if p.HeldBy != "o1" || time.Until(p.HeldUntil) < 59*time.Minute {
				t.Errorf("%s claimed by %q until %v, want o1 for the lease", p.IdempotencyKey, p.HeldBy, p.HeldUntil)
			}
		}
		// Claimed: nothing more is due, the keys' next messages least of all.
		if again := e.take(t, "o2", 10); len(again) != 0 {
			t.Errorf("a second owner took %q, want nothing", idempotencyKeys(again))
		}
		// A's head leaves the park: A's next message is due.
		if _, err := e.store.Park().Process(ctx, got[slices.IndexFunc(got, isKey("A@10"))], record("A@10")); err != nil {
			t.Fatal(err)
		}
		if next := e.take(t, "o2", 10); !slices.Equal(idempotencyKeys(next), []string{"A@11"}) {
			t.Errorf("after A@10 left, took %q, want A@11", idempotencyKeys(next))
		}
	})

	t.Run("NotDueYet", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		if _, err := e.store.Park().Add(ctx, parked("A", 1), time.Hour); err != nil {
			t.Fatal(err)
		}
		e.park(t, parked("A", 2), parked("B", 3)) // A@2 is due, but behind A@1
		if got := idempotencyKeys(e.take(t, "o", 10)); !slices.Equal(got, []string{"B@3"}) {
			t.Errorf("took %q, want only B@3", got)
		}
		wait, ok, err := e.store.Park().NextDue(ctx, "t", 0)
		if err != nil || !ok || wait < 59*time.Minute || wait > time.Hour {
			t.Errorf("NextDue = %v, %t, %v; want about an hour (B@3 is claimed for longer)", wait, ok, err)
		}
		e.exec(t, `UPDATE inbox_parked SET next_attempt_at = now() - interval '1 second'`)
		if got := idempotencyKeys(e.take(t, "o", 10)); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("once due, took %q, want A@1", got)
		}
	})

	t.Run("Limit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1), parked("B", 2), parked("C", 3))
		first := e.take(t, "o", 2)
		rest := e.take(t, "o", 2)
		if len(first) != 2 || len(rest) != 1 {
			t.Errorf("took %d then %d, want 2 then 1", len(first), len(rest))
		}
	})

	t.Run("LapsedClaim", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1))
		stale := e.take(t, "dead", 1)[0]
		e.lapse(t, "A@1")
		taken := e.take(t, "alive", 1)
		if len(taken) != 1 || taken[0].HeldBy != "alive" {
			t.Fatalf("took %+v after the lease lapsed, want A@1 for alive", taken)
		}
		// The stale owner can change nothing any more, and its effect does not commit.
		if _, err := e.store.Park().Process(ctx, stale, record("stale")); !errors.Is(err, inbox.ErrHoldLost) {
			t.Errorf("ProcessParked by the stale owner: %v, want ErrClaimLost", err)
		}
		if err := e.store.Park().Reschedule(ctx, stale, inbox.ParkedFailure{Err: errors.New("x")}); !errors.Is(err, inbox.ErrHoldLost) {
			t.Errorf("Reschedule by the stale owner: %v, want ErrClaimLost", err)
		}
		if err := e.store.Park().Release(ctx, stale, 0); !errors.Is(err, inbox.ErrHoldLost) {
			t.Errorf("Release by the stale owner: %v, want ErrClaimLost", err)
		}
		if err := e.store.Park().Remove(ctx, stale); !errors.Is(err, inbox.ErrHoldLost) {
			t.Errorf("Remove by the stale owner: %v, want ErrClaimLost", err)
		}
		if got := e.effects(t); len(got) != 0 {
			t.Errorf("effects %q, want none", got)
		}
		if outcome, err := e.store.Park().Process(ctx, taken[0], record("A@1")); err != nil || outcome != inbox.Applied {
			t.Errorf("ProcessParked by the new owner = %q, %v; want applied", outcome, err)
		}
	})

	// Owners taking at once take each message once: 8 owners, 40 keys.
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		for i := range 40 {
			e.park(t, parked(fmt.Sprintf("K%02d", i), int64(i)), parked(fmt.Sprintf("K%02d", i), int64(100+i)))
		}
		var (
			mu    sync.Mutex
			taken []string
			wg    sync.WaitGroup
		)
		for o := range 8 {
			wg.Go(func() {
				for {
					got, err := e.store.Park().TakeDue(context.Background(), "t", 0, fmt.Sprintf("o%d", o), parkLease, 3)
					if err != nil {
						t.Errorf("TakeDue: %v", err)
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					taken = append(taken, idempotencyKeys(got)...)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if slices.Sort(taken); len(taken) != 40 || len(slices.Compact(slices.Clone(taken))) != 40 {
			t.Errorf("took %d messages (%d distinct), want the 40 heads once each", len(taken), len(slices.Compact(taken)))
		}
		for _, k := range taken {
			var key string
			var offset int
			if _, err := fmt.Sscanf(strings.Replace(k, "@", " ", 1), "%s %d", &key, &offset); err != nil || offset >= 100 {
				t.Errorf("took %s, which is not a head", k)
			}
		}
	})
}

func isKey(key string) func(inbox.Parked) bool {
	return func(p inbox.Parked) bool { return p.IdempotencyKey == key }
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestProcessParked(t *testing.T) {
	t.Parallel()

	t.Run("Applied", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1))
		p := e.take(t, "o", 1)[0]
		outcome, err := e.store.Park().Process(ctx, p, record("A@1"))
		if err != nil || outcome != inbox.Applied {
			t.Fatalf("ProcessParked = %q, %v; want applied", outcome, err)
		}
		if got := e.effects(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("effects %q, want A@1", got)
		}
		if got := e.keys(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("inbox keys %q, want A@1", got)
		}
		var origin string
		if err := e.db.Pool.QueryRow(ctx, `SELECT topic || '/' || "partition" || '/' || "offset" FROM inbox`).Scan(&origin); err != nil || origin != "t/0/1" {
			t.Errorf("inbox origin %q, %v; want t/0/1", origin, err)
		}
		if got := e.parkedKeys(t); len(got) != 0 {
			t.Errorf("still parked: %q", got)
		}
	})

	t.Run("EffectFails", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1))
		p := e.take(t, "o", 1)[0]
		boom := fault.RetryableUntil(reasonUnknownOrder, errors.New("no order A"))
		_, err := e.store.Park().Process(ctx, p, func(ctx context.Context, tx pgx.Tx) error {
			if err := record("A@1")(ctx, tx); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("ProcessParked: %v, want the effect's error", err)
		}
		e.assertNothingRecorded(t)
		if got := e.parkedKeys(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("parked %q, want A@1 still", got)
		}
		// Still claimed: the owner reschedules it.
		if err := e.store.Park().Reschedule(ctx, p, inbox.ParkedFailure{Err: err, Reason: reasonUnknownOrder}); err != nil {
			t.Errorf("Reschedule: %v", err)
		}
	})

	// A key applied while its message was parked (a replay, another route) resolves as a duplicate:
	// the message leaves the park, its effect not run again.
	t.Run("AppliedMeanwhile", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		p := parked("A", 1)
		e.park(t, p)
		msg := inbox.Message{Handler: "h", Key: p.IdempotencyKey, Fingerprint: inbox.Fingerprint(p.Value), Topic: "t", Offset: 99}
		if _, err := e.store.Process(ctx, msg, record("replayed")); err != nil {
			t.Fatal(err)
		}
		outcome, err := e.store.Park().Process(ctx, e.take(t, "o", 1)[0], record("parked"))
		if err != nil || outcome != inbox.Duplicate {
			t.Fatalf("ProcessParked = %q, %v; want duplicate", outcome, err)
		}
		if got := e.effects(t); !slices.Equal(got, []string{"replayed"}) {
			t.Errorf("effects %q, want the replay's only", got)
		}
		if got := e.parkedKeys(t); len(got) != 0 {
			t.Errorf("still parked: %q", got)
		}
	})

	t.Run("AlreadyAppliedByBusinessKey", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1))
		outcome, err := e.store.Park().Process(context.Background(), e.take(t, "o", 1)[0],
			func(context.Context, pgx.Tx) error { return inbox.ErrAlreadyApplied })
		if err != nil || outcome != inbox.Duplicate {
			t.Fatalf("ProcessParked = %q, %v; want duplicate", outcome, err)
		}
		if got := e.keys(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("inbox keys %q, want A@1 recorded", got)
		}
		if got := e.parkedKeys(t); len(got) != 0 {
			t.Errorf("still parked: %q", got)
		}
	})

	// A key applied before with another payload: the message stays parked, for its owner to
	// dead-letter and remove.
	t.Run("KeyReused", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		p := parked("A", 1)
		e.park(t, p)
		msg := inbox.Message{Handler: "h", Key: p.IdempotencyKey, Fingerprint: inbox.Fingerprint([]byte("other")), Topic: "t"}
		if _, err := e.store.Process(ctx, msg, record("other")); err != nil {
			t.Fatal(err)
		}
		taken := e.take(t, "o", 1)[0]
		outcome, err := e.store.Park().Process(ctx, taken, record("parked"))
		if err != nil || outcome != inbox.KeyReused {
			t.Fatalf("ProcessParked = %q, %v; want key_reused", outcome, err)
		}
		if got := e.parkedKeys(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("parked %q, want A@1 still", got)
		}
		if err := e.store.Park().Remove(ctx, taken); err != nil {
			t.Errorf("Remove: %v", err)
		}
		if got := e.parkedKeys(t); len(got) != 0 {
			t.Errorf("still parked after Remove: %q", got)
		}
	})

	t.Run("UnparkTxRollsBack", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := setup(t, inbox.Config{})
		e.park(t, parked("A", 1))
		p := e.take(t, "o", 1)[0]
		rollback := errors.New("rollback")
		err := inbox.WithTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := e.store.Park().RemoveTx(ctx, tx, p); err != nil {
				return err
			}
			return rollback
		})
		if !errors.Is(err, rollback) {
			t.Fatal(err)
		}
		if got := e.parkedKeys(t); !slices.Equal(got, []string{"A@1"}) {
			t.Errorf("parked %q, want A@1 still", got)
		}
	})
}

func TestReschedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	e.park(t, parked("A", 1))
	p := e.take(t, "o", 1)[0]
	err := e.store.Park().Reschedule(ctx, p, inbox.ParkedFailure{
		Err: errors.New("first"), Reason: reasonUnknownOrder, Spent: 300 * time.Millisecond, RetryIn: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.store.Park().Get(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 1 || got.Reason != reasonUnknownOrder || got.FirstError != "first" || got.LastError != "first" ||
		got.FirstFailedAt.IsZero() || got.BudgetSpent != 300*time.Millisecond || got.HeldBy != "" ||
		!got.HeldUntil.IsZero() || time.Until(got.NextAttemptAt) < 59*time.Minute {
		t.Errorf("after the first Reschedule: %+v", got)
	}
	if taken := e.take(t, "o", 1); len(taken) != 0 {
		t.Errorf("took %q before it is due again", idempotencyKeys(taken))
	}

	e.exec(t, `UPDATE inbox_parked SET next_attempt_at = now()`)
	p = e.take(t, "o", 1)[0]
	if err := e.store.Park().Reschedule(ctx, p, inbox.ParkedFailure{Err: errors.New("second"), Spent: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	again, err := e.store.Park().Get(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.Attempts != 2 || again.Reason != reasonUnknownOrder || again.FirstError != "first" ||
		again.LastError != "second" || !again.FirstFailedAt.Equal(got.FirstFailedAt) ||
		again.BudgetSpent != 500*time.Millisecond {
		t.Errorf("after the second Reschedule: %+v", again)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	e.park(t, parked("A", 1), parked("B", 2), parked("C", 3))
	taken := e.take(t, "o", 3)

	// An outage: the claim goes, no attempt nor budget is counted.
	if err := e.store.Park().Release(ctx, taken[0], time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := e.store.Park().Get(ctx, taken[0].ID)
	if err != nil || got.Attempts != 0 || got.BudgetSpent != 0 || got.HeldBy != "" || time.Until(got.NextAttemptAt) < 59*time.Minute {
		t.Errorf("after Release: %+v, %v", got, err)
	}

	// The owner stops: its other claims go, due as they were.
	if n, err := e.store.Park().ReleaseAll(ctx, "o"); err != nil || n != 2 {
		t.Errorf("ReleaseAll = %d, %v; want 2", n, err)
	}
	if next := e.take(t, "next", 3); len(next) != 2 {
		t.Errorf("the next owner took %q, want the 2 released at once", idempotencyKeys(next))
	}
}

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	if _, err := e.store.Park().Add(ctx, parked("A", 1), time.Hour); err != nil {
		t.Fatal(err)
	}
	e.park(t, parked("A", 2))
	var behind int64
	if err := e.db.Pool.QueryRow(ctx, `SELECT id FROM inbox_parked WHERE "offset" = 2`).Scan(&behind); err != nil {
		t.Fatal(err)
	}

	// Neither due nor the head: an operator claims it all the same.
	p, err := e.store.Park().Hold(ctx, behind, "operator", time.Minute)
	if err != nil || p.IdempotencyKey != "A@2" || p.HeldBy != "operator" {
		t.Fatalf("Claim = %+v, %v; want A@2 for operator", p, err)
	}
	if _, err := e.store.Park().Hold(ctx, behind, "other", time.Minute); !errors.Is(err, inbox.ErrHeld) {
		t.Errorf("a second Claim: %v, want ErrClaimed", err)
	}
	if _, err := e.store.Park().Hold(ctx, behind, "operator", time.Minute); err != nil {
		t.Errorf("the holder's Claim again: %v, want it renewed", err)
	}
	if err := e.store.Park().Remove(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Park().Hold(ctx, behind, "operator", time.Minute); !errors.Is(err, inbox.ErrNotParked) {
		t.Errorf("Claim of a removed message: %v, want ErrNotParked", err)
	}
	if got := e.parkedKeys(t); !slices.Equal(got, []string{"A@1"}) {
		t.Errorf("parked %q, want A@1", got)
	}
}

func TestListAndRetryNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	later := func(p inbox.Parked) inbox.Parked {
		if _, err := e.store.Park().Add(ctx, p, time.Hour); err != nil {
			t.Fatal(err)
		}
		return p
	}
	u := parked("Z", 9)
	u.Topic = "u"
	later(parked("B", 5))
	later(parked("A", 2))
	later(parked("A", 1))
	later(u)

	list, err := e.store.Park().List(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range list {
		got = append(got, fmt.Sprintf("%s/%s+%d", p.Topic, p.IdempotencyKey, p.Ahead))
	}
	if want := []string{"t/A@1+0", "t/A@2+1", "t/B@5+0", "u/Z@9+0"}; !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q", got, want)
	}
	if list, err := e.store.Park().List(ctx, "u", 0); err != nil || len(list) != 1 {
		t.Errorf("List(u) = %d messages, %v; want 1", len(list), err)
	}
	if list, err := e.store.Park().List(ctx, "", 2); err != nil || len(list) != 2 {
		t.Errorf("List(limit 2) = %d messages, %v; want 2", len(list), err)
	}
	if _, err := e.store.Park().List(ctx, "", -1); err == nil {
		t.Error("List(limit -1) succeeded, want an error")
	}

	if taken := e.take(t, "o", 10); len(taken) != 0 {
		t.Fatalf("took %q, want nothing due", idempotencyKeys(taken))
	}
	// A@2 is due now, but A@1 is ahead of it.
	if n, err := e.store.Park().RetryNow(ctx, []int64{list[1].ID}); err != nil || n != 1 {
		t.Fatalf("RetryNow = %d, %v; want 1", n, err)
	}
	if taken := e.take(t, "o", 10); len(taken) != 0 {
		t.Errorf("took %q, want nothing: A@2 waits behind A@1", idempotencyKeys(taken))
	}
	if n, err := e.store.Park().RetryAllNow(ctx, "t"); err != nil || n != 3 {
		t.Fatalf("RetryAllNow(t) = %d, %v; want 3", n, err)
	}
	if taken := idempotencyKeys(e.take(t, "o", 10)); !slices.Equal(sorted(taken), []string{"A@1", "B@5"}) {
		t.Errorf("took %q, want the heads A@1 and B@5", taken)
	}
}

func TestParkStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	if stats, err := e.store.Park().Stats(ctx); err != nil || len(stats) != 0 {
		t.Fatalf("Stats of an empty park = %+v, %v; want none", stats, err)
	}
	u := parked("Z", 9)
	u.Topic = "u"
	e.park(t, parked("A", 1), parked("A", 2), parked("B", 3), u)
	e.exec(t, `UPDATE inbox_parked SET parked_at = now() - interval '90 seconds' WHERE idempotency_key = 'A@1'`)
	stats, err := e.store.Park().Stats(ctx)
	if err != nil || len(stats) != 2 {
		t.Fatalf("Stats = %+v, %v; want two topics", stats, err)
	}
	if st := stats[0]; st.Topic != "t" || st.Messages != 3 || st.OldestAge < 90*time.Second || st.OldestAge > 2*time.Minute {
		t.Errorf("Stats of t = %+v, want 3 messages, the oldest parked 90s ago", st)
	}
	if st := stats[1]; st.Topic != "u" || st.Messages != 1 || st.OldestAge > time.Minute {
		t.Errorf("Stats of u = %+v, want 1 message, parked just now", st)
	}
}

// A retry begun and never settled counts a start: its retrier died in it. Settling resets the count.
func TestStartLogRecordParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	e.park(t, parked("A", 1))
	var id int64
	for want := 1; want <= 3; want++ {
		taken := e.take(t, fmt.Sprint("dead", want), 1)
		if len(taken) != 1 {
			t.Fatalf("take %d: %+v, want A@1", want, taken)
		}
		id = taken[0].ID
		if starts, err := e.store.StartLog().RecordParked(ctx, taken[0]); err != nil || starts != want {
			t.Fatalf("RecordParked %d = %d, %v; want %d", want, starts, err, want)
		}
		e.lapse(t, "A@1") // its owner died
	}
	if got, err := e.store.Park().Get(ctx, id); err != nil || got.Starts != 3 {
		t.Errorf("Starts = %d, %v; want 3", got.Starts, err)
	}
	stale := e.take(t, "alive", 1)[0]
	e.lapse(t, "A@1")
	e.take(t, "other", 1)
	if _, err := e.store.StartLog().RecordParked(ctx, stale); !errors.Is(err, inbox.ErrHoldLost) {
		t.Errorf("Begin by a stale owner: %v, want ErrClaimLost", err)
	}
	for name, settle := range map[string]func(inbox.Parked) error{
		"Reschedule": func(p inbox.Parked) error {
			return e.store.Park().Reschedule(ctx, p, inbox.ParkedFailure{Err: errors.New("x")})
		},
		"Release":    func(p inbox.Parked) error { return e.store.Park().Release(ctx, p, 0) },
		"ReleaseAll": func(p inbox.Parked) error { _, err := e.store.Park().ReleaseAll(ctx, p.HeldBy); return err },
	} {
		e.exec(t, `UPDATE inbox_parked SET next_attempt_at = now(), held_by = NULL, held_until = NULL`)
		p := e.take(t, "alive", 1)[0]
		if _, err := e.store.StartLog().RecordParked(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := settle(p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, err := e.store.Park().Get(ctx, p.ID); err != nil || got.Starts != 0 {
			t.Errorf("after %s: %d starts, %v; want 0", name, got.Starts, err)
		}
	}
}
