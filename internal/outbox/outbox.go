// Package outbox is the transactional outbox: a handler emits events in the transaction of its
// effect (Emit, EmitBatch), so that an event exists if and only if the effect committed, and the
// relay (Relay) publishes them to Kafka afterwards, each aggregate's in the order their transactions
// committed, at least once, a resend carrying the same id.
//
// An event's id is derived from what caused it (EventID: a UUIDv5 of its type and its cause, such as
// a payment provider's transaction), never drawn at random: the same event emitted again — by a
// redelivery whose inbox key has expired, by a relay publishing again after a crash — has the same
// id. The relay sends the id as the Kafka header Idempotency-Key, so a consumer downstream
// (inboxworker itself) applies each event once.
//
// An emission (an Emit or EmitBatch) is one row of the table outbox_batches, its events as arrays
// in their order: one tuple and one index entry however many events it holds, which is what makes
// emitting cheap. A worker that runs no relay of its own writes a row per event into the table
// outbox instead (WithEventRows), the shape of Debezium's outbox event router (id, aggregatetype,
// aggregateid, type, payload, tracingspancontext), for a Debezium connector to relay. The view
// outbox_events shows the events of both, a row each.
//
// Commit order per aggregate comes from locks, not from counters: an emitter holds, until its
// transaction ends, its outbox's emitter lock (shared) and each of its aggregates' locks
// (exclusive), all transaction-level advisory locks, and draws the events' positions under them. A
// second emitter of one aggregate waits until the first commits or rolls back, so an aggregate's
// positions follow the order its transactions committed. The relay publishes in position order, and
// only up to a horizon below which no transaction still running holds a position: it reads the last
// position drawn, then which transactions hold the emitter lock, and passes that position once all
// of those have ended (see horizon.go). So a position that commits late is never overtaken, and the
// relay needs no mark on each row: its cursor (every event up to it published) is one column of its
// lease.
//
// One relay publishes at a time across all the instances sharing the outbox, under a lease in
// Postgres (holder, epoch, expires_at) that it renews while it runs and that another instance takes
// over once it has expired. No Postgres connection is held while the relay waits on Kafka: it reads
// a batch, lets the connection go, publishes, then marks the batch published.
//
// outbox knows Postgres and the Kafka producer, and nothing of the consumer or of handlers: it does
// not decide which events a handler emits, nor route them by anything but the topic each names.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/inboxworker/inboxworker/internal/inbox"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// Event is one event to publish.
type Event = inboxtype.Event

// MaxPayloadBytes bounds an event's encoded payload, well under Kafka's default limit of a message
// (1 MiB), which the relay must never meet: a message Kafka refuses would hold back its aggregate's
// later events for good.
const MaxPayloadBytes = 512 << 10

// maxNameLen bounds an event's aggregate type, aggregate id and type, in characters.
const maxNameLen = 255

// Namespace is the UUID namespace of event ids: the UUIDv5 of the URL
// "https://github.com/inboxworker/inboxworker/outbox" in the URL namespace.
var Namespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/inboxworker/inboxworker/outbox"))

// EventID returns the id of the event of type eventType caused by cause: the UUIDv5 (RFC 9562) of
// eventType, a NUL byte and cause in Namespace, in its text form. The same type and cause always
// give the same id; a consumer can compute it too.
func EventID(eventType, cause string) string { return eventUUID(eventType, cause).String() }

func eventUUID(eventType, cause string) uuid.UUID {
	return uuid.NewSHA1(Namespace, []byte(eventType+"\x00"+cause))
}

// Emit writes e to the outbox through tx, the transaction of the handler's effect: the event is
// published if and only if tx commits. Emit writes what it is given: the inbox, which commits an
// effect once per message, keeps an event from being emitted twice, and an event emitted again all
// the same (the same type and cause) has the same id. The trace context of ctx, if any, goes with
// the event (the W3C traceparent, through OpenTelemetry's global propagator).
//
// Emit's errors are an invalid event's (a handler's bug) or Postgres's, which the inbox classifies
// like any other of the transaction.
func Emit(ctx context.Context, tx pgx.Tx, e Event) error {
	return EmitBatch(ctx, tx, []Event{e})
}

// EmitBatch is Emit for several events, in one round trip and one row: for a batch handler, the
// events of its whole batch. Events of one aggregate are ordered as they are in events; an event
// whose id an earlier one of events has is left out.
func EmitBatch(ctx context.Context, tx pgx.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	rows, err := newRows(events, traceContext(ctx))
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	if aggregates := rows.aggregates(); len(aggregates.types) <= MaxAggregateLocks {
		b.Queue(lockSharedSQL)
		b.Queue(lockAggregatesSQL, aggregates.types, aggregates.ids)
	} else {
		b.Queue(lockExclusiveSQL)
	}
	if eventRows(ctx) {
		b.Queue(emitRowsSQL, rows.ids, rows.topics, rows.aggregateTypes, rows.aggregateIDs, rows.types, rows.payloads,
			rows.trace)
	} else {
		b.Queue(emitSQL, rows.ids, rows.topics, rows.aggregateTypes, rows.aggregateIDs, rows.types, rows.payloads,
			rows.trace)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: emit %d events: %w", len(events), err)
	}
	inbox.AfterCommit(ctx, func(context.Context) { emitted.notify() })
	return nil
}

// MaxAggregateLocks is the most aggregates whose locks one EmitBatch takes. Each lock is an entry of
// Postgres's shared lock table (max_locks_per_transaction × max_connections entries, 6,400 by
// default), so a batch of more aggregates takes the outbox's emitter lock exclusively instead: it
// then waits for every other emitter of the outbox, and they for it, until its transaction ends.
const MaxAggregateLocks = 512

// The emitter's locks, all transaction-level advisory locks: held until the transaction ends, and
// all taken before the events' positions are drawn. The emitter lock names the outbox by its schema
// (one outbox per schema), an aggregate's lock the schema, the aggregate's type and its id. A batch
// takes its aggregates' locks in one order, so that two batches of the same aggregates wait for each
// other rather than deadlock.
const (
	emitterLockKey    = `hashtextextended('inboxworker.outbox.' || current_schema(), 0)`
	lockSharedSQL     = `SELECT pg_advisory_xact_lock_shared(` + emitterLockKey + `)`
	lockExclusiveSQL  = `SELECT pg_advisory_xact_lock(` + emitterLockKey + `)`
	lockAggregatesSQL = `
SELECT count(pg_advisory_xact_lock(k)) FROM (
	SELECT DISTINCT hashtextextended(current_schema() || '/' || length(t) || '/' || t || '/' || i, 0) AS k
	FROM unnest($1::text[], $2::text[]) AS a(t, i)
	ORDER BY 1
) AS l`
)

// emitSQL writes an emission's events as one row of outbox_batches, at the next position: the
// layout the worker's relay reads.
const emitSQL = `
INSERT INTO outbox_batches (ids, topics, aggregatetypes, aggregateids, types, payloads, tracingspancontext)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// emitRowsSQL writes an emission's events as rows of outbox, each at the next position, in their
// order: the layout of Debezium's outbox event router, for a worker that runs no relay (see
// WithEventRows). An event whose id is in the table already is not written again.
const emitRowsSQL = `
INSERT INTO outbox (id, topic, aggregatetype, aggregateid, type, payload, tracingspancontext)
SELECT id, topic, aggregatetype, aggregateid, type, payload::json, $7
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
	WITH ORDINALITY AS i(id, topic, aggregatetype, aggregateid, type, payload, ord)
ORDER BY ord
ON CONFLICT (id) DO NOTHING`

// WithEventRows returns ctx telling Emit and EmitBatch to write a row of the table outbox per event,
// the shape Debezium's outbox event router relays, rather than a row of outbox_batches per emission,
// which the worker's relay reads. A worker that runs no relay of its own gives its handlers such a
// context.
func WithEventRows(ctx context.Context) context.Context {
	return context.WithValue(ctx, eventRowsKey{}, true)
}

type eventRowsKey struct{}

func eventRows(ctx context.Context) bool {
	v, _ := ctx.Value(eventRowsKey{}).(bool)
	return v
}

// rows are events as the columns of emitSQL. The ids are pgtype.UUIDs, whose Go type names their
// Postgres type: pgx sends them in binary whatever the connection's default_query_exec_mode, where
// bare [16]byte values have no type to encode to unless the statement was described first.
type rows struct {
	ids                                                   []pgtype.UUID
	topics, aggregateTypes, aggregateIDs, types, payloads []string
	trace                                                 *string // the emitter's, for every event
}

// newRows checks events and returns them as columns, each id once: an event whose id an earlier
// event of events has (the same type and cause) is left out.
func newRows(events []Event, trace *string) (*rows, error) {
	n := len(events)
	r := &rows{ids: make([]pgtype.UUID, 0, n), topics: make([]string, 0, n), aggregateTypes: make([]string, 0, n),
		aggregateIDs: make([]string, 0, n), types: make([]string, 0, n), payloads: make([]string, 0, n), trace: trace}
	seen := make(map[uuid.UUID]bool, n)
	for i, e := range events {
		payload, err := checkEvent(e)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d of %d: %w", i+1, n, err)
		}
		id := eventUUID(e.Type, e.Cause)
		if seen[id] {
			continue
		}
		seen[id] = true
		r.ids = append(r.ids, pgtype.UUID{Bytes: id, Valid: true})
		r.topics, r.aggregateTypes = append(r.topics, e.Topic), append(r.aggregateTypes, e.AggregateType)
		r.aggregateIDs, r.types = append(r.aggregateIDs, e.AggregateID), append(r.types, e.Type)
		r.payloads = append(r.payloads, string(payload))
	}
	return r, nil
}

// aggregates are the distinct aggregates of r, as two columns.
type aggregates struct{ types, ids []string }

func (r *rows) aggregates() aggregates {
	type aggregate struct{ typ, id string }
	seen := make(map[aggregate]bool, len(r.aggregateIDs))
	var a aggregates
	for i, id := range r.aggregateIDs {
		k := aggregate{r.aggregateTypes[i], id}
		if !seen[k] {
			seen[k] = true
			a.types, a.ids = append(a.types, k.typ), append(a.ids, k.id)
		}
	}
	return a
}

// checkEvent validates e and returns its encoded payload.
func checkEvent(e Event) ([]byte, error) {
	for _, f := range []struct{ name, value string }{
		{"Topic", e.Topic}, {"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID},
		{"Type", e.Type}, {"Cause", e.Cause},
	} {
		switch {
		case f.value == "":
			return nil, fmt.Errorf("%s is required", f.name)
		case !utf8.ValidString(f.value):
			return nil, fmt.Errorf("%s is not valid UTF-8", f.name)
		case f.name != "Cause" && strings.ContainsRune(f.value, 0):
			return nil, fmt.Errorf("%s contains a NUL character", f.name)
		case f.name != "Cause" && utf8.RuneCountInString(f.value) > maxNameLen:
			return nil, fmt.Errorf("%s is longer than %d characters", f.name, maxNameLen)
		}
	}
	payload, err := encodePayload(e.Payload)
	switch {
	case err != nil:
		//lint:ignore ST1005 it begins with the field's name, as checkEvent's other errors do
		return nil, fmt.Errorf("Payload: %w", err)
	case len(payload) > MaxPayloadBytes:
		//lint:ignore ST1005 it begins with the field's name, as checkEvent's other errors do
		return nil, fmt.Errorf("Payload is %d bytes, more than %d", len(payload), MaxPayloadBytes)
	}
	return payload, nil
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, errors.New("required")
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		return json.Marshal(v)
	}
	if !json.Valid(raw) {
		return nil, errors.New("not valid JSON")
	}
	return raw, nil
}

// traceContext is the W3C trace context of ctx as tracingspancontext stores it — java.util.Properties
// text, one "key=value" line per field (traceparent, and tracestate when there is one), which is
// what Debezium's router reads — or nil when ctx carries none (or no propagator is set).
func traceContext(ctx context.Context) *string {
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	parent := carrier.Get(traceparent)
	if parent == "" {
		return nil
	}
	text := traceparent + "=" + parent + "\n"
	if state := carrier.Get(tracestate); state != "" {
		text += tracestate + "=" + state + "\n"
	}
	return &text
}

// The W3C trace context's fields, as header names.
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

// traceHeaders parses tracingspancontext back into its fields. Only the W3C fields are kept, and a
// line that is not "key=value" is skipped.
func traceHeaders(text string) [][2]string {
	var out [][2]string
	for line := range strings.Lines(text) {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && (key == traceparent || key == tracestate) && value != "" {
			out = append(out, [2]string{key, value})
		}
	}
	return out
}

// emitted tells the relays of this process that events have committed, so that the one holding the
// lease publishes them at once rather than at its next poll.
var emitted = newSignal()

// signal is a broadcast: every wait started before a notify ends with it.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newSignal() *signal { return &signal{ch: make(chan struct{})} }

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

func (s *signal) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.ch)
	s.ch = make(chan struct{})
}
