// Package notify sends the SMS of the notifications.sms topic, once per idempotency key.
//
// Handler is a call handler (see inboxworker.CallHandler): the send is a network call, made with no
// transaction open and no database connection held. The consumer claims the message's key first (a
// lease, in a short transaction, in which Check decodes the event and looks for the key in
// notifications); Call then sends it through a Sender with the message's idempotency key; the
// completion Call returns records a notifications row (status SENT, the provider's message id) in the
// transaction that writes the key's inbox row and releases the lease, so the row and the inbox key
// commit together or not at all. Claims, and completions, of SMS that arrive together share
// transactions (see inboxworker.CallHandler); the line logging a sent SMS is written once its record
// committed. A failed send records nothing; the consumer retries the message later, and the retry
// sends again with the same key. The lease keeps two workers from sending for one key at the same
// time.
//
// Check, the last step before each send, also declines what is not to be sent: an SMS too old to be
// of use (its event's expires_at, or its template's validity from its production time, Config.
// Validity) is recorded EXPIRED (inboxworker.Expired); one over its recipient's limits (Config.
// RecipientLimits, counted in Postgres by idempotency key: see recipient.go) is recorded SUPPRESSED
// (inboxworker.Suppressed). Either is recorded with its key, so a redelivery stays a no-op, and is
// never a dead letter.
//
// Two senders: HTTPSender speaks the HTTP provider contract (Idempotency-Key header, JSON body, status
// codes mapped to package fault; with a tracing.Tracer, a client span per request and its
// traceparent header); LogSender only logs, for development and for deployments without a
// provider. Phone numbers appear in logs and error text only masked (MaskPhone), the provider token
// never.
//
// notify knows SMS providers and nothing of Kafka or offsets. It does not retry, back off or
// dead-letter (its errors are classified with package fault, the consumer acts on them), does not
// render message text (a template is a name the provider knows), and does not purge notifications.
//
// # The remaining window
//
// Postgres and the provider cannot commit together. If the provider accepts a message and the process
// dies (or loses Postgres) before the completion commits, nothing is recorded, the Kafka offset is not
// committed, and the message is processed again once the dead process's lease has expired
// (Route.CallLease in package inboxworker, 15s by default): a second provider call. That call carries the same Idempotency-Key (and the
// same reference in the body) as the first, because the key is the message's own idempotency key,
// not something generated per attempt. A provider that honours Idempotency-Key answers it with the
// first message's id and does not deliver again, so the person receives one SMS and the
// notifications row holds the id of the delivered message. A provider that ignores the key delivers
// twice in this window and only then; the window is as wide as one provider request plus the commit.
package notify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/fault"
)

// ProviderRejected is the dead-letter reason of an SMS the provider refused for good: any answer but
// 2xx, 408, 429 and 5xx, a redirect among them.
const ProviderRejected inboxworker.Reason = "provider_rejected"

// SMS is one message to send.
type SMS struct {
	// Key is the idempotency key, passed to the provider so that a resend is not delivered twice.
	Key string
	// To is the recipient, in E.164.
	To string
	// Template names the provider's message template.
	Template string
	// Params fill the template's placeholders.
	Params map[string]string
	// ExpiresAt, when set, is the event's own expiry: it is not sent after it, whatever the
	// template's validity says. Zero: the template's validity, if any, holds.
	ExpiresAt time.Time
}

// LogValue logs an SMS with its number masked and without its params' values, which may be codes.
func (s SMS) LogValue() slog.Value {
	names := make([]string, 0, len(s.Params))
	for name := range s.Params {
		names = append(names, name)
	}
	slices.Sort(names)
	return slog.GroupValue(
		slog.String("key", s.Key),
		slog.String("to", MaskPhone(s.To)),
		slog.String("template", s.Template),
		slog.Any("params", names),
	)
}

// Sender delivers an SMS through a provider.
type Sender interface {
	// Send delivers sms and returns the provider's id for the message, "" when the provider accepted it
	// without one. sms.Key goes to the provider as its idempotency key: two sends with one key are one
	// message to a provider that honours it. Errors are classified with package fault: retryable when
	// a later try may succeed, permanent with reason ProviderRejected when it cannot. Neither the
	// error nor any log line holds the full number or a credential.
	Send(ctx context.Context, sms SMS) (providerMessageID string, err error)
}

// Config configures a Handler.
type Config struct {
	// Sender delivers the messages. Required; NewLogSender when there is no provider.
	Sender Sender
	// Validity is how long after it was produced an SMS of each template is still sent
	// (SMS_VALIDITY); an event's own expires_at wins. Nil: an SMS expires only by its expires_at.
	Validity Validity
	// RecipientLimits caps the SMS of each template to one recipient (SMS_RECIPIENT_LIMIT). Nil:
	// no cap.
	RecipientLimits RecipientLimits
	// Hold is how long an SMS that RecipientLimits let through counts against them before its send
	// is recorded: it must outlast the call and its completion, the route's CallLease. A send never
	// recorded (dead-lettered) stops counting after it. Defaults to 30s, twice inboxworker's default
	// CallLease.
	Hold time.Duration
	// Pool, when set, lets a send the provider refused for good stop counting against its
	// recipient's limits at once, rather than once its Hold lapses: a code the provider rejected
	// must not keep the next one from going out. Nil: the Hold lapses.
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Handler applies SMS events: it implements the consumer's CallHandler interface.
type Handler struct {
	sender   Sender
	validity Validity
	limits   RecipientLimits
	hold     time.Duration
	pool     *pgxpool.Pool
	logger   *slog.Logger
}

// defaultHold is Config.Hold's default.
const defaultHold = 30 * time.Second

// NewHandler returns a Handler, or an error naming the first invalid field of config.
func NewHandler(config Config) (*Handler, error) {
	if config.Sender == nil {
		return nil, errors.New("notify: Config.Sender is required")
	}
	if config.Hold < 0 {
		return nil, fmt.Errorf("notify: Config.Hold must be positive, got %s", config.Hold)
	}
	for template, d := range config.Validity {
		if d <= 0 {
			return nil, fmt.Errorf("notify: Config.Validity[%q] must be positive, got %s", template, d)
		}
	}
	limits := make(RecipientLimits, len(config.RecipientLimits))
	for template, windows := range config.RecipientLimits {
		if len(windows) == 0 || slices.ContainsFunc(windows, func(w Window) bool { return w.Count < 1 || w.Period <= 0 }) {
			return nil, fmt.Errorf("notify: Config.RecipientLimits[%q] needs windows of a positive count and period, got %v",
				template, windows)
		}
		limits[template] = slices.SortedFunc(slices.Values(windows), func(a, b Window) int { return cmp.Compare(a.Period, b.Period) })
	}
	return &Handler{sender: config.Sender, validity: maps.Clone(config.Validity), limits: limits,
		hold: cmp.Or(config.Hold, defaultHold), pool: config.Pool, logger: cmp.Or(config.Logger, slog.Default())}, nil
}

const insertNotificationSQL = `
INSERT INTO notifications (idempotency_key, recipient, template, status, provider_message_id, attempts, sent_at)
VALUES ($1, $2, $3, 'SENT', $4, $5, clock_timestamp())`

// Check is the first step of an SMS event (see inboxworker.CallHandler), run in the claim transaction
// of d.Key right before the send: an invalid event is a permanent inboxworker.InvalidPayload error; a
// key already in notifications (its inbox row has expired; the SMS was sent, or not on purpose) is
// inboxworker.ErrAlreadyApplied, so it is not sent again. An SMS whose validity has passed is
// recorded EXPIRED and declined (inboxworker.Expired, see checkExpiry), and one over its recipient's
// limit is recorded SUPPRESSED and declined (inboxworker.Suppressed, see checkRecipient). Each way
// costs the transaction one round trip.
func (h *Handler) Check(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	sms, err := Decode(d.Value)
	if err != nil {
		return err
	}
	sms.Key = d.Key
	if at := h.expiry(d, sms); !at.IsZero() && !time.Now().Before(at) {
		return h.checkExpiry(ctx, tx, d, sms, at)
	}
	if windows := h.limits[sms.Template]; len(windows) > 0 {
		return h.checkRecipient(ctx, tx, d, sms, windows)
	}
	var status string
	err = tx.QueryRow(ctx, `SELECT status FROM notifications WHERE idempotency_key = $1`, d.Key).Scan(&status)
	switch {
	case err == nil:
		return h.alreadyRecorded(ctx, sms, status)
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("notify: read notifications: %w", err)
	}
	return nil
}

// alreadyRecorded is Check's answer for sms, whose key notifications holds with status already.
func (h *Handler) alreadyRecorded(ctx context.Context, sms SMS, status string) error {
	h.logger.InfoContext(ctx, "sms already recorded under this key; not sending again", slog.Any("sms", sms),
		slog.String("status", status))
	return inboxworker.ErrAlreadyApplied
}

// Call sends the SMS of d, with no transaction open, and returns the completion that records it as
// SENT with the provider's message id, in the transaction that writes d.Key's inbox row; for a
// template with recipient limits, the completion also makes its count final. A failed send returns
// the sender's classified error and records nothing.
func (h *Handler) Call(ctx context.Context, d inboxworker.Delivery) (inboxworker.Completion, error) {
	sms, err := Decode(d.Value)
	if err != nil {
		return nil, err
	}
	sms.Key = d.Key
	id, err := h.sender.Send(ctx, sms)
	if err != nil {
		if kind, _, _ := fault.Classify(err); kind == fault.KindPermanent && len(h.limits[sms.Template]) > 0 {
			h.uncount(ctx, sms)
		}
		return nil, fmt.Errorf("notify: send to %s: %w", MaskPhone(sms.To), err)
	}
	var storedID *string
	if id != "" {
		storedID = &id
	} else {
		h.logger.WarnContext(ctx, "sms provider accepted the message without an id to record "+
			"(none, one that is neither a string nor a number, or two that differ); recording it with none",
			slog.Any("sms", sms))
	}
	sql, args := insertNotificationSQL, []any{sms.Key, sms.To, sms.Template, storedID, max(d.Attempt, 1)}
	if windows := h.limits[sms.Template]; len(windows) > 0 {
		sql, args = insertNotificationCountedSQL, append(args, longest(windows).Microseconds())
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("notify: record notification: %w", err)
		}
		// Logged once the record commits, which may be in a transaction that records other SMS too
		// and is rolled back and done again alone: a line for what is recorded, once. A send whose
		// record does not commit is sent again, with the same key, and logged then.
		inboxworker.AfterCommit(ctx, func(ctx context.Context) {
			// The id is stored whole; logged, a phone number in it is masked: a provider may use
			// the recipient's number, or another, as its message id.
			h.logger.InfoContext(ctx, "sms accepted by the provider", slog.Any("sms", sms),
				slog.String("provider_message_id", maskMessageID(id, sms.To)), slog.Int("attempt", d.Attempt))
		})
		return nil
	}, nil
}
