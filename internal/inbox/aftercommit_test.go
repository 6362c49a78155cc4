package inbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestAfterCommit: actions registered in a transaction run once it committed, in order, and never
// when it rolled back; outside a transaction of the package they are refused.
func TestAfterCommit(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := context.Background()
	var ran []string
	// register registers, from inside the effect, an action that records that it ran, and checks
	// that the effect's row, recorded, is visible to another session by then: it committed.
	register := func(ctx context.Context, recorded, key string) {
		if !inbox.AfterCommit(ctx, func(context.Context) {
			if !slices.Contains(e.effects(t), recorded) {
				t.Errorf("the action of %s ran before its transaction committed", key)
			}
			ran = append(ran, key)
		}) {
			t.Errorf("AfterCommit refused the action of %s", key)
		}
	}
	failure := errors.New("the effect failed")
	effect := func(key string, err error) inbox.Effect {
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := record(key)(ctx, tx); err != nil {
				return err
			}
			register(ctx, key, key)
			register(ctx, key, key+"-second")
			return err
		}
	}

	if _, err := e.store.Process(ctx, message("k1"), effect("k1-failed", failure)); !errors.Is(err, failure) {
		t.Fatalf("got %v, want the effect's error", err)
	}
	if _, err := e.store.Process(ctx, message("k1"), effect("k1", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Process(ctx, message("k1"), effect("k1-duplicate", nil)); err != nil {
		t.Fatal(err)
	}

	batch := []inbox.Message{message("k2"), message("k3")}
	batchEffect := func(suffix string, err error) inbox.BatchEffect {
		return func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
			errs := make([]error, len(claimed))
			for j, i := range claimed {
				key := batch[i].Key + suffix
				if err := record(key)(ctx, tx); err != nil {
					errs[j] = err
					return errs
				}
				register(ctx, key, key)
			}
			errs[len(errs)-1] = err
			return errs
		}
	}
	if _, err := e.store.ProcessBatch(ctx, batch, batchEffect("-failed", failure)); !errors.Is(err, failure) {
		t.Fatalf("got %v, want the effect's error", err)
	}
	if _, err := e.store.ProcessBatch(ctx, batch, batchEffect("", nil)); err != nil {
		t.Fatal(err)
	}

	if want := []string{"k1", "k1-second", "k2", "k3"}; !slices.Equal(ran, want) {
		t.Errorf("actions ran: %q, want %q", ran, want)
	}
	if inbox.AfterCommit(ctx, func(context.Context) { t.Error("an action outside a transaction ran") }) {
		t.Error("AfterCommit accepted an action outside a transaction")
	}
}
