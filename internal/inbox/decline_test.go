package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// declining is an effect that records note, as a handler records its decision, and declines its
// message with outcome.
func declining(outcome inbox.Outcome, note string) inbox.Effect {
	return func(ctx context.Context, tx pgx.Tx) error {
		if err := record(note)(ctx, tx); err != nil {
			return err
		}
		return inbox.Decline(outcome, errors.New("too late"))
	}
}

// TestDecline: an effect that declines its message on purpose records the key with what it wrote,
// in every way a message is applied, and reports the outcome it declined with; a redelivery is
// then a duplicate that runs nothing.
func TestDecline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, outcome := range []inbox.Outcome{inbox.Expired, inbox.Suppressed} {
		t.Run(string(outcome), func(t *testing.T) {
			t.Parallel()

			t.Run("Process", func(t *testing.T) {
				t.Parallel()
				e := setup(t, inbox.Config{})
				if got, err := e.store.Process(ctx, message("k"), declining(outcome, "declined")); err != nil || got != outcome {
					t.Fatalf("Process = %q, %v; want %q", got, err, outcome)
				}
				e.checkRecorded(t, []string{"k"}, []string{"declined"})
				if got, err := e.store.Process(ctx, message("k"), record("redelivered")); err != nil || got != inbox.Duplicate {
					t.Fatalf("redelivery: Process = %q, %v; want duplicate", got, err)
				}
				e.checkRecorded(t, []string{"k"}, []string{"declined"})
			})

			t.Run("ProcessBatch", func(t *testing.T) {
				t.Parallel()
				e := setup(t, inbox.Config{})
				msgs := []inbox.Message{message("a"), message("b"), message("c")}
				got, err := e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
					results := make([]error, len(claimed))
					for j, i := range claimed {
						if i == 1 {
							results[j] = declining(outcome, "declined b")(ctx, tx)
						} else {
							results[j] = record(msgs[i].Key)(ctx, tx)
						}
					}
					return results
				})
				if want := []inbox.Outcome{inbox.Applied, outcome, inbox.Applied}; err != nil || !slices.Equal(got, want) {
					t.Fatalf("ProcessBatch = %v, %v; want %v", got, err, want)
				}
				e.checkRecorded(t, []string{"a", "b", "c"}, []string{"a", "c", "declined b"})
			})

			t.Run("ProcessCall", func(t *testing.T) {
				t.Parallel()
				e := setup(t, inbox.Config{})
				var runs atomic.Int32
				call := recordCall("k", &runs)
				call.Check = declining(outcome, "declined")
				if got, err := e.store.ProcessCall(ctx, message("k"), call); err != nil || got != outcome {
					t.Fatalf("ProcessCall = %q, %v; want %q", got, err, outcome)
				}
				if runs.Load() != 0 || len(e.leases(t)) != 0 {
					t.Fatalf("runs %d, leases %v; want no call and no lease", runs.Load(), e.leases(t))
				}
				e.checkRecorded(t, []string{"k"}, []string{"declined"})
				call.Check = nil
				if got, err := e.store.ProcessCall(ctx, message("k"), call); err != nil || got != inbox.Duplicate {
					t.Fatalf("redelivery: ProcessCall = %q, %v; want duplicate", got, err)
				}
				if runs.Load() != 0 {
					t.Fatalf("the redelivery called: %d runs", runs.Load())
				}
				e.checkRecorded(t, []string{"k"}, []string{"declined"})
			})

			t.Run("ParkProcess", func(t *testing.T) {
				t.Parallel()
				e := setup(t, inbox.Config{})
				e.park(t, parked("A", 1), parked("A", 2))
				got, err := e.store.Park().Process(ctx, e.take(t, "o", 1)[0], declining(outcome, "declined"))
				if err != nil || got != outcome {
					t.Fatalf("Park.Process = %q, %v; want %q", got, err, outcome)
				}
				e.checkRecorded(t, []string{"A@1"}, []string{"declined"})
				if got := e.parkedKeys(t); !slices.Equal(got, []string{"A@2"}) {
					t.Fatalf("parked %q, want A@2 only: the declined message left the park", got)
				}
			})
		})
	}
}

// TestDeclineWrapped: a declined error wrapped by the effect still declines.
func TestDeclineWrapped(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	effect := func(ctx context.Context, tx pgx.Tx) error {
		return fmt.Errorf("verify code: %w", inbox.Decline(inbox.Expired, errors.New("5m old")))
	}
	if got, err := e.store.Process(context.Background(), message("k"), effect); err != nil || got != inbox.Expired {
		t.Fatalf("Process = %q, %v; want expired", got, err)
	}
	e.checkRecorded(t, []string{"k"}, nil)
}

// TestDeclineOtherOutcome: Decline with an outcome that is no decision declines nothing: the
// effect fails, and nothing is recorded.
func TestDeclineOtherOutcome(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	for _, outcome := range []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.KeyReused, ""} {
		effect := func(context.Context, pgx.Tx) error { return inbox.Decline(outcome, errors.New("no")) }
		if got, err := e.store.Process(context.Background(), message("k"), effect); err == nil {
			t.Fatalf("Decline(%q): Process = %q, nil; want an error", outcome, got)
		}
	}
	e.checkRecorded(t, nil, nil)
}

// checkRecorded fails unless the inbox holds keys and the effects table effects, both sorted.
func (e *testEnv) checkRecorded(tb testing.TB, keys, effects []string) {
	tb.Helper()
	if got := e.keys(tb); !slices.Equal(got, keys) {
		tb.Fatalf("inbox keys %q, want %q", got, keys)
	}
	if got := slices.Sorted(slices.Values(e.effects(tb))); !slices.Equal(got, effects) {
		tb.Fatalf("effects %q, want %q", got, effects)
	}
}
