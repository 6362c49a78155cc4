package payment

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxworker/inboxworker"
	"github.com/jackc/pgx/v5"
)

// The order events, as outbox types: what a callback did to its order, published to the handler's
// events topic (Config.EventsTopic) with the order number as Kafka key.
const (
	// EventOrderPaid: the order moved PENDING → PAID.
	EventOrderPaid = "order.paid"
	// EventPaymentFailed: a FAILED payment was recorded; the order is unchanged.
	EventPaymentFailed = "payment.failed"
	// EventPaymentAnomaly: a payment that could not be applied was recorded for a person (its
	// kind: amount_mismatch, duplicate_payment, paid_after_cancel).
	EventPaymentAnomaly = "payment.anomaly"
)

// AggregateType is the outbox aggregate type of the order events: their aggregate id is the order
// number.
const AggregateType = "order"

// Event is the JSON value of an order event (see docs/handlers.md).
type Event struct {
	// EventID is the event's id, also its Idempotency-Key header: derived from Type and the
	// provider transaction (see EventCause), the same however often the event is published.
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	OrderNo string `json:"order_no"`
	// The callback's provider transaction and money (for an anomaly, what was received).
	Provider      string    `json:"provider"`
	ProviderTxnID string    `json:"provider_txn_id"`
	Amount        string    `json:"amount"`
	Currency      string    `json:"currency"`
	PaidAt        time.Time `json:"paid_at"`
	// Kind is the anomaly's kind; payment.anomaly only.
	Kind string `json:"kind,omitempty"`
	// CallbackKey is the idempotency key of the callback that caused the event.
	CallbackKey string `json:"callback_key"`
}

// EventCause is the outbox cause of the order events of a provider transaction: the provider and
// the transaction id, joined by a NUL byte (which neither can hold). An event's id is
// inboxworker.EventID(type, EventCause(provider, providerTxnID)).
func EventCause(provider, providerTxnID string) string { return provider + "\x00" + providerTxnID }

// applied is a callback that was applied, with what it did (an effect or an anomaly's kind).
type applied struct {
	key    string
	cb     Callback
	effect string
}

// emit emits, in one round trip, the order events of the callbacks applied, unless the handler has
// no events topic.
func (h *Handler) emit(ctx context.Context, tx pgx.Tx, done []applied) error {
	if h.events == "" || len(done) == 0 {
		return nil
	}
	events := make([]inboxworker.Event, 0, len(done))
	for _, a := range done {
		value := Event{OrderNo: a.cb.OrderNo, Provider: a.cb.Provider, ProviderTxnID: a.cb.ProviderTxnID,
			Amount: a.cb.Amount, Currency: a.cb.Currency, PaidAt: a.cb.PaidAt, CallbackKey: a.key}
		switch a.effect {
		case EffectPaid:
			value.Type = EventOrderPaid
		case EffectFailedRecorded:
			value.Type = EventPaymentFailed
		case AmountMismatch, DuplicatePayment, PaidAfterCancel:
			value.Type, value.Kind = EventPaymentAnomaly, a.effect
		default:
			return fmt.Errorf("payment: no event for effect %q", a.effect)
		}
		cause := EventCause(a.cb.Provider, a.cb.ProviderTxnID)
		value.EventID = inboxworker.EventID(value.Type, cause)
		events = append(events, inboxworker.Event{Topic: h.events, AggregateType: AggregateType,
			AggregateID: a.cb.OrderNo, Type: value.Type, Cause: cause, Payload: value})
	}
	return inboxworker.EmitBatch(ctx, tx, events)
}
