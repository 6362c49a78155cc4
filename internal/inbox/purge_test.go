package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// processKeys processes each key of handler "h" and fails the test unless all are applied.
func (e *testEnv) processKeys(tb testing.TB, keys ...string) {
	tb.Helper()
	for _, key := range keys {
		if got, err := e.store.Process(context.Background(), message(key), record(key)); err != nil || got != inbox.Applied {
			tb.Fatalf("Process(%s) = %q, %v; want %q", key, got, err, inbox.Applied)
		}
	}
}

// expire makes keys look as if their retention ran out a second ago.
func (e *testEnv) expire(tb testing.TB, keys ...string) {
	tb.Helper()
	e.exec(tb, `UPDATE inbox SET expires_at = now() - interval '1 second' WHERE idempotency_key = ANY ($1)`, keys)
}

// age moves keys' processed_at and expires_at back by d, as if they had been processed d earlier.
func (e *testEnv) age(tb testing.TB, d time.Duration) {
	tb.Helper()
	e.exec(tb, `UPDATE inbox SET processed_at = processed_at - $1::interval, expires_at = expires_at - $1::interval`, d)
}

func keyRange(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return keys
}

func TestPurge(t *testing.T) {
	t.Parallel()
	// Batches of 3: the cases cover no batch, a partial one, exact batches and a partial last one.
	for _, expired := range []int{0, 1, 6, 7} {
		t.Run(fmt.Sprintf("Expired%d", expired), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := setup(t, inbox.Config{PurgeBatchSize: 3})
			old, live := keyRange("old", expired), keyRange("live", 4)
			e.processKeys(t, old...)
			e.processKeys(t, live...)
			e.expire(t, old...)

			deleted, err := e.store.Purge(ctx)
			if err != nil || deleted != int64(expired) {
				t.Fatalf("Purge = %d, %v; want %d", deleted, err, expired)
			}
			if got := e.keys(t); !slices.Equal(got, live) {
				t.Fatalf("keys after purge = %q, want %q", got, live)
			}
			if deleted, err := e.store.Purge(ctx); err != nil || deleted != 0 {
				t.Fatalf("second Purge = %d, %v; want 0", deleted, err)
			}
			// A purged key is new again: its message applies once more.
			for _, key := range old {
				if got, err := e.store.Process(ctx, message(key), record(key)); err != nil || got != inbox.Applied {
					t.Fatalf("Process(%s) after purge = %q, %v; want %q", key, got, err, inbox.Applied)
				}
			}
		})
	}
}

// TestPurgeRetentionPerHandler ages one key per handler and checks that each goes when its own
// handler's retention runs out.
func TestPurgeRetentionPerHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{
		Retention:        map[string]time.Duration{"payments": 72 * time.Hour, "sms": 24 * time.Hour},
		DefaultRetention: 48 * time.Hour,
	})
	for _, handler := range []string{"payments", "sms", "audit"} {
		msg := message("k")
		msg.Handler = handler
		if _, err := e.store.Process(ctx, msg, record(handler)); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		age  time.Duration
		left []string
	}{
		{23 * time.Hour, []string{"audit", "payments", "sms"}},
		{2 * time.Hour, []string{"audit", "payments"}},  // 25h old
		{22 * time.Hour, []string{"audit", "payments"}}, // 47h
		{2 * time.Hour, []string{"payments"}},           // 49h
		{22 * time.Hour, []string{"payments"}},          // 71h
		{2 * time.Hour, nil},                            // 73h
	} {
		e.age(t, step.age)
		if _, err := e.store.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		if got := e.strings(t, `SELECT handler FROM inbox ORDER BY handler`); !slices.Equal(got, step.left) {
			t.Fatalf("after ageing by %s more: handlers left %q, want %q", step.age, got, step.left)
		}
	}
}

// TestPurgeConcurrent runs a second purge while a first one is blocked mid-batch: the second
// returns at once without deleting anything, and the first finishes the job.
func TestPurgeConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{PurgeBatchSize: 4})
	old := keyRange("old", 10)
	e.processKeys(t, old...)
	e.expire(t, old...)

	// A row lock on one expired key stalls the first purger inside its first batch.
	holder, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT FROM inbox WHERE idempotency_key = $1 FOR UPDATE`, old[0]); err != nil {
		t.Fatal(err)
	}
	type result struct {
		deleted int64
		err     error
	}
	first := make(chan result, 1)
	go func() {
		deleted, err := e.store.Purge(ctx)
		first <- result{deleted, err}
	}()
	e.waitForLockWaiters(t, e.app, 1)

	// Another instance, with sessions of its own. Should it wait for the lock, the deadline fails it.
	otherPool, _ := e.newPool(t, 2, nil)
	other := e.newStore(t, otherPool, inbox.Config{Logger: testlog.New(t)})
	guarded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if deleted, err := other.Purge(guarded); err != nil || deleted != 0 {
		t.Errorf("second purger: Purge = %d, %v; want 0, nil", deleted, err)
	}
	if got := e.keys(t); !slices.Equal(got, old) {
		t.Errorf("keys while the first purger is blocked = %q, want %q", got, old)
	}

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-first; r.err != nil || r.deleted != int64(len(old)) {
		t.Errorf("first purger: Purge = %d, %v; want %d", r.deleted, r.err, len(old))
	}
	// The first purger released the lock: the next purge runs.
	e.processKeys(t, "later")
	e.expire(t, "later")
	if deleted, err := other.Purge(ctx); err != nil || deleted != 1 {
		t.Errorf("purge after the first finished = %d, %v; want 1", deleted, err)
	}
}

// TestRunPurger runs the purger on a short interval and watches it delete what expires and log it.
func TestRunPurger(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	e := setup(t, inbox.Config{Logger: logger})
	old := keyRange("old", 5)
	e.processKeys(t, old...)
	e.processKeys(t, "live")
	e.expire(t, old...)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		e.store.RunPurger(ctx, 10*time.Millisecond)
	}()
	defer func() { cancel(); <-stopped; t.Log(logs.String()) }()

	eventually(t, "the purger to log deleting 5 keys", func() bool {
		return strings.Contains(logs.String(), "deleted=5")
	})
	if got := e.keys(t); !slices.Equal(got, []string{"live"}) {
		t.Errorf("keys = %q, want [live]", got)
	}
	more := keyRange("more", 2)
	e.processKeys(t, more...)
	e.expire(t, more...)
	eventually(t, "the purger to log deleting 2 more keys", func() bool {
		return strings.Contains(logs.String(), "deleted=2")
	})
	cancel()
	<-stopped
	if got := e.keys(t); !slices.Equal(got, []string{"live"}) {
		t.Errorf("keys = %q, want [live]", got)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing in one goroutine and a test reading in another.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestExpiredKeyStillDuplicate: a key whose retention ran out but which the purger has not deleted
// yet still counts: its message arriving again is a duplicate, alone or in a batch, and its effect
// does not run again. Retention bounds how long a key is kept, not when it stops counting.
func TestExpiredKeyStillDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	e.processKeys(t, "expired")
	e.expire(t, "expired")

	if got, err := e.store.Process(ctx, message("expired"), record("expired")); err != nil || got != inbox.Duplicate {
		t.Errorf("Process of an expired, unpurged key = %q, %v; want %q", got, err, inbox.Duplicate)
	}
	e.expire(t, "expired") // still, whatever the claim did to it
	msgs := []inbox.Message{message("expired"), message("new")}
	var claimed []int
	got, err := e.store.ProcessBatch(ctx, msgs, recordEach(msgs, &claimed))
	if err != nil || !slices.Equal(got, []inbox.Outcome{inbox.Duplicate, inbox.Applied}) {
		t.Errorf("ProcessBatch of an expired, unpurged key and a new one = %v, %v; want duplicate, applied", got, err)
	}
	if effects := e.effects(t); !slices.Equal(effects, []string{"expired", "new"}) {
		t.Errorf("effects = %v, want the expired key's once, then the new one's", effects)
	}
}
