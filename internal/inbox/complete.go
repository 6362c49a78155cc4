package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// completion is step 3 of one call (see ProcessCall), waiting for, or in, a group (see group.go).
type completion struct {
	member
	msg    Message
	holder string
	effect Effect
	// Set by the group's commit: the key's outcome, whether its lease had been taken over while the
	// call ran, and the actions its effect registered with AfterCommit.
	outcome Outcome
	lost    bool
	actions *afterCommitActions
}

func (c *completion) base() *member { return &c.member }

// completer returns the grouper of handler's completions.
func (s *Store) completer(handler string) *grouper[*completion] {
	return grouperOf(&s.completers, handler, func() *grouper[*completion] {
		return &grouper[*completion]{
			// A key occurs once in a group: its lease keeps two calls of it from completing at once.
			admits: func([]*completion, *completion) bool { return true },
			commit: s.commitCompletions,
		}
	})
}

// complete is step 3 of ProcessCall for msg, whose lease holder holds and whose call returned
// effect: the key's inbox row, effect and the deletion of the lease, committed in one transaction,
// which other completions of msg's handler may share. It returns the key's outcome and whether the
// lease was found taken over, or an error, in which case nothing of msg was recorded and its lease
// is left as it was.
func (s *Store) complete(ctx context.Context, msg Message, holder string, effect Effect) (Outcome, bool, error) {
	c := &completion{member: newMember(ctx), msg: msg, holder: holder, effect: effect}
	switch err := s.completer(msg.Handler).do(c); {
	case errors.Is(err, errAlone):
		return s.completeAlone(ctx, c)
	case err != nil:
		return "", false, err
	}
	c.actions.run(ctx)
	return c.outcome, c.lost, nil
}

// forgetLeasesSQL deletes the leases of keys, each only if still held by the given holder, and
// returns the keys whose lease it deleted.
const forgetLeasesSQL = `
DELETE FROM inbox_leases l
USING unnest($2::text[], $3::text[]) AS m(key, holder)
WHERE l.handler = $1 AND l.idempotency_key = m.key AND l.holder = m.holder
RETURNING l.idempotency_key`

// commitCompletions commits a group of completions in one transaction: one statement claims every
// key (as ProcessBatch does), one deletes every lease, then each claimed key's effect runs.
func (s *Store) commitCompletions(ctx context.Context, group []*completion) error {
	msgs := make([]Message, len(group))
	keys, holders := make([]string, len(group)), make([]string, len(group))
	for i, c := range group {
		msgs[i], keys[i], holders[i] = c.msg, c.msg.Key, c.holder
	}
	outcomes := make([]Outcome, len(group))
	return WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		claimed, err := s.claimBatch(ctx, tx, msgs, outcomes)
		if err != nil {
			return err
		}
		// Every lease of the group goes: the claimed keys', and those of keys recorded before, for
		// which no call is needed any more.
		rows, _ := tx.Query(ctx, forgetLeasesSQL, msgs[0].Handler, keys, holders)
		forgotten, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return Classify(fmt.Errorf("inbox: release the leases: %w", err))
		}
		for _, i := range claimed {
			c := group[i]
			// No lease deleted: another caller took it over after it expired, so this call outlived
			// its lease, which its deadline should prevent. Its result is still true, and is
			// recorded; the other caller's completion will find the key applied.
			c.lost = !slices.Contains(forgotten, c.msg.Key)
			mctx, actions, stop := memberContext(ctx, &c.member)
			err := c.effect(mctx, tx)
			stop()
			c.actions = actions
			if err == nil {
				continue
			}
			recorded, ok := recordedBy(err)
			if !ok {
				return &BatchError{Index: i, Err: classifyEffectError(ctx, tx, err)}
			}
			outcomes[i] = recorded
		}
		for i, c := range group {
			c.outcome = outcomes[i]
		}
		return nil
	})
}

// completeAlone is complete in a transaction of c's own, after its group's failed.
func (s *Store) completeAlone(ctx context.Context, c *completion) (Outcome, bool, error) {
	var lost bool
	outcome, err := s.Process(ctx, c.msg, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, forgetLeaseSQL, c.msg.Handler, c.msg.Key, c.holder)
		if err != nil {
			return Classify(fmt.Errorf("inbox: release the lease: %w", err))
		}
		lost = tag.RowsAffected() == 0
		return c.effect(ctx, tx)
	})
	if err == nil && outcome != Applied {
		// Recorded by another caller: the lease, if still this one's, goes.
		s.release(ctx, &lease{msg: c.msg, holder: c.holder}, true)
	}
	return outcome, lost, err
}
