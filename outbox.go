package inboxworker

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/outbox"
)

// Emit writes e to the outbox through tx, the transaction of the handler's effect: the event is
// published if and only if the effect commits, at least once, a resend carrying the same id. The
// worker's relay (Config.EventTopics) publishes it; a worker without EventTopics writes it as a row
// of the table outbox, in the shape Debezium's outbox event router relays.
func Emit(ctx context.Context, tx pgx.Tx, e Event) error { return outbox.Emit(ctx, tx, e) }

// EmitBatch is Emit for several events, in one round trip: for a BatchHandler, the events of its
// batch, which the worker's relay stores as one row. An event whose id an earlier one of events has
// is left out.
func EmitBatch(ctx context.Context, tx pgx.Tx, events []Event) error {
	return outbox.EmitBatch(ctx, tx, events)
}

// EventID returns the id of the event of eventType caused by cause: a UUIDv5 (RFC 9562), the same
// every time, so that an event emitted again for one cause is recognised downstream.
func EventID(eventType, cause string) string { return outbox.EventID(eventType, cause) }
