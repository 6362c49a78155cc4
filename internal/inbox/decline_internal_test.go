package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestGroupedLeasesDecline queues the lease requests of eight calls behind blocked ones, as
// TestGroupedSteps does, two of whose Checks decline their message: in the group's one transaction,
// those two record their keys and what their Checks wrote, make no call and keep no lease, and the
// six others are called and applied.
func TestGroupedLeasesDecline(t *testing.T) {
	t.Parallel()
	e := setupGroups(t)
	ctx := context.Background()
	declines := map[string]Outcome{"k1": Expired, "k2": Suppressed}
	release := make(chan struct{})
	var runs atomic.Int32
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	results := map[string]result{}
	xids := map[string]int64{} // the transaction of each key's Check
	call := func(key string) Call {
		return Call{Lease: time.Minute,
			Check: func(ctx context.Context, tx pgx.Tx) error {
				if key[0] == 'b' {
					<-release
					return nil
				}
				var xid int64
				if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
					return err
				}
				mu.Lock()
				xids[key] = xid
				mu.Unlock()
				if outcome, ok := declines[key]; ok {
					if err := recordKey(key)(ctx, tx); err != nil {
						return err
					}
					return Decline(outcome, errors.New("not now"))
				}
				return nil
			},
			Run: func(context.Context, int) (Effect, error) {
				runs.Add(1)
				return recordKey(key), nil
			}}
	}
	start := func(key string) {
		wg.Go(func() {
			outcome, err := e.store.ProcessCall(ctx, groupMessage(key), call(key))
			mu.Lock()
			results[key] = result{outcome, err}
			mu.Unlock()
		})
	}
	g := e.store.leaseTaker("h")
	for i := range maxGroupsInFlight {
		start(fmt.Sprintf("b%d", i))
		deadline := time.Now().Add(30 * time.Second) // a guard against hanging, not a limit
		for {
			g.mu.Lock()
			busy := g.committing - len(g.queue)
			g.mu.Unlock()
			if busy == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("blocker %d's lease is not in flight", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	const n = 8
	for i := range n {
		start(fmt.Sprintf("k%d", i))
	}
	queued(t, g, n)
	close(release)
	wg.Wait()

	effects := e.effects(t)
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		want := cmp.Or(declines[key], Applied)
		if r := results[key]; r.err != nil || r.outcome != want {
			t.Errorf("%s: ProcessCall = %q, %v; want %q", key, r.outcome, r.err, want)
		}
		if _, ok := effects[key]; !ok {
			t.Errorf("%s: nothing recorded", key)
		}
		if xids[key] != xids["k0"] {
			t.Errorf("%s's Check ran in transaction %d, k0's in %d: want one group", key, xids[key], xids["k0"])
		}
	}
	if got := runs.Load(); got != n-int32(len(declines))+maxGroupsInFlight {
		t.Errorf("%d calls, want %d: none for a declined message", got, n-len(declines)+maxGroupsInFlight)
	}
	var leases int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox_leases`).Scan(&leases); err != nil || leases != 0 {
		t.Errorf("%d leases left (%v), want none", leases, err)
	}
	var keys int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE idempotency_key IN ('k1', 'k2')`).Scan(&keys); err != nil || keys != 2 {
		t.Errorf("%d declined keys recorded (%v), want both", keys, err)
	}
}
