package inbox

// The park: messages that wait in Postgres, out of their partition's way, for a retry.
//
// A message whose retryable error outlasts its first retries in place is parked (Park.Add), and so is
// every later message of its ordering key, behind it: a key's messages leave the park in offset
// order, one at a time. Only the head of a key (its lowest offset) is ever due. The partition's
// owner takes the due heads (TakeDue), each under a hold with a lease, and either applies one
// (Process: its effect, its inbox row and its removal from the park in one transaction),
// reschedules it (Reschedule), or dead-letters it and then removes it (Remove).
//
// Rows are keyed by their origin (topic, partition, offset), so a new owner of a partition finds
// its parked keys after a rebalance or a restart. The hold keeps two owners from retrying one
// parked message at the same time, even across a network call (an SMS gateway's) or a write to
// Kafka (a dead letter), which no transaction may span; it lapses by itself when its holder dies.
// Correctness does not rest on it: the inbox row decides whether an effect happens, and only the
// hold's holder may remove the row, so a stale holder's effect rolls back.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// Park is the park of a Store: the messages that wait, out of their partition's way, for a
// retry (Park.Add).
type Park struct {
	store *Store
	pool  *pgxpool.Pool
}

// Header is one message header, as received.
type Header struct {
	Key   string
	Value []byte
}

// Parked is a message in the park.
type Parked struct {
	// ID identifies the parked message; set by the park.
	ID int64
	// Handler is the route's name in the inbox ("payments", "sms").
	Handler string
	// Where the message was read from.
	Topic     string
	Partition int32
	Offset    int64
	// OrderingKey orders the messages of one key: one after another, in offset order.
	OrderingKey []byte
	// IdempotencyKey is the message's key in the inbox.
	IdempotencyKey string
	// MessageKey, Value and Headers are the message as received; MessageKey is nil when it had none.
	MessageKey []byte
	Value      []byte
	Headers    []Header
	// Produced is the message's record timestamp; zero when unknown.
	Produced time.Time
	// VerifiedBy is the name of the key that verified the message when it was read (see
	// inbox.Delivery.VerifiedBy); "" when its route does not verify.
	VerifiedBy string
	// Attempts counts the runs of its handler so far.
	Attempts int
	// Starts counts its retries begun in a row (Begin) that never settled: its retrier died in each.
	// A message that kills its retrier is recognised by it.
	Starts int
	// Reason is the dead-letter reason once its retry budget runs out; empty until it has run.
	Reason inboxtype.Reason
	// FirstError and LastError are the errors of its first and last failed runs.
	FirstError string
	LastError  string
	// FirstFailedAt is when its first run failed; zero for a message parked behind its key that has
	// not run yet.
	FirstFailedAt time.Time
	// BudgetSpent is how much of its retry budget it has spent: the time its own failures cost it,
	// outages and pauses of its route excluded.
	BudgetSpent time.Duration
	// NextAttemptAt is when it is due, once it is the head of its key.
	NextAttemptAt time.Time
	// ParkedAt is when it was parked. Set by the park.
	ParkedAt time.Time
	// HeldBy and HeldUntil name the retrier working on it and until when; empty and zero when
	// none is.
	HeldBy    string
	HeldUntil time.Time
	// Ahead counts the messages of its key parked before it; 0 for the head. Read by List only.
	Ahead int
}

// ParkedFailure is what a failed retry of a parked message changes.
type ParkedFailure struct {
	// Err is the error of the failed run.
	Err error
	// Reason is the dead-letter reason once the retry budget runs out.
	Reason inboxtype.Reason
	// Spent is the retry budget the failure cost: 0 when it was no fault of the message's (an outage).
	Spent time.Duration
	// RetryIn is how long from now the message is due again.
	RetryIn time.Duration
}

// ParkStats describes the park of one topic, for metrics.
type ParkStats struct {
	Topic string
	// Messages counts the messages parked.
	Messages int
	// OldestAge is how long ago the oldest of them was parked.
	OldestAge time.Duration
}

var (
	// ErrNotParked: no parked message has that id (it was applied, dead-lettered, or never parked).
	ErrNotParked = errors.New("inbox: no such parked message")
	// ErrHoldLost: the parked message is no longer held by the caller. Its lease lapsed and
	// another owner took it, or it has left the park; nothing was changed.
	ErrHoldLost = errors.New("inbox: the parked message is no longer held by this owner")
	// ErrHeld: another owner holds a live hold on the parked message; try again later.
	ErrHeld = errors.New("inbox: the parked message is being worked on")
)

// maxParkedError bounds the error texts stored with a parked message, in bytes.
const maxParkedError = 4096

// parkedColumns are the columns scanParked reads.
var parkedColumns = parkedColumnsOf("inbox_parked")

// scanParked reads a row of parkedColumns.
func scanParked(row pgx.CollectableRow) (Parked, error) {
	var (
		p                           Parked
		keys, values                [][]byte
		reason                      string
		firstFailed, held, produced *time.Time
		spentMicros                 int64
	)
	err := row.Scan(&p.ID, &p.Handler, &p.Topic, &p.Partition, &p.Offset, &p.OrderingKey,
		&p.IdempotencyKey, &p.MessageKey, &p.Value, &keys, &values, &p.Attempts, &p.Starts, &reason,
		&p.FirstError, &p.LastError, &firstFailed, &spentMicros, &p.NextAttemptAt, &p.ParkedAt,
		&p.HeldBy, &held, &produced, &p.VerifiedBy)
	if err != nil {
		return Parked{}, err
	}
	p.Reason = inboxtype.Reason(reason)
	p.BudgetSpent = time.Duration(spentMicros) * time.Microsecond
	if firstFailed != nil {
		p.FirstFailedAt = *firstFailed
	}
	if held != nil {
		p.HeldUntil = *held
	}
	if produced != nil {
		p.Produced = *produced
	}
	for i := range keys {
		p.Headers = append(p.Headers, Header{Key: string(keys[i]), Value: values[i]})
	}
	return p, nil
}

// Add parks p, due in retryIn once it is the head of its key, and reports whether it was parked
// now: false when the same message (its origin and its value's fingerprint) was parked before, a
// redelivery, which is left as it is. A different message at the origin of a parked one (a topic
// recreated, its offsets started again) is parked beside it. ID, ParkedAt, NextAttemptAt, the hold
// and Ahead are ignored.
func (k *Park) Add(ctx context.Context, p Parked, retryIn time.Duration) (bool, error) {
	if p.Handler == "" || p.Topic == "" || p.IdempotencyKey == "" || len(p.OrderingKey) == 0 {
		return false, fmt.Errorf("inbox: a parked message needs a handler, a topic, an idempotency key and an ordering key")
	}
	keys := make([][]byte, len(p.Headers))
	values := make([][]byte, len(p.Headers))
	for i, h := range p.Headers {
		keys[i], values[i] = []byte(h.Key), h.Value
		if values[i] == nil {
			values[i] = []byte{} // a header's value is never NULL: NULL would not come back as it was
		}
	}
	var firstFailed *time.Time
	if !p.FirstFailedAt.IsZero() {
		firstFailed = &p.FirstFailedAt
	}
	fingerprint := Fingerprint(p.Value)
	var produced *time.Time
	if !p.Produced.IsZero() {
		produced = &p.Produced
	}
	tag, err := k.pool.Exec(ctx, `
		INSERT INTO inbox_parked (handler, topic, "partition", "offset", fingerprint, ordering_key,
			idempotency_key, message_key, value, header_keys, header_values, attempts, reason, first_error,
			last_error, first_failed_at, budget_spent, next_attempt_at, produced_at, verified_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
			$17 * interval '1 microsecond', now() + $18 * interval '1 microsecond', $19, $20)
		ON CONFLICT (topic, "partition", "offset", fingerprint) DO NOTHING`,
		p.Handler, p.Topic, p.Partition, p.Offset, fingerprint[:], p.OrderingKey, p.IdempotencyKey,
		p.MessageKey, p.Value, keys, values, p.Attempts, nullText(string(p.Reason)),
		nullText(storedError(p.FirstError)), nullText(storedError(p.LastError)), firstFailed,
		p.BudgetSpent.Microseconds(), retryIn.Microseconds(), produced, nullText(p.VerifiedBy))
	if err != nil {
		return false, Classify(fmt.Errorf("inbox: park: %w", err))
	}
	return tag.RowsAffected() == 1, nil
}

// HasKey reports whether a message of orderingKey, read from topic's partition, is parked: a
// later message of the key must then be parked behind it.
func (k *Park) HasKey(ctx context.Context, topic string, partition int32, orderingKey []byte) (bool, error) {
	var parked bool
	err := k.pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM inbox_parked WHERE topic = $1 AND "partition" = $2 AND ordering_key = $3)`,
		topic, partition, orderingKey).Scan(&parked)
	if err != nil {
		return false, Classify(fmt.Errorf("inbox: look up a parked key: %w", err))
	}
	return parked, nil
}

// Keys returns the ordering keys parked from topic's partition, for its new owner.
func (k *Park) Keys(ctx context.Context, topic string, partition int32) ([][]byte, error) {
	rows, _ := k.pool.Query(ctx, `
		SELECT DISTINCT ordering_key FROM inbox_parked WHERE topic = $1 AND "partition" = $2`,
		topic, partition)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: list parked keys: %w", err))
	}
	return keys, nil
}

// takeDueSQL holds the due heads of a partition's keys. The heads are read from the statement's
// snapshot; the row locks (SKIP LOCKED: a row another transaction is removing or holding is left to
// it) and the re-check of the due and hold conditions on the latest row versions make two owners
// taking at once take a message once.
var takeDueSQL = `
UPDATE inbox_parked p
SET held_by = $3, held_until = now() + $4 * interval '1 microsecond'
FROM (
	SELECT id FROM inbox_parked
	WHERE topic = $1 AND "partition" = $2
		AND id IN (
			SELECT DISTINCT ON (ordering_key) id FROM inbox_parked
			WHERE topic = $1 AND "partition" = $2
			ORDER BY ordering_key, "offset", id)
		AND next_attempt_at <= now()
		AND (held_until IS NULL OR held_until <= now())
	ORDER BY next_attempt_at, "offset"
	LIMIT $5
	FOR UPDATE SKIP LOCKED
) due
WHERE p.id = due.id
RETURNING ` + parkedColumnsOf("p")

// TakeDue holds up to limit due messages parked from topic's partition for owner, for lease, and
// returns them, the longest due first. Only the head of a key (its lowest offset) is ever due, so
// at most one message per key is returned, and a key's next message is due only once its head has
// left the park. A message held by another owner whose lease has not lapsed is not due.

func (k *Park) TakeDue(ctx context.Context, topic string, partition int32, owner string, lease time.Duration, limit int) ([]Parked, error) {
	if owner == "" || lease <= 0 || limit <= 0 {
		return nil, fmt.Errorf("inbox: TakeDue needs an owner, a positive lease and a positive limit")
	}
	rows, _ := k.pool.Query(ctx, takeDueSQL, topic, partition, owner, lease.Microseconds(), limit)
	taken, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: take due parked messages: %w", err))
	}
	slices.SortFunc(taken, func(a, b Parked) int {
		return cmp.Or(a.NextAttemptAt.Compare(b.NextAttemptAt), cmp.Compare(a.Offset, b.Offset))
	})
	return taken, nil
}

// NextDue returns how long until the next head of topic's partition is due, or has its hold
// lapse: 0 when one is due now, and false when nothing is parked from the partition.
func (k *Park) NextDue(ctx context.Context, topic string, partition int32) (time.Duration, bool, error) {
	var micros *int64
	err := k.pool.QueryRow(ctx, `
		SELECT (extract(epoch FROM greatest(min(greatest(next_attempt_at, coalesce(held_until, next_attempt_at))) - now(),
			interval '0')) * 1000000)::bigint
		FROM inbox_parked
		WHERE id IN (
			SELECT DISTINCT ON (ordering_key) id FROM inbox_parked
			WHERE topic = $1 AND "partition" = $2
			ORDER BY ordering_key, "offset", id)`,
		topic, partition).Scan(&micros)
	if err != nil {
		return 0, false, Classify(fmt.Errorf("inbox: look up the next due parked message: %w", err))
	}
	if micros == nil {
		return 0, false, nil
	}
	return time.Duration(*micros) * time.Microsecond, true, nil
}

// Process applies p, which the caller held (TakeDue, Hold), as Process would: its inbox
// row and effect, and its removal from the park, in one transaction. It returns Applied, Duplicate
// (the key was applied meanwhile, by a replay say: p leaves the park without its effect running),
// Expired or Suppressed (the effect declined p: see Decline; p leaves the park) or KeyReused (p
// stays parked, for the caller to dead-letter and Remove). It returns ErrHoldLost,
// having done nothing, when p is no longer held by p.HeldBy.
func (k *Park) Process(ctx context.Context, p Parked, effect Effect) (Outcome, error) {
	msg := Message{
		Handler:     p.Handler,
		Key:         p.IdempotencyKey,
		Fingerprint: Fingerprint(p.Value),
		Topic:       p.Topic,
		Partition:   p.Partition,
		Offset:      p.Offset,
	}
	var outcome Outcome
	err := WithTx(ctx, k.pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := k.RemoveTx(ctx, tx, p); err != nil {
			return err
		}
		var err error
		if outcome, err = k.store.claim(ctx, tx, msg); err != nil {
			return err
		}
		switch outcome {
		case KeyReused:
			return errStayParked
		case Duplicate:
			return nil
		}
		if err := effect(ctx, tx); err != nil {
			recorded, ok := recordedBy(err)
			if !ok {
				return classifyEffectError(ctx, tx, err)
			}
			outcome = recorded
		}
		return nil
	})
	switch {
	case errors.Is(err, errStayParked):
		return KeyReused, nil
	case err != nil:
		return "", err
	}
	return outcome, nil
}

// errStayParked rolls back Process's transaction when the message is to stay parked.
var errStayParked = errors.New("inbox: the parked message stays parked")

// RemoveTx removes p, which the caller held, from the park inside tx: the message leaves the
// park if and only if tx commits. It is for a caller that applies p in a transaction of its own
// making; Process does it all. It returns ErrHoldLost when p is no longer held by
// p.HeldBy.
func (k *Park) RemoveTx(ctx context.Context, tx pgx.Tx, p Parked) error {
	tag, err := tx.Exec(ctx, `DELETE FROM inbox_parked WHERE id = $1 AND held_by = $2`, p.ID, p.HeldBy)
	if err != nil {
		return Classify(fmt.Errorf("inbox: unpark: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return ErrHoldLost
	}
	return nil
}

// Remove removes p, which the caller held, from the park: once it is dead-lettered. It returns
// ErrHoldLost when p is no longer held by p.HeldBy.
func (k *Park) Remove(ctx context.Context, p Parked) error {
	return WithTx(ctx, k.pool, func(ctx context.Context, tx pgx.Tx) error { return k.RemoveTx(ctx, tx, p) })
}

// Reschedule records a failed retry of p, which the caller held: one more attempt, its error,
// the budget it cost, and when p is due again. The hold is given up. It returns ErrHoldLost when p
// is no longer held by p.HeldBy.
func (k *Park) Reschedule(ctx context.Context, p Parked, f ParkedFailure) error {
	errText := ""
	if f.Err != nil {
		errText = storedError(f.Err.Error())
	}
	tag, err := k.pool.Exec(ctx, `
		UPDATE inbox_parked SET
			attempts = attempts + 1,
			reason = coalesce($3, reason),
			first_error = coalesce(first_error, $4),
			last_error = $4,
			first_failed_at = coalesce(first_failed_at, now()),
			budget_spent = budget_spent + $5 * interval '1 microsecond',
			next_attempt_at = now() + $6 * interval '1 microsecond',
			held_by = NULL, held_until = NULL, starts = 0
		WHERE id = $1 AND held_by = $2`,
		p.ID, p.HeldBy, nullText(string(f.Reason)), errText, f.Spent.Microseconds(), f.RetryIn.Microseconds())
	if err != nil {
		return Classify(fmt.Errorf("inbox: reschedule a parked message: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return ErrHoldLost
	}
	return nil
}

// Release gives up the hold on p without counting an attempt, due again in retryIn: for a retry
// that did not happen, or met an outage, which is no fault of the message's. It returns ErrHoldLost
// when p is no longer held by p.HeldBy.
func (k *Park) Release(ctx context.Context, p Parked, retryIn time.Duration) error {
	tag, err := k.pool.Exec(ctx, `
		UPDATE inbox_parked SET next_attempt_at = now() + $3 * interval '1 microsecond',
			held_by = NULL, held_until = NULL, starts = 0
		WHERE id = $1 AND held_by = $2`,
		p.ID, p.HeldBy, retryIn.Microseconds())
	if err != nil {
		return Classify(fmt.Errorf("inbox: release a parked message: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return ErrHoldLost
	}
	return nil
}

// ReleaseAll gives up every hold of owner, without changing when the messages are due: for an
// owner that stops cleanly, so that the partition's next owner need not wait for the leases to
// lapse. Their starts are settled: a clean stop is no death. It returns how many holds it gave up.
func (k *Park) ReleaseAll(ctx context.Context, owner string) (int64, error) {
	tag, err := k.pool.Exec(ctx,
		`UPDATE inbox_parked SET held_by = NULL, held_until = NULL, starts = 0 WHERE held_by = $1`, owner)
	if err != nil {
		return 0, Classify(fmt.Errorf("inbox: release parked messages: %w", err))
	}
	return tag.RowsAffected(), nil
}

// Hold holds the parked message id for owner, for lease, whether it is due or not: for an operator
// who dead-letters it by hand. It returns ErrNotParked when there is no such message, and ErrHeld
// when another owner holds a live hold on it.
func (k *Park) Hold(ctx context.Context, id int64, owner string, lease time.Duration) (Parked, error) {
	if owner == "" || lease <= 0 {
		return Parked{}, fmt.Errorf("inbox: Hold needs an owner and a positive lease")
	}
	rows, _ := k.pool.Query(ctx, `
		UPDATE inbox_parked SET held_by = $2, held_until = now() + $3 * interval '1 microsecond'
		WHERE id = $1 AND (held_until IS NULL OR held_until <= now() OR held_by = $2)
		RETURNING `+parkedColumns, id, owner, lease.Microseconds())
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := k.Get(ctx, id); err != nil {
			return Parked{}, err
		}
		return Parked{}, ErrHeld
	case err != nil:
		return Parked{}, Classify(fmt.Errorf("inbox: hold a parked message: %w", err))
	}
	return p, nil
}

// Get returns the parked message id, or ErrNotParked.
func (k *Park) Get(ctx context.Context, id int64) (Parked, error) {
	rows, _ := k.pool.Query(ctx, `SELECT `+parkedColumns+` FROM inbox_parked WHERE id = $1`, id)
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Parked{}, ErrNotParked
	case err != nil:
		return Parked{}, Classify(fmt.Errorf("inbox: read a parked message: %w", err))
	}
	return p, nil
}

// List returns the messages parked from topic (every topic when it is empty), at most limit of
// them (all when limit is 0), in key order: by topic, partition and ordering key, each key's head
// first. Each has Ahead set.
func (k *Park) List(ctx context.Context, topic string, limit int) ([]Parked, error) {
	if limit < 0 {
		return nil, fmt.Errorf("inbox: List needs a limit of 0 or more, got %d", limit)
	}
	var atMost *int // NULL: no limit
	if limit > 0 {
		atMost = &limit
	}
	rows, _ := k.pool.Query(ctx, `
		SELECT `+parkedColumns+`,
			(row_number() OVER (PARTITION BY topic, "partition", ordering_key ORDER BY "offset", id) - 1)::int
		FROM inbox_parked
		WHERE $1 = '' OR topic = $1
		ORDER BY topic, "partition", ordering_key, "offset", id
		LIMIT $2`, topic, atMost)
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Parked, error) {
		var ahead int
		p, err := scanParked(aheadRow{row, &ahead})
		p.Ahead = ahead
		return p, err
	})
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: list parked messages: %w", err))
	}
	return list, nil
}

// aheadRow is a row of parkedColumns followed by the Ahead column, scanned by scanParked.
type aheadRow struct {
	pgx.CollectableRow
	ahead *int
}

func (r aheadRow) Scan(dest ...any) error { return r.CollectableRow.Scan(append(dest, r.ahead)...) }

// RetryNow makes the parked messages ids due now, and returns how many there were. A message that
// is not the head of its key is still tried only after the messages ahead of it.
func (k *Park) RetryNow(ctx context.Context, ids []int64) (int64, error) {
	tag, err := k.pool.Exec(ctx, `UPDATE inbox_parked SET next_attempt_at = now() WHERE id = ANY ($1)`, ids)
	if err != nil {
		return 0, Classify(fmt.Errorf("inbox: retry parked messages now: %w", err))
	}
	return tag.RowsAffected(), nil
}

// RetryAllNow makes every message parked from topic (from every topic when it is empty) due now,
// and returns how many there were.
func (k *Park) RetryAllNow(ctx context.Context, topic string) (int64, error) {
	tag, err := k.pool.Exec(ctx,
		`UPDATE inbox_parked SET next_attempt_at = now() WHERE $1 = '' OR topic = $1`, topic)
	if err != nil {
		return 0, Classify(fmt.Errorf("inbox: retry parked messages now: %w", err))
	}
	return tag.RowsAffected(), nil
}

// Stats describes the park of each topic that has messages parked.
func (k *Park) Stats(ctx context.Context) ([]ParkStats, error) {
	rows, _ := k.pool.Query(ctx, `
		SELECT topic, count(*)::int, (extract(epoch FROM now() - min(parked_at)) * 1000000)::bigint
		FROM inbox_parked GROUP BY topic ORDER BY topic`)
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkStats, error) {
		var st ParkStats
		var micros int64
		err := row.Scan(&st.Topic, &st.Messages, &micros)
		st.OldestAge = max(time.Duration(micros)*time.Microsecond, 0)
		return st, err
	})
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: read the park's statistics: %w", err))
	}
	return stats, nil
}

// parkedColumnsOf is parkedColumns with each column qualified by alias.
func parkedColumnsOf(alias string) string {
	columns := []string{"id", "handler", "topic", `"partition"`, `"offset"`, "ordering_key",
		"idempotency_key", "message_key", "value", "header_keys", "header_values", "attempts", "starts",
		"coalesce(%s.reason, '')", "coalesce(%s.first_error, '')", "coalesce(%s.last_error, '')",
		"first_failed_at", "(extract(epoch FROM %s.budget_spent) * 1000000)::bigint",
		"next_attempt_at", "parked_at", "coalesce(%s.held_by, '')", "held_until", "produced_at",
		"coalesce(%s.verified_by, '')"}
	for i, c := range columns {
		if strings.Contains(c, "%s") {
			columns[i] = strings.ReplaceAll(c, "%s", alias)
		} else {
			columns[i] = alias + "." + c
		}
	}
	return strings.Join(columns, ", ")
}

// storedError makes an error text fit to store: valid UTF-8 without NUL bytes (which Postgres text
// refuses), at most maxParkedError bytes.
func storedError(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= maxParkedError {
		return s
	}
	n := maxParkedError
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// nullText is s, or NULL when it is empty.
func nullText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
