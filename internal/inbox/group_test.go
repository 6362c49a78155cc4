package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// groupEnv is a store over a fresh schema with a table in which effects record their key and the
// transaction that wrote them.
type groupEnv struct {
	db    *pgtest.DB
	store *Store
}

func setupGroups(t *testing.T) *groupEnv {
	t.Helper()
	db := pgtest.Schema(t)
	store, err := NewStore(db.Pool, Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (key text NOT NULL, xid bigint NOT NULL DEFAULT txid_current())`); err != nil {
		t.Fatal(err)
	}
	return &groupEnv{db: db, store: store}
}

func groupMessage(key string) Message {
	return Message{Handler: "h", Key: key, Fingerprint: Fingerprint([]byte(key)), Topic: "t", Offset: 1}
}

func recordKey(key string) Effect {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, key)
		return err
	}
}

// effects returns the transaction of each recorded key, failing the test if a key was recorded twice.
func (e *groupEnv) effects(t *testing.T) map[string]int64 {
	t.Helper()
	rows, _ := e.db.Pool.Query(context.Background(), `SELECT key, xid FROM effects`)
	out := map[string]int64{}
	var key string
	var xid int64
	_, err := pgx.ForEachRow(rows, []any{&key, &xid}, func() error {
		if _, ok := out[key]; ok {
			return fmt.Errorf("key %s recorded twice", key)
		}
		out[key] = xid
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// liveLeases returns the keys whose lease is live.
func (e *groupEnv) liveLeases(t *testing.T) []string {
	t.Helper()
	rows, _ := e.db.Pool.Query(context.Background(),
		`SELECT idempotency_key FROM inbox_leases WHERE expires_at > now() ORDER BY 1`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// queued waits until n steps wait in g's queue for a group.
func queued[T interface {
	comparable
	base() *member
}](t *testing.T, g *grouper[T], n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a guard against hanging, not a limit
	for {
		g.mu.Lock()
		got := len(g.queue)
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d steps queued, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// result is what ProcessCall returned for a key.
type result struct {
	outcome Outcome
	err     error
}

// TestGroupedSteps holds every group of a kind in flight (maxGroupsInFlight calls whose step blocks),
// queues the steps of eight more calls behind them, and lets them go: the eight share a transaction,
// and when the step of one fails, the others still commit, each once, and only the faulty one fails.
func TestGroupedSteps(t *testing.T) {
	t.Parallel()
	const n = 8
	errCheck := errors.New("check failed")
	for _, tc := range []struct {
		name string
		// claims: the claims are grouped behind blocked Checks, else the completions behind blocked
		// effects.
		claims bool
		// fail, when set, is the step of key k3: it fails.
		fail func(ctx context.Context, tx pgx.Tx) error
		// wantErr checks k3's error.
		wantErr func(error) bool
	}{
		{name: "CompletionsShareATransaction"},
		{name: "ClaimsShareATransaction", claims: true},
		{
			name: "CompletionFailsOnAStatement",
			fail: func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`) // aborts the transaction
				return err
			},
			wantErr: func(err error) bool { return err != nil && !errors.Is(err, errAlone) },
		},
		{
			name:    "CompletionFailsOnItsOwn",
			fail:    func(context.Context, pgx.Tx) error { return errCheck }, // the transaction stays usable
			wantErr: func(err error) bool { return errors.Is(err, errCheck) },
		},
		{
			name:    "CheckFailsOnItsOwn",
			claims:  true,
			fail:    func(context.Context, pgx.Tx) error { return errCheck },
			wantErr: func(err error) bool { return errors.Is(err, errCheck) },
		},
		{
			name:   "CheckFailsOnAStatement",
			claims: true,
			fail: func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return err
			},
			wantErr: func(err error) bool { return err != nil && !errors.Is(err, errAlone) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupGroups(t)
			ctx := context.Background()
			var wg sync.WaitGroup
			defer wg.Wait()
			var mu sync.Mutex
			results := map[string]result{}
			var claimXIDs []int64 // of the Checks of the keys k…
			release := make(chan struct{})
			block := func(context.Context, pgx.Tx) error {
				<-release
				return nil
			}
			call := func(key string) Call {
				c := Call{Lease: time.Minute, Run: func(context.Context, int) (Effect, error) {
					if !tc.claims && key == "k3" && tc.fail != nil {
						return tc.fail, nil
					}
					effect := recordKey(key)
					if !tc.claims && key[0] == 'b' {
						return func(ctx context.Context, tx pgx.Tx) error {
							if err := block(ctx, tx); err != nil {
								return err
							}
							return effect(ctx, tx)
						}, nil
					}
					return effect, nil
				}}
				switch {
				case tc.claims && key[0] == 'b':
					c.Check = block
				case tc.claims && key == "k3" && tc.fail != nil:
					c.Check = tc.fail
				case tc.claims:
					c.Check = func(ctx context.Context, tx pgx.Tx) error {
						var xid int64
						err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid)
						mu.Lock()
						claimXIDs = append(claimXIDs, xid)
						mu.Unlock()
						return err
					}
				}
				return c
			}

			start := func(key string) {
				wg.Go(func() {
					outcome, err := e.store.ProcessCall(ctx, groupMessage(key), call(key))
					mu.Lock()
					results[key] = result{outcome, err}
					mu.Unlock()
				})
			}
			// Each blocker's step in a group of its own, in flight: one at a time.
			busy := func() int {
				if tc.claims {
					g := e.store.leaseTaker("h")
					g.mu.Lock()
					defer g.mu.Unlock()
					return g.committing - len(g.queue)
				}
				g := e.store.completer("h")
				g.mu.Lock()
				defer g.mu.Unlock()
				return g.committing - len(g.queue)
			}
			for i := range maxGroupsInFlight {
				start(fmt.Sprintf("b%d", i))
				deadline := time.Now().Add(30 * time.Second) // a guard against hanging, not a limit
				for busy() != i+1 {
					if time.Now().After(deadline) {
						t.Fatalf("blocker %d's step is not in flight", i)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			queue := func(n int) {
				if tc.claims {
					queued(t, e.store.leaseTaker("h"), n)
				} else {
					queued(t, e.store.completer("h"), n)
				}
			}
			var keys []string
			for i := range n {
				keys = append(keys, fmt.Sprintf("k%d", i))
				start(keys[i])
			}
			queue(n)
			close(release)
			wg.Wait()

			effects := e.effects(t)
			var xids []int64
			for _, key := range keys {
				r := results[key]
				if key == "k3" && tc.fail != nil {
					if r.outcome != "" || !tc.wantErr(r.err) {
						t.Errorf("%s: ProcessCall = %q, %v; want its own error", key, r.outcome, r.err)
					}
					if _, ok := effects[key]; ok {
						t.Errorf("%s failed, and its effect is recorded", key)
					}
					continue
				}
				if r.err != nil || r.outcome != Applied {
					t.Errorf("%s: ProcessCall = %q, %v; want applied", key, r.outcome, r.err)
				}
				xid, ok := effects[key]
				if !ok {
					t.Errorf("%s applied, and its effect is not recorded", key)
				}
				xids = append(xids, xid)
			}
			if live := e.liveLeases(t); len(live) != 0 {
				t.Errorf("leases %v live after every call ended", live)
			}
			// Without a failure, the eight steps queued together committed in one transaction.
			if tc.fail == nil {
				if tc.claims {
					xids = claimXIDs
				}
				if len(xids) != n || len(slices.Compact(slices.Sorted(slices.Values(xids)))) != 1 {
					t.Errorf("the steps ran in transactions %v, want one for all %d", xids, n)
				}
			}
		})
	}
}
