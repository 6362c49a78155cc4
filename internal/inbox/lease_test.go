package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// testLease is the lease of the tests' calls: long enough never to expire while a test runs.
const testLease = time.Minute

// recordCall is a Call whose Run counts its runs in *runs and returns record(key).
func recordCall(key string, runs *atomic.Int32) inbox.Call {
	return inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) {
		runs.Add(1)
		return record(key), nil
	}}
}

// lease is a key's row in inbox_leases.
type lease struct {
	holder   string
	attempts int
	live     bool
}

// leases returns the inbox_leases rows by key.
func (e *testEnv) leases(tb testing.TB) map[string]lease {
	tb.Helper()
	rows, err := e.db.Pool.Query(context.Background(),
		`SELECT idempotency_key, holder, attempts, expires_at > now() FROM inbox_leases`)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]lease{}
	var key string
	var l lease
	_, err = pgx.ForEachRow(rows, []any{&key, &l.holder, &l.attempts, &l.live}, func() error {
		out[key] = l
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// otherWorkersLease writes the lease another worker would hold on key, expiring in expiresIn.
func (e *testEnv) otherWorkersLease(tb testing.TB, key string, expiresIn time.Duration) {
	tb.Helper()
	e.exec(tb, `INSERT INTO inbox_leases (handler, idempotency_key, holder, expires_at, attempts)
		VALUES ('h', $1, 'other-host/1/abc', now() + $2 * interval '1 microsecond', 1)`, key, expiresIn.Microseconds())
}

func TestProcessCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Applied", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		var runs atomic.Int32
		call := recordCall("k1", &runs)
		run := call.Run
		call.Run = func(ctx context.Context, attempt int) (inbox.Effect, error) {
			// While the call is out, the lease is held and nothing else of the key is recorded.
			if l := e.leases(t)["k1"]; !l.live || l.attempts != 1 {
				return nil, fmt.Errorf("lease during the call: %+v, want live, attempt 1", l)
			}
			if deadline, ok := ctx.Deadline(); !ok || time.Until(deadline) > testLease*2/3 {
				return nil, fmt.Errorf("call context deadline %v, %v; want within two thirds of the lease", deadline, ok)
			}
			if len(e.keys(t)) != 0 {
				return nil, errors.New("the inbox row exists before the completion")
			}
			return run(ctx, attempt)
		}
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), call); err != nil || outcome != inbox.Applied {
			t.Fatalf("ProcessCall = %q, %v; want applied", outcome, err)
		}
		if runs.Load() != 1 || !equal(e.effects(t), "k1") || !equal(e.keys(t), "k1") || len(e.leases(t)) != 0 {
			t.Fatalf("runs %d, effects %v, keys %v, leases %v; want one run, k1 recorded, no lease",
				runs.Load(), e.effects(t), e.keys(t), e.leases(t))
		}
	})

	t.Run("DuplicateAndKeyReused", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		var runs atomic.Int32
		if _, err := e.store.ProcessCall(ctx, message("k1"), recordCall("k1", &runs)); err != nil {
			t.Fatal(err)
		}
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), recordCall("k1", &runs)); err != nil || outcome != inbox.Duplicate {
			t.Fatalf("again: ProcessCall = %q, %v; want duplicate", outcome, err)
		}
		other := message("k1")
		other.Fingerprint = inbox.Fingerprint([]byte("another value"))
		if outcome, err := e.store.ProcessCall(ctx, other, recordCall("k1", &runs)); err != nil || outcome != inbox.KeyReused {
			t.Fatalf("another payload: ProcessCall = %q, %v; want key_reused", outcome, err)
		}
		if runs.Load() != 1 || len(e.effects(t)) != 1 || len(e.leases(t)) != 0 {
			t.Fatalf("runs %d, effects %v, leases %v; want one run, one effect, no lease", runs.Load(), e.effects(t), e.leases(t))
		}
	})

	t.Run("LeaseHeldByAnotherWorker", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		e.otherWorkersLease(t, "k1", time.Hour)
		var runs atomic.Int32
		_, err := e.store.ProcessCall(ctx, message("k1"), recordCall("k1", &runs))
		kind, _, retryAfter := fault.Classify(err)
		if !errors.Is(err, inbox.ErrLeaseHeld) || kind != fault.KindRetryable || retryAfter < 59*time.Minute || retryAfter > time.Hour {
			t.Fatalf("ProcessCall: %v, %v after %v; want retryable ErrLeaseHeld after about an hour", err, kind, retryAfter)
		}
		if runs.Load() != 0 || len(e.keys(t)) != 0 {
			t.Fatalf("runs %d, keys %v; want no call and nothing recorded", runs.Load(), e.keys(t))
		}
		if l := e.leases(t)["k1"]; l.holder != "other-host/1/abc" || !l.live || l.attempts != 1 {
			t.Fatalf("lease %+v, want the other worker's, untouched", l)
		}
	})

	t.Run("ExpiredLeaseTakenOver", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		e.otherWorkersLease(t, "k1", -time.Second) // its holder died during its call
		var during lease
		var attempt int
		call := inbox.Call{Lease: testLease, Run: func(_ context.Context, n int) (inbox.Effect, error) {
			during, attempt = e.leases(t)["k1"], n
			return record("k1"), nil
		}}
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), call); err != nil || outcome != inbox.Applied {
			t.Fatalf("ProcessCall = %q, %v; want applied", outcome, err)
		}
		if during.holder == "other-host/1/abc" || !during.live || during.attempts != 2 || attempt != 2 {
			t.Fatalf("lease during the call: %+v, attempt %d; want taken over, live, attempt 2", during, attempt)
		}
		if !equal(e.effects(t), "k1") || len(e.leases(t)) != 0 {
			t.Fatalf("effects %v, leases %v; want k1 recorded, no lease", e.effects(t), e.leases(t))
		}
	})

	t.Run("CallFails", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		failed := fault.Permanent(reasonProviderRejected, errors.New("rejected"))
		call := inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) { return nil, failed }}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, failed) {
			t.Fatalf("ProcessCall: %v, want %v", err, failed)
		}
		if len(e.keys(t)) != 0 || len(e.leases(t)) != 0 {
			t.Fatalf("keys %v, leases %v; want nothing recorded and the lease released", e.keys(t), e.leases(t))
		}
		// Released: the retry calls at once.
		var runs atomic.Int32
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), recordCall("k1", &runs)); err != nil || outcome != inbox.Applied || runs.Load() != 1 {
			t.Fatalf("retry: ProcessCall = %q, %v after %d runs; want applied after one", outcome, err, runs.Load())
		}
	})

	t.Run("CallAbandoned", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// A rebalance cancels the work while the call is out: the other service may still be working
		// on the request, so the lease stays and no other claim calls before it expires.
		ctx, cancel := context.WithCancel(ctx)
		call := inbox.Call{Lease: testLease, Run: func(ctx context.Context, _ int) (inbox.Effect, error) {
			cancel()
			<-ctx.Done()
			return nil, ctx.Err()
		}}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, context.Canceled) {
			t.Fatalf("ProcessCall: %v, want %v", err, context.Canceled)
		}
		if l := e.leases(t)["k1"]; !l.live || len(e.keys(t)) != 0 {
			t.Fatalf("lease %+v, keys %v; want the lease kept live and nothing recorded", l, e.keys(t))
		}
		var runs atomic.Int32
		if _, err := e.store.ProcessCall(context.Background(), message("k1"), recordCall("k1", &runs)); !errors.Is(err, inbox.ErrLeaseHeld) || runs.Load() != 0 {
			t.Fatalf("the next claim: %v after %d calls; want ErrLeaseHeld and no call", err, runs.Load())
		}
	})

	t.Run("NotCalled", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// A rebalance cancels the work while Run still waits for its turn: no call went out, so the
		// lease is released at once and the next claim calls.
		ctx, cancel := context.WithCancel(ctx)
		call := inbox.Call{Lease: testLease, Run: func(ctx context.Context, _ int) (inbox.Effect, error) {
			cancel()
			<-ctx.Done()
			return nil, fmt.Errorf("%w: %w", inbox.ErrNotCalled, ctx.Err())
		}}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, inbox.ErrNotCalled) {
			t.Fatalf("ProcessCall: %v, want %v", err, inbox.ErrNotCalled)
		}
		if l := e.leases(t)["k1"]; l.live || len(e.keys(t)) != 0 {
			t.Fatalf("lease %+v, keys %v; want the lease released and nothing recorded", l, e.keys(t))
		}
		var runs atomic.Int32
		if _, err := e.store.ProcessCall(context.Background(), message("k1"), recordCall("k1", &runs)); err != nil || runs.Load() != 1 {
			t.Fatalf("the next claim: %v after %d calls; want one call", err, runs.Load())
		}
	})

	t.Run("CallTimedOut", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// The client's own timeout, shorter than the call's deadline, ended the call: no answer came,
		// and the other service may still be working on it. That is an abandoned call too.
		call := inbox.Call{Lease: testLease, Run: func(ctx context.Context, _ int) (inbox.Effect, error) {
			timeout, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			<-timeout.Done()
			return nil, fault.Retryable(fmt.Errorf("no answer: %w", timeout.Err()))
		}}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ProcessCall: %v, want %v", err, context.DeadlineExceeded)
		}
		if l := e.leases(t)["k1"]; !l.live {
			t.Fatalf("lease %+v; want it kept live until it expires", l)
		}
	})

	t.Run("CompletionFails", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// A completion that may succeed later ends the lease and keeps its attempt: the retry calls
		// again, under the same key.
		var runs atomic.Int32
		call := inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) {
			runs.Add(1)
			return func(context.Context, pgx.Tx) error { return fault.Retryable(errEffect) }, nil
		}}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, errEffect) {
			t.Fatalf("ProcessCall: %v, want %v", err, errEffect)
		}
		if l, leased := e.leases(t)["k1"]; !leased || l.live || l.attempts != 1 || len(e.keys(t)) != 0 {
			t.Fatalf("after a retryable failure: keys %v, lease %+v (%v); want nothing recorded, the lease expired with its attempt",
				e.keys(t), l, leased)
		}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, errEffect) || runs.Load() != 2 {
			t.Fatalf("ProcessCall again: %v after %d calls, want %v after 2", err, runs.Load(), errEffect)
		}
	})

	t.Run("CompletionCutShort", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// A record cut short by a rebalance or a stop (its context cancelled) is no failure of its
		// own: the key is not marked called, and its next delivery calls again.
		var runs atomic.Int32
		cctx, cancel := context.WithCancel(ctx)
		call := inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) {
			runs.Add(1)
			return func(ctx context.Context, tx pgx.Tx) error {
				cancel() // the partition revoked while the record runs
				_, err := tx.Exec(ctx, `SELECT pg_sleep(1)`)
				return err
			}, nil
		}}
		if _, err := e.store.ProcessCall(cctx, message("k1"), call); err == nil || strings.Contains(err.Error(), "the call was made") {
			t.Fatalf("ProcessCall cut short: %v, want an error that does not mark the call made", err)
		}
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), recordCall("k1", &runs)); err != nil || outcome != inbox.Applied || runs.Load() != 2 {
			t.Fatalf("ProcessCall of the next delivery: %v, %v after %d calls; want applied after 2", outcome, err, runs.Load())
		}
	})

	t.Run("CompletionFailsForGood", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// One that never can (a bug: the message is dead-lettered) says the call was made, and keeps
		// the lease, marked called: a replay makes no call, until the row is deleted.
		var runs atomic.Int32
		failing := inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) {
			runs.Add(1)
			return func(context.Context, pgx.Tx) error { return errEffect }, nil
		}}
		_, err := e.store.ProcessCall(ctx, message("k1"), failing)
		if !errors.Is(err, errEffect) || !strings.Contains(err.Error(), "the call was made") {
			t.Fatalf("ProcessCall: %v, want %v, saying the call was made", err, errEffect)
		}
		if kind, reason, _ := fault.Classify(err); kind != fault.KindPermanent || reason != inboxtype.HandlerError {
			t.Errorf("ProcessCall's error classified %v %s, want permanent handler_error", kind, reason)
		}
		if l, leased := e.leases(t)["k1"]; !leased || l.live || len(e.keys(t)) != 0 {
			t.Fatalf("after the failure: keys %v, lease %+v (%v); want nothing recorded, the lease kept, expired", e.keys(t), l, leased)
		}
		fixed := recordCall("k1", &runs)
		_, err = e.store.ProcessCall(ctx, message("k1"), fixed) // the replay, the bug fixed
		if !errors.Is(err, inbox.ErrCalledUnrecorded) || runs.Load() != 1 {
			t.Fatalf("ProcessCall of the replay: %v after %d calls; want %v, no second call", err, runs.Load(), inbox.ErrCalledUnrecorded)
		}
		if kind, reason, _ := fault.Classify(err); kind != fault.KindPermanent || reason != inboxtype.HandlerError {
			t.Errorf("the replay's error classified %v %s, want permanent handler_error", kind, reason)
		}
		e.exec(t, `DELETE FROM inbox_leases WHERE idempotency_key = 'k1'`) // the operator says: call again
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), fixed); err != nil || outcome != inbox.Applied || runs.Load() != 2 {
			t.Fatalf("ProcessCall once the row is deleted: %v, %v after %d calls; want applied after 2", outcome, err, runs.Load())
		}
	})

	t.Run("CallFailsRetryable", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		busy := fault.Retryable(errors.New("busy"))
		var attempts []int
		call := inbox.Call{Lease: testLease, Run: func(_ context.Context, attempt int) (inbox.Effect, error) {
			attempts = append(attempts, attempt)
			if attempt == 1 {
				return nil, busy
			}
			return record("k1"), nil
		}}
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, busy) {
			t.Fatalf("ProcessCall: %v, want %v", err, busy)
		}
		if l := e.leases(t)["k1"]; l.live || l.attempts != 1 {
			t.Fatalf("lease %+v; want it expired at once, keeping its attempt", l)
		}
		// The retry calls at once, as the second attempt.
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), call); err != nil || outcome != inbox.Applied {
			t.Fatalf("retry: ProcessCall = %q, %v; want applied", outcome, err)
		}
		if fmt.Sprint(attempts) != "[1 2]" || len(e.leases(t)) != 0 {
			t.Fatalf("attempts %v, leases %v; want [1 2] and no lease", attempts, e.leases(t))
		}
	})

	t.Run("CheckFindsItApplied", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		var runs atomic.Int32
		call := recordCall("k1", &runs)
		call.Check = func(context.Context, pgx.Tx) error { return inbox.ErrAlreadyApplied }
		if outcome, err := e.store.ProcessCall(ctx, message("k1"), call); err != nil || outcome != inbox.Duplicate {
			t.Fatalf("ProcessCall = %q, %v; want duplicate", outcome, err)
		}
		if runs.Load() != 0 || !equal(e.keys(t), "k1") || len(e.effects(t)) != 0 || len(e.leases(t)) != 0 {
			t.Fatalf("runs %d, keys %v, effects %v, leases %v; want no call, the key recorded again, no lease",
				runs.Load(), e.keys(t), e.effects(t), e.leases(t))
		}
	})

	t.Run("CheckFails", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		invalid := fault.Permanent(inboxtype.InvalidPayload, errors.New("bad phone"))
		var runs atomic.Int32
		call := recordCall("k1", &runs)
		call.Check = func(context.Context, pgx.Tx) error { return invalid }
		if _, err := e.store.ProcessCall(ctx, message("k1"), call); !errors.Is(err, invalid) {
			t.Fatalf("ProcessCall: %v, want %v", err, invalid)
		}
		if runs.Load() != 0 || len(e.keys(t)) != 0 || len(e.leases(t)) != 0 {
			t.Fatalf("runs %d, keys %v, leases %v; want no call, nothing recorded", runs.Load(), e.keys(t), e.leases(t))
		}
	})
}

// TestProcessCallOneCallAtATime runs 16 claims of one key at once, each retrying while the lease is
// held, as redeliveries of one message to several workers would: the key is called once, and never
// by two at the same time.
func TestProcessCallOneCallAtATime(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	var inFlight, peak, runs atomic.Int32
	call := inbox.Call{Lease: testLease, Run: func(ctx context.Context, _ int) (inbox.Effect, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		runs.Add(1)
		time.Sleep(20 * time.Millisecond) // a call that takes its time, so that claims overlap it
		return record("k1"), nil
	}}
	outcomes := make([]inbox.Outcome, 16)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Go(func() {
			for {
				outcomes[i], errs[i] = e.store.ProcessCall(context.Background(), message("k1"), call)
				if !errors.Is(errs[i], inbox.ErrLeaseHeld) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	applied := 0
	for i, outcome := range outcomes {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if outcome == inbox.Applied {
			applied++
		}
	}
	if runs.Load() != 1 || peak.Load() != 1 || applied != 1 || !equal(e.effects(t), "k1") {
		t.Fatalf("%d calls (at most %d at once), %d applied, effects %v; want one of each", runs.Load(), peak.Load(),
			applied, e.effects(t))
	}
}

// TestProcessCallHoldsNoConnection has 64 calls out at once on a pool of 4 connections: while they
// are, no connection is taken from the pool and no session of it is in a transaction, and the pool
// never has more sessions than its size.
func TestProcessCallHoldsNoConnection(t *testing.T) {
	t.Parallel()
	const calls, poolSize = 64, 4
	e := setup(t, inbox.Config{})
	pool, app := e.newPool(t, poolSize, nil)
	store := e.newStore(t, pool, inbox.Config{})

	out := make(chan struct{}, calls) // one per call out
	release := make(chan struct{})
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		key := fmt.Sprintf("k%02d", i)
		wg.Go(func() {
			call := inbox.Call{Lease: testLease, Run: func(ctx context.Context, _ int) (inbox.Effect, error) {
				out <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return record(key), nil
			}}
			outcome, err := store.ProcessCall(context.Background(), message(key), call)
			if err == nil && outcome != inbox.Applied {
				err = fmt.Errorf("%s: outcome %q", key, outcome)
			}
			errs <- err
		})
	}
	defer wg.Wait()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	// Sessions of the pool, and how many are in a transaction, sampled while the calls get out.
	sessions := func() (total, inTx int) {
		err := e.db.Pool.QueryRow(context.Background(), `
			SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%' OR xact_start IS NOT NULL)
			FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&total, &inTx)
		if err != nil {
			t.Fatal(err)
		}
		return total, inTx
	}
	peakSessions := 0
	for got := 0; got < calls; {
		select {
		case <-out:
			got++
		case err := <-errs:
			t.Fatalf("a call ended before all were out: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d calls out after 30s: the calls wait for connections", got, calls)
		}
		total, _ := sessions()
		peakSessions = max(peakSessions, total)
	}
	// All 64 are out.
	total, inTx := sessions()
	peakSessions = max(peakSessions, total)
	if acquired := pool.Stat().AcquiredConns(); acquired != 0 || inTx != 0 {
		t.Fatalf("with %d calls out: %d connections taken from the pool, %d sessions in a transaction; want none",
			calls, acquired, inTx)
	}
	close(release)
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	total, _ = sessions()
	peakSessions = max(peakSessions, total)
	if peakSessions > poolSize {
		t.Fatalf("%d sessions of the pool seen, more than its %d", peakSessions, poolSize)
	}
	if n := len(e.effects(t)); n != calls {
		t.Fatalf("%d effects recorded, want %d", n, calls)
	}
}

func equal(got []string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestNewHolder: every holder is named in one format, its role first, then its host and pid, and a
// random part that tells two holders of one role in one process apart.
func TestNewHolder(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	prefix := fmt.Sprintf("outbox relay on %s, pid %d, ", host, os.Getpid())
	a, b := inbox.NewHolder("outbox relay"), inbox.NewHolder("outbox relay")
	if !strings.HasPrefix(a, prefix) || len(a) != len(prefix)+16 {
		t.Errorf("holder %q, want %q and 16 hex digits", a, prefix)
	}
	if a == b {
		t.Errorf("two holders of one role are both %q", a)
	}
}
