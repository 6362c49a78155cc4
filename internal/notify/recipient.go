package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
)

// The recipient limits are counted in Postgres, in the lease's transaction (Check), in the table
// notification_counts: one row per idempotency key, so that a retry, a redelivery or a replay of an
// SMS counts once, whichever worker runs it.
//
// Two SMS to one number may be checked at once by two workers (two Kafka keys, two partitions):
// each check first takes a transaction-scoped advisory lock named after the recipient, so the
// second waits for the first's transaction and then counts its row. An advisory lock rather than a
// row lock on a row per recipient: it writes nothing (no row to create first, update at every SMS
// and purge), and it ends with the transaction whatever becomes of it. Two numbers whose names hash
// alike (64 bits) only wait for each other. The lease transactions of several SMS may share one
// (see inboxworker.CallHandler), taking several locks in the order of their messages; two such
// groups taking two numbers in opposite orders deadlock, Postgres ends one of them within a second
// (deadlock_timeout), and its SMS take their leases again one by one.
//
// A row counts while its send may be out (held_until, Config.Hold after the check) and, once the
// send is recorded SENT (its completion sets held_until NULL, in the same transaction), for good:
// an SMS never sent does not spend the recipient's budget. One the provider refused for good stops
// counting at once (Handler.uncount, with Config.Pool); one dead-lettered otherwise (its retries
// exhausted) once its hold lapses. A row is of no use once the
// template's longest window has passed (forget_at); each check deletes a few such rows, so the
// table holds about what the windows hold, without a purger of its own.
//
// The lease's transaction commits without waiting for its flush to disk (synchronous_commit off,
// see package inbox): a crash of Postgres itself (not of a worker) can lose the rows of the checks
// of its last few hundred milliseconds, letting a second SMS through to a number whose first is
// still being sent. That is one SMS more, to a few numbers, after a database crash; a count made
// durable would cost every SMS a flush. The completion, which commits synchronously, writes the row
// again if it was lost, so an SMS recorded SENT always counts.

// Statements of the check of a recipient's limits.
const (
	lockRecipientSQL = `SELECT pg_advisory_xact_lock(hashtextextended('inboxworker.notify.recipient.' || current_schema() || '.' || $1, 0))`

	// forgetCountsSQL deletes up to $1 rows whose windows have all passed, skipping those another
	// transaction is deleting or writing.
	forgetCountsSQL = `
DELETE FROM notification_counts
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM notification_counts WHERE forget_at < now() ORDER BY forget_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`

	// admitSQL is the check of the SMS $3 to the recipient $1, of template $2, in one statement
	// (one snapshot, one round trip), returning one row. When the key is recorded in notifications
	// already, it returns its status and does nothing else. Otherwise it counts, for each window ($4:
	// periods in microseconds, $5: counts), the recipient's other SMS of the template counted within
	// it and still counting; when one window has no room for the SMS, it records the SMS SUPPRESSED
	// ($8: attempts) and returns the shortest such window and its count; when every window has room,
	// it counts the SMS, held for $6 microseconds and remembered for $7, and returns NULLs.
	admitSQL = `
WITH recorded AS (
    SELECT status FROM notifications WHERE idempotency_key = $3
), counts AS (
    SELECT w.period, w.most, count(c.idempotency_key) AS n
    FROM unnest($4::bigint[], $5::bigint[]) AS w(period, most)
    LEFT JOIN notification_counts c
        ON c.recipient = $1 AND c.template = $2 AND c.idempotency_key <> $3
        AND c.counted_at > now() - $7 * interval '1 microsecond' -- the index's range: the longest window
        AND c.counted_at > now() - w.period * interval '1 microsecond'
        AND (c.held_until IS NULL OR c.held_until > now())
    GROUP BY w.period, w.most
), full_window AS (
    SELECT period, most, n FROM counts
    WHERE n >= most AND NOT EXISTS (SELECT FROM recorded)
    ORDER BY period LIMIT 1
), counted AS (
    INSERT INTO notification_counts (idempotency_key, recipient, template, counted_at, held_until, forget_at)
    SELECT $3, $1, $2, now(), now() + $6 * interval '1 microsecond', now() + $7 * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT FROM recorded) AND NOT EXISTS (SELECT FROM full_window)
    ON CONFLICT (idempotency_key) DO UPDATE
    SET recipient = excluded.recipient, template = excluded.template, counted_at = excluded.counted_at,
        held_until = excluded.held_until, forget_at = excluded.forget_at
), suppressed AS (
    INSERT INTO notifications (idempotency_key, recipient, template, status, attempts, sent_at)
    SELECT $3, $1, $2, 'SUPPRESSED', $8, NULL
    WHERE EXISTS (SELECT FROM full_window)
    ON CONFLICT (idempotency_key) DO NOTHING
)
SELECT (SELECT status FROM recorded), f.period, f.most, f.n
FROM (VALUES (1)) AS one LEFT JOIN full_window f ON true`

	// insertNotificationCountedSQL is insertNotificationSQL for an SMS of a limited template: its
	// count becomes final ($6: how long it is remembered, should its row have been lost).
	insertNotificationCountedSQL = `
WITH sent AS (` + insertNotificationSQL + `)
INSERT INTO notification_counts (idempotency_key, recipient, template, counted_at, held_until, forget_at)
VALUES ($1, $2, $3, now(), NULL, now() + $6 * interval '1 microsecond')
ON CONFLICT (idempotency_key) DO UPDATE SET held_until = NULL`
)

// uncount ends the hold of sms, which the provider refused for good: it was not sent, and stops
// counting against its recipient's limits now. The send is over: no transaction is held across it.
// Without a pool, or if Postgres fails, the hold lapses on its own.
func (h *Handler) uncount(ctx context.Context, sms SMS) {
	if h.pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uncountTimeout)
	defer cancel()
	if _, err := h.pool.Exec(ctx, uncountSQL, sms.Key); err != nil {
		h.logger.WarnContext(ctx, "cannot stop counting a refused sms against its recipient; its hold will lapse",
			slog.Any("sms", sms), slog.Any("error", err))
	}
}

// uncountSQL ends the hold of a send not recorded; one recorded counts for good (held_until NULL).
const uncountSQL = `UPDATE notification_counts SET held_until = now()
WHERE idempotency_key = $1 AND held_until > now()`

// uncountTimeout bounds uncount.
const uncountTimeout = 2 * time.Second

// forgetPerCheck is how many rows past their windows a check deletes: more than the one it adds, so
// that the table shrinks back once traffic falls.
const forgetPerCheck = 8

// checkRecipient declines sms, delivered as d, when one of its template's windows already holds as
// many SMS to its recipient as it allows: it is recorded SUPPRESSED, not sent, and logged once the
// record commits. A key recorded already is not sent either (inboxworker.ErrAlreadyApplied).
// Otherwise sms is counted, under its idempotency key, and goes on to be sent. It costs the lease's
// transaction one round trip: the recipient's lock, a few old counts forgotten, and admitSQL.
func (h *Handler) checkRecipient(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery, sms SMS, windows []Window) error {
	periods, counts := make([]int64, len(windows)), make([]int64, len(windows))
	for i, w := range windows {
		periods[i], counts[i] = w.Period.Microseconds(), int64(w.Count)
	}
	b := &pgx.Batch{}
	b.Queue(lockRecipientSQL, sms.To)
	b.Queue(forgetCountsSQL, forgetPerCheck)
	b.Queue(admitSQL, sms.To, sms.Template, sms.Key, periods, counts, h.hold.Microseconds(),
		longest(windows).Microseconds(), max(d.Attempt, 1))
	results := tx.SendBatch(ctx, b)
	_, err := results.Exec()
	if err == nil {
		_, err = results.Exec()
	}
	var status *string
	var period, most, n *int64
	if err == nil {
		err = results.QueryRow().Scan(&status, &period, &most, &n)
	}
	if err := errors.Join(err, results.Close()); err != nil {
		return fmt.Errorf("notify: count the recipient's sms: %w", err)
	}
	switch {
	case status != nil:
		return h.alreadyRecorded(ctx, sms, *status)
	case period == nil:
		return nil // counted: it goes on to be sent
	}
	full := Window{Count: int(*most), Period: time.Duration(*period) * time.Microsecond}
	limit := strconv.Itoa(full.Count) + "/" + envflag.FormatDuration(full.Period)
	inboxworker.AfterCommit(ctx, func(ctx context.Context) {
		h.logger.InfoContext(ctx, "sms over its recipient's limit; not sending it", slog.Any("sms", sms),
			slog.String("limit", limit), slog.Int64("counted", *n), slog.Int("attempt", d.Attempt))
	})
	return inboxworker.Suppressed(fmt.Errorf("notify: %d sms of %s to %s in the last %s already, the limit %s",
		*n, sms.Template, MaskPhone(sms.To), envflag.FormatDuration(full.Period), limit))
}
