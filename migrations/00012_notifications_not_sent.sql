-- +goose Up
-- An SMS not sent on purpose is recorded too, committed with its inbox row: EXPIRED (too late to be
-- of use, SMS_VALIDITY or the event's expires_at) or SUPPRESSED (over its recipient's limit,
-- SMS_RECIPIENT_LIMIT), with no send time (sent_at NULL) and no provider id. The checks are added
-- NOT VALID: every row already there satisfies them (the check they replace allowed SENT only, and
-- sent_at was NOT NULL), so the table, which may be large, is not scanned under its lock; Postgres
-- holds every new and updated row to them all the same.
ALTER TABLE notifications
    DROP CONSTRAINT notifications_status_check,
    ADD CONSTRAINT notifications_status_check CHECK (status IN ('SENT', 'EXPIRED', 'SUPPRESSED')) NOT VALID,
    ALTER COLUMN sent_at DROP NOT NULL,
    ADD CONSTRAINT notifications_sent_at_check CHECK ((status = 'SENT') = (sent_at IS NOT NULL)) NOT VALID;

-- The SMS counted against their recipient's limits (SMS_RECIPIENT_LIMIT), one row per idempotency
-- key, so that a retry, a redelivery or a replay of one SMS counts once. The lease that lets an SMS
-- through writes its row, held while the send may be out (held_until); the completion that records
-- it SENT makes it count for good (held_until NULL). A send never recorded (dead-lettered, say) stops
-- counting once its hold lapses. A row is of no use after its template's longest window (forget_at):
-- the leases of later SMS delete such rows, a few at a time.
CREATE TABLE notification_counts (
    idempotency_key  text        PRIMARY KEY,
    recipient        text        NOT NULL, -- E.164, as in notifications
    template         text        NOT NULL,
    counted_at       timestamptz NOT NULL,
    held_until       timestamptz,          -- NULL: sent
    forget_at        timestamptz NOT NULL
);

CREATE INDEX notification_counts_recipient_idx ON notification_counts (recipient, template, counted_at);
CREATE INDEX notification_counts_forget_at_idx ON notification_counts (forget_at);

-- +goose Down
DROP TABLE notification_counts;
DELETE FROM notifications WHERE status <> 'SENT';
ALTER TABLE notifications
    DROP CONSTRAINT notifications_sent_at_check,
    DROP CONSTRAINT notifications_status_check,
    ADD CONSTRAINT notifications_status_check CHECK (status IN ('SENT')),
    ALTER COLUMN sent_at SET NOT NULL;
