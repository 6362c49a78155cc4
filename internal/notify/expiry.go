package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
)

// expiry returns when sms, delivered as d, stops being worth sending: its event's expires_at, else
// its production time (the record's timestamp) plus its template's validity; zero when never. An
// SMS whose production time is unknown has only its expires_at.
func (h *Handler) expiry(d inboxworker.Delivery, sms SMS) time.Time {
	if !sms.ExpiresAt.IsZero() {
		return sms.ExpiresAt
	}
	validity, ok := h.validity[sms.Template]
	if !ok || d.Produced.IsZero() {
		return time.Time{}
	}
	return d.Produced.Add(validity)
}

// insertExpiredSQL records an SMS as EXPIRED, unless its key is recorded already (its inbox row has
// expired, or a completion that outlived its lease recorded it SENT): then it returns nothing.
const insertExpiredSQL = `
INSERT INTO notifications (idempotency_key, recipient, template, status, attempts, sent_at)
VALUES ($1, $2, $3, 'EXPIRED', $4, NULL)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING status`

// checkExpiry declines sms, delivered as d, whose expiry (see expiry), at, has passed by the worker's
// clock: it is recorded EXPIRED, not sent, and logged once the record commits; a key recorded
// already is not sent either (inboxworker.ErrAlreadyApplied). Check runs in the lease's transaction
// right before the send, so whatever the SMS waited for before (a retry's backoff, the park, a pause
// of the route) counts.
func (h *Handler) checkExpiry(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery, sms SMS, at time.Time) error {
	late := time.Since(at)
	var status string
	err := tx.QueryRow(ctx, insertExpiredSQL, sms.Key, sms.To, sms.Template, max(d.Attempt, 1)).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return h.recorded(ctx, tx, sms)
	case err != nil:
		return fmt.Errorf("notify: record notification: %w", err)
	}
	inboxworker.AfterCommit(ctx, func(ctx context.Context) {
		h.logger.InfoContext(ctx, "sms expired before it could be sent; not sending it", slog.Any("sms", sms),
			slog.Time("expired_at", at), slog.Duration("late_by", late.Round(time.Millisecond)),
			slog.Int("attempt", d.Attempt))
	})
	return inboxworker.Expired(fmt.Errorf("notify: the sms to %s expired at %s", MaskPhone(sms.To),
		at.UTC().Format(time.RFC3339)))
}

// recorded is Check's answer for sms, whose key notifications holds already.
func (h *Handler) recorded(ctx context.Context, tx pgx.Tx, sms SMS) error {
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM notifications WHERE idempotency_key = $1`, sms.Key).Scan(&status); err != nil {
		return fmt.Errorf("notify: read notifications: %w", err)
	}
	return h.alreadyRecorded(ctx, sms, status)
}
