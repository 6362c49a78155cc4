// Package receipt turns a paid order into a "payment received" SMS: it consumes the order events
// of the payment route (package payment, published from the outbox) and, for each order.paid whose
// order has a phone (orders.phone), emits an SMS event of template payment_received to the SMS
// topic, through the outbox, in the transaction of the order event's inbox row. The SMS route then
// sends it as any other SMS event: once per key, with the provider's idempotency, its limits and
// its dead letters.
//
// The SMS event's idempotency key is derived from the order event's id, so an order event
// delivered again, or published again by the relay, never makes a second SMS: the inbox skips it,
// and were its key forgotten, the SMS event written again would have the same key, which the SMS
// route does not send twice.
//
// receipt reads orders and writes the outbox; it sends nothing itself and knows nothing of Kafka.
// Other order events (payment.failed, payment.anomaly) are applied with no inboxworker.
package receipt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// Template is the SMS template of a receipt. Its params are order_no, amount and currency.
const Template = "payment_received"

// EventType is the outbox type of the SMS events it emits; their aggregate is the phone number.
const EventType = "sms.payment_received"

// Config configures a Handler.
type Config struct {
	// SMSTopic is where the SMS events are emitted. Required.
	SMSTopic string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Handler applies order events. It is safe for concurrent use.
type Handler struct {
	topic  string
	logger *slog.Logger
}

// NewHandler returns a Handler.
func NewHandler(config Config) (*Handler, error) {
	if config.SMSTopic == "" {
		return nil, errors.New("receipt: Config.SMSTopic is required")
	}
	return &Handler{topic: config.SMSTopic, logger: cmp.Or(config.Logger, slog.Default())}, nil
}

// sms is the value of an SMS event (see the SMS event of the contract).
type sms struct {
	EventID  string            `json:"event_id"`
	Phone    string            `json:"phone"`
	Template string            `json:"template"`
	Params   map[string]string `json:"params"`
}

// Handle applies one order event through tx; see HandleBatch.
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	return h.HandleBatch(ctx, tx, []inboxworker.Delivery{d})[0]
}

// HandleBatch applies order events through tx, the transaction of their inbox rows: for the
// order.paid events whose order has a valid phone, one SMS event each, all emitted in one round trip
// after one read of the orders. An event that is not a JSON object with event_id, type and
// order_no is refused (invalid_payload), and the later ones are left.
func (h *Handler) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery) []error {
	errs := make([]error, len(ds))
	var paid []payment.Event
	for i, d := range ds {
		e, err := decode(d.Value)
		if err != nil {
			errs[i] = err
			break
		}
		if e.Type == payment.EventOrderPaid {
			paid = append(paid, e)
		}
	}
	if len(paid) == 0 {
		return errs
	}
	if err := h.emit(ctx, tx, paid); err != nil {
		errs[0] = err // the transaction is unusable: reported on the first
	}
	return errs
}

func decode(value []byte) (payment.Event, error) {
	var e payment.Event
	if err := json.Unmarshal(value, &e); err != nil {
		return e, inboxworker.Permanent(inboxworker.InvalidPayload, fmt.Errorf("order event: not a JSON object of an order event: %v", err))
	}
	for name, v := range map[string]string{"event_id": e.EventID, "type": e.Type, "order_no": e.OrderNo} {
		if v == "" {
			return e, inboxworker.Permanent(inboxworker.InvalidPayload, fmt.Errorf("order event: %s: required", name))
		}
	}
	return e, nil
}

// emit emits the receipts of the paid orders that have a phone.
func (h *Handler) emit(ctx context.Context, tx pgx.Tx, paid []payment.Event) error {
	orderNos := make([]string, len(paid))
	for i, e := range paid {
		orderNos[i] = e.OrderNo
	}
	rows, _ := tx.Query(ctx, `SELECT order_no, phone FROM orders WHERE order_no = ANY ($1) AND phone IS NOT NULL`, orderNos)
	phones := map[string]string{}
	var orderNo, phone string
	if _, err := pgx.ForEachRow(rows, []any{&orderNo, &phone}, func() error { phones[orderNo] = phone; return nil }); err != nil {
		return fmt.Errorf("receipt: read the orders' phones: %w", err)
	}
	var events []inboxworker.Event
	for _, e := range paid {
		phone, ok := phones[e.OrderNo]
		switch {
		case !ok:
			continue
		case !notify.ValidPhone(phone):
			h.logAfterCommit(ctx, slog.LevelWarn, "order has a phone not in E.164; no payment-received SMS", e, phone)
			continue
		}
		id := inboxworker.EventID(EventType, e.EventID)
		events = append(events, inboxworker.Event{Topic: h.topic, AggregateType: "phone", AggregateID: phone,
			Type: EventType, Cause: e.EventID, Payload: sms{EventID: id, Phone: phone, Template: Template,
				Params: map[string]string{"order_no": e.OrderNo, "amount": e.Amount, "currency": e.Currency}}})
		h.logAfterCommit(ctx, slog.LevelInfo, "payment-received SMS requested", e, phone)
	}
	return inboxworker.EmitBatch(ctx, tx, events)
}

// logAfterCommit logs msg about the order event e once the transaction of ctx commits, the phone
// masked.
func (h *Handler) logAfterCommit(ctx context.Context, level slog.Level, msg string, e payment.Event, phone string) {
	if !h.logger.Enabled(ctx, level) {
		return
	}
	inboxworker.AfterCommit(ctx, func(ctx context.Context) {
		h.logger.Log(ctx, level, msg, slog.String("order_no", e.OrderNo), slog.String("order_event_id", e.EventID),
			slog.String("to", notify.MaskPhone(phone)))
	})
}
