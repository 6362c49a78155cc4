package notify

import (
	"context"
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

// checkExpiry declines sms, delivered as d, once its expiry (see expiry) has passed by the worker's
// clock: it is recorded EXPIRED, not sent, and logged once the record commits. Check runs in the
// lease's transaction right before the send, so whatever the SMS waited for before (a retry's
// backoff, the park, a pause of the route) counts.
func (h *Handler) checkExpiry(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery, sms SMS) error {
	at := h.expiry(d, sms)
	now := time.Now()
	if at.IsZero() || now.Before(at) {
		return nil
	}
	if err := recordNotSent(ctx, tx, sms, "EXPIRED", d); err != nil {
		return err
	}
	late := now.Sub(at)
	inboxworker.AfterCommit(ctx, func(ctx context.Context) {
		h.logger.InfoContext(ctx, "sms expired before it could be sent; not sending it", slog.Any("sms", sms),
			slog.Time("expired_at", at), slog.Duration("late_by", late.Round(time.Millisecond)),
			slog.Int("attempt", d.Attempt))
	})
	return inboxworker.Expired(fmt.Errorf("notify: the sms to %s expired at %s", MaskPhone(sms.To),
		at.UTC().Format(time.RFC3339)))
}
