package inbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// BatchEffect is the side effect of a batch of messages. It runs inside the batch's transaction and
// must do all of its database work through tx. claimed holds the indexes, into the batch, of the
// messages whose keys were new, in ascending order; the effect returns one result per claimed
// message, in the same order: nil (applied), ErrAlreadyApplied (a duplicate by the effect's own
// business keys; its writes commit with the batch), an error of Decline (the message declined on
// purpose; its writes commit with the batch) or an error.
//
// Any error rolls back the whole batch. Only the first error is looked at, so an effect may stop at
// its first failure and leave the later results nil. Its messages are applied in order as if one
// after another: an effect that does set-based work must give each message the result that applying
// the batch's messages one by one would have given it.
type BatchEffect func(ctx context.Context, tx pgx.Tx, claimed []int) []error

// BatchError is ProcessBatch's error when the effect failed on one message: nothing of the batch was
// recorded. The messages before Index may well succeed without it.
type BatchError struct {
	// Index is the failed message's index into the batch.
	Index int
	// Err is the effect's error for it, classified as Process classifies the effect's errors.
	Err error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("inbox: message %d of the batch: %v", e.Index, e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// ProcessBatch is Process for several messages of one handler in one transaction: it claims all of
// their keys with one statement, runs effect once for the messages it claimed, and commits. It
// returns one outcome per message, as Process would have returned processing the messages one after
// another: a key that occurs twice in the batch is claimed by its first occurrence, and the later
// ones are Duplicate (same fingerprint) or KeyReused (another).
//
// On any error nothing of the batch is recorded. When the effect failed on one message the error is
// a *BatchError naming it; errors from Postgres are classified (see Classify), the effect's included
// when they come from Postgres.
//
// Keys are claimed in key order, so that batches racing over some of the same keys queue behind each
// other instead of deadlocking. A key another transaction holds waits for it, as in Process.
func (s *Store) ProcessBatch(ctx context.Context, msgs []Message, effect BatchEffect) ([]Outcome, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	handler := msgs[0].Handler
	for i, msg := range msgs {
		if msg.Handler == "" || msg.Key == "" {
			return nil, fmt.Errorf("inbox: message %d needs a handler and a key, got %q and %q", i, msg.Handler, msg.Key)
		}
		if msg.Handler != handler {
			return nil, fmt.Errorf("inbox: a batch has one handler, got %q and %q", handler, msg.Handler)
		}
	}
	outcomes := make([]Outcome, len(msgs))
	err := WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		claimed, err := s.claimBatch(ctx, tx, msgs, outcomes)
		if err != nil || len(claimed) == 0 {
			return err
		}
		results := effect(ctx, tx, claimed)
		if len(results) != len(claimed) {
			return fmt.Errorf("inbox: the batch effect returned %d results for %d claimed messages", len(results), len(claimed))
		}
		for j, err := range results {
			if err == nil {
				continue
			}
			recorded, ok := recordedBy(err)
			if !ok {
				return &BatchError{Index: claimed[j], Err: classifyEffectError(ctx, tx, err)}
			}
			outcomes[claimed[j]] = recorded
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}

const claimBatchSQL = `
INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
SELECT $1, m.key, m.fingerprint, m.topic, m.partition, m.offset, now() + $2 * interval '1 microsecond'
FROM unnest($3::text[], $4::bytea[], $5::text[], $6::integer[], $7::bigint[])
     WITH ORDINALITY AS m(key, fingerprint, topic, "partition", "offset", ord)
ORDER BY m.key, m.ord
ON CONFLICT (handler, idempotency_key) DO NOTHING
RETURNING idempotency_key`

// claimBatch inserts the inbox rows of msgs in one statement and sets the outcome of each message:
// Applied for those it claimed, whose indexes it returns in ascending order, Duplicate or KeyReused
// for the others, by the fingerprint stored for their key (by this batch, for a key that occurs
// twice in it).
func (s *Store) claimBatch(ctx context.Context, tx pgx.Tx, msgs []Message, outcomes []Outcome) ([]int, error) {
	handler := msgs[0].Handler
	var claimed []int
	pending := make([]int, len(msgs)) // indexes of the messages to claim
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		n := len(pending)
		keys, fingerprints := make([]string, n), make([][]byte, n)
		topics, partitions, offsets := make([]string, n), make([]int32, n), make([]int64, n)
		for j, i := range pending {
			m := &msgs[i]
			keys[j], fingerprints[j] = m.Key, m.Fingerprint[:]
			topics[j], partitions[j], offsets[j] = m.Topic, m.Partition, m.Offset
		}
		rows, _ := tx.Query(ctx, claimBatchSQL, handler, s.Retention(handler).Microseconds(),
			keys, fingerprints, topics, partitions, offsets)
		inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, Classify(fmt.Errorf("inbox: claim a batch: %w", err))
		}
		isNew := make(map[string]bool, len(inserted))
		for _, k := range inserted {
			isNew[k] = true
		}
		var conflicts []int
		for _, i := range pending {
			if isNew[msgs[i].Key] {
				isNew[msgs[i].Key] = false // the first occurrence claims the key; later ones conflict
				outcomes[i] = Applied
				claimed = append(claimed, i)
			} else {
				conflicts = append(conflicts, i)
			}
		}
		pending, err = s.resolveConflicts(ctx, tx, msgs, conflicts, outcomes)
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(claimed)
	return claimed, nil
}

// resolveConflicts sets the outcome of the messages whose keys were already recorded, by the stored
// fingerprints, and returns those whose keys it no longer finds: purged since the conflict, they
// have expired and are new again.
func (s *Store) resolveConflicts(ctx context.Context, tx pgx.Tx, msgs []Message, conflicts []int, outcomes []Outcome) ([]int, error) {
	if len(conflicts) == 0 {
		return nil, nil
	}
	keys := make([]string, len(conflicts))
	for j, i := range conflicts {
		keys[j] = msgs[i].Key
	}
	// One lookup by primary key per key, whatever the planner thinks of the table: with "= ANY"
	// and no statistics yet (a new table), it scans every key of the handler instead.
	rows, _ := tx.Query(ctx, `
		SELECT k.key, (SELECT fingerprint FROM inbox WHERE handler = $1 AND idempotency_key = k.key)
		FROM unnest($2::text[]) AS k(key)`,
		pgx.QueryExecModeCacheDescribe, msgs[0].Handler, keys)
	stored := make(map[string][]byte, len(conflicts))
	var key string
	var fingerprint []byte
	_, err := pgx.ForEachRow(rows, []any{&key, &fingerprint}, func() error {
		if fingerprint != nil { // else gone: purged since the conflict
			stored[key] = fingerprint
		}
		return nil
	})
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: read claimed keys: %w", err))
	}
	var expired []int
	for _, i := range conflicts {
		switch fp, ok := stored[msgs[i].Key]; {
		case !ok:
			expired = append(expired, i)
		case string(fp) == string(msgs[i].Fingerprint[:]):
			outcomes[i] = Duplicate
		default:
			outcomes[i] = KeyReused
		}
	}
	return expired, nil
}
