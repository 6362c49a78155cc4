package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// leaseRequest is step 1 of one call (see ProcessCall), waiting for, or in, a group (see group.go).
type leaseRequest struct {
	member
	lease *lease
	call  Call
	// Set by the group's commit: the key's outcome ("" when the lease was taken and the call is to
	// be made), or the error that ends this message's attempt without a lease (another caller's lease
	// is live), and the actions Check registered with AfterCommit.
	outcome Outcome
	err     error
	actions *afterCommitActions
}

func (c *leaseRequest) base() *member { return &c.member }

// leaseTaker returns the grouper of the lease requests of handler's calls.
func (s *Store) leaseTaker(handler string) *grouper[*leaseRequest] {
	return grouperOf(&s.leaseTakers, handler, func() *grouper[*leaseRequest] {
		return &grouper[*leaseRequest]{
			// One statement takes the group's leases, and can take each key's once.
			admits: func(group []*leaseRequest, c *leaseRequest) bool {
				return !slices.ContainsFunc(group, func(o *leaseRequest) bool { return o.lease.msg.Key == c.lease.msg.Key })
			},
			commit: s.commitLeases,
		}
	})
}

// takeLease is step 1 of ProcessCall for l, in a transaction that other lease requests of l's handler may
// share: it takes l's lease and runs call.Check, as lease does.
func (s *Store) takeLease(ctx context.Context, l *lease, call Call) (Outcome, error) {
	c := &leaseRequest{member: newMember(ctx), lease: l, call: call}
	switch err := s.leaseTaker(l.msg.Handler).do(c); {
	case errors.Is(err, errAlone):
		return s.lease(ctx, l, call)
	case err != nil:
		return "", err
	}
	c.actions.run(ctx)
	return c.outcome, c.err
}

// takeLeasesSQL is takeLeaseSQL for several keys, in key order (so that groups racing over some of
// the same keys queue behind each other instead of deadlocking); it returns the keys whose lease it
// took.
const takeLeasesSQL = `
INSERT INTO inbox_leases (handler, idempotency_key, holder, expires_at, attempts)
SELECT $1, m.key, m.holder, now() + m.lease * interval '1 microsecond', 1
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS m(key, holder, lease)
ORDER BY m.key
ON CONFLICT (handler, idempotency_key) DO UPDATE
SET holder = excluded.holder, expires_at = excluded.expires_at, attempts = inbox_leases.attempts + 1,
    taken_at = now()
WHERE inbox_leases.expires_at <= now() AND inbox_leases.called_at IS NULL
RETURNING idempotency_key, attempts`

// commitLeases commits a group of lease requests in one transaction, with what lease does for one: one
// statement takes the leases, one looks for the keys' inbox rows, Check runs for each key neither
// applied nor leased by another caller, and one statement deletes the leases taken for keys found
// applied or that Check records (reports applied, or declines: see Decline) (lease rolls its
// transaction back instead, for keys found applied, which the others' leases forbid here). An error
// of one Check fails the group: its requests are made again one by one, and the faulty message ends
// its attempt without a lease, as lease says.
func (s *Store) commitLeases(ctx context.Context, group []*leaseRequest) error {
	handler := group[0].lease.msg.Handler
	keys, holders, leases := make([]string, len(group)), make([]string, len(group)), make([]int64, len(group))
	for i, c := range group {
		keys[i], holders[i], leases[i] = c.lease.msg.Key, c.lease.holder, c.call.Lease.Microseconds()
	}
	return WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		taken := make(map[string]int, len(group))     // attempts, by key
		stored := make(map[string][]byte, len(group)) // fingerprints, by key
		if err := takeLeasesAndLook(ctx, tx, handler, keys, holders, leases, taken, stored); err != nil {
			return err
		}
		var forget []int // requests whose lease, taken, goes: their keys are applied
		for i, c := range group {
			goes, err := s.decideLease(ctx, tx, i, c, taken, stored)
			if err != nil {
				return err
			}
			if goes {
				forget = append(forget, i)
			}
		}
		return forgetLeases(ctx, tx, handler, keys, holders, forget)
	})
}

// takeLeasesAndLook sends commitLeases' first statements in one round trip: it takes the leases of
// keys, held by holders for leases (in microseconds), unless other callers' are live, and looks for
// the keys' inbox rows. It fills taken with the count of attempts of each key whose lease it took,
// and stored with the fingerprint of each key that has an inbox row.
func takeLeasesAndLook(ctx context.Context, tx pgx.Tx, handler string, keys, holders []string, leases []int64,
	taken map[string]int, stored map[string][]byte,
) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('synchronous_commit', $1, true)`, leaseSynchronousCommit)
	b.Queue(takeLeasesSQL, handler, keys, holders, leases)
	// One lookup by primary key per key (see resolveConflicts).
	b.Queue(`
		SELECT k.key, (SELECT fingerprint FROM inbox WHERE handler = $1 AND idempotency_key = k.key)
		FROM unnest($2::text[]) AS k(key)`, handler, keys)
	results := tx.SendBatch(ctx, b)
	_, err := results.Exec()
	if err == nil {
		var key string
		var attempts int
		rows, _ := results.Query()
		_, err = pgx.ForEachRow(rows, []any{&key, &attempts}, func() error {
			taken[key] = attempts
			return nil
		})
	}
	if err == nil {
		var key string
		var fingerprint []byte
		rows, _ := results.Query()
		_, err = pgx.ForEachRow(rows, []any{&key, &fingerprint}, func() error {
			if fingerprint != nil {
				stored[key] = fingerprint
			}
			return nil
		})
	}
	if err := errors.Join(err, results.Close()); err != nil {
		return Classify(fmt.Errorf("inbox: take the leases: %w", err))
	}
	return nil
}

// decideLease gives request c, the i-th of its group, what the group's lookup says of its key:
// Duplicate or KeyReused when the key is applied; ErrLeaseHeld when another caller holds its lease;
// otherwise c.call.Check runs (see runGroupCheck). It reports whether c's lease, taken, goes,
// its key being recorded. It fails only for an error that fails the group.
func (s *Store) decideLease(ctx context.Context, tx pgx.Tx, i int, c *leaseRequest,
	taken map[string]int, stored map[string][]byte,
) (bool, error) {
	msg := c.lease.msg
	attempts, isTaken := taken[msg.Key]
	c.lease.attempts = attempts
	switch fp, found := stored[msg.Key]; {
	case found && string(fp) == string(msg.Fingerprint[:]):
		c.outcome = Duplicate
	case found:
		c.outcome = KeyReused
	case !isTaken:
		c.err = s.leaseHeld(ctx, tx, msg)
		if !errors.Is(c.err, ErrLeaseHeld) && !errors.Is(c.err, ErrCalledUnrecorded) {
			return false, c.err // Postgres failed
		}
		return false, nil
	case c.call.Check == nil:
		return false, nil
	default:
		recorded, err := s.runGroupCheck(ctx, tx, i, c)
		if err != nil || !recorded {
			return false, err
		}
	}
	return isTaken, nil
}

// runGroupCheck runs c.call.Check in the group's transaction, with c's context, keeping the actions
// it registers with AfterCommit. When Check reports the key applied or declines it, it records the
// key, sets c's outcome, and reports true. An error of Check fails the group as a *BatchError
// naming i.
func (s *Store) runGroupCheck(ctx context.Context, tx pgx.Tx, i int, c *leaseRequest) (bool, error) {
	mctx, actions, stop := memberContext(ctx, &c.member)
	err := c.call.Check(mctx, tx)
	stop()
	c.actions = actions
	if err == nil {
		return false, nil
	}
	recorded, ok := recordedBy(err)
	if !ok {
		return false, &BatchError{Index: i, Err: classifyEffectError(ctx, tx, err)}
	}
	// Applied under this key before its inbox row expired, or declined: record the key.
	outcome, err := s.claim(ctx, tx, c.lease.msg)
	if err != nil {
		return false, err
	}
	c.outcome = outcome
	if outcome == Applied {
		c.outcome = recorded
	}
	return true, nil
}

// forgetLeases deletes the leases of the requests numbered in forget, whose keys are recorded.
func forgetLeases(ctx context.Context, tx pgx.Tx, handler string, keys, holders []string, forget []int) error {
	if len(forget) == 0 {
		return nil
	}
	forgetKeys, forgetHolders := make([]string, len(forget)), make([]string, len(forget))
	for j, i := range forget {
		forgetKeys[j], forgetHolders[j] = keys[i], holders[i]
	}
	if _, err := tx.Exec(ctx, forgetLeasesSQL, handler, forgetKeys, forgetHolders); err != nil {
		return Classify(fmt.Errorf("inbox: release the leases: %w", err))
	}
	return nil
}
