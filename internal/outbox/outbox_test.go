package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/poll"
)

func TestEventID(t *testing.T) {
	t.Parallel()
	a := outbox.EventID("order.paid", "alipay\x00T-1")
	if a != outbox.EventID("order.paid", "alipay\x00T-1") {
		t.Error("one type and cause gave two ids")
	}
	for _, other := range []string{
		outbox.EventID("payment.failed", "alipay\x00T-1"),
		outbox.EventID("order.paid", "alipay\x00T-2"),
		outbox.EventID("order.paid", "alipa\x00yT-1"),
	} {
		if other == a {
			t.Errorf("two causes gave one id %s", a)
		}
	}
	// A UUIDv5 (RFC 9562): version 5, variant 10.
	if len(a) != 36 || a[14] != '5' || !strings.ContainsAny(a[19:20], "89ab") {
		t.Errorf("id %s is not a UUIDv5", a)
	}
}

func TestEmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Schema(t)

	e := orderEvent("A-1", 1)
	e.Payload = json.RawMessage(`{"order_no":"A-1", "n":1}`)
	// Emitted, then emitted again (the same cause) with other events around it in a later
	// transaction: written again, with its id. The inbox, not the outbox, keeps an effect that
	// emits from committing twice; the id lets a consumer recognise the resend.
	if err := inbox.WithTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Emit(ctx, tx, e)
	}); err != nil {
		t.Fatal(err)
	}
	if err := inbox.WithTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.EmitBatch(ctx, tx, []outbox.Event{orderEvent("A-1", 2), e, orderEvent("B-1", 1), orderEvent("A-1", 3)})
	}); err != nil {
		t.Fatal(err)
	}
	// Rolled back: nothing.
	errRollback := errors.New("rolled back")
	if err := inbox.WithTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.Emit(ctx, tx, orderEvent("A-1", 4)); err != nil {
			return err
		}
		return errRollback
	}); !errors.Is(err, errRollback) {
		t.Fatal(err)
	}

	rows, _ := db.Pool.Query(ctx, `
		SELECT o.id::text, o.aggregatetype, o.aggregateid, o.type, o.payload::text, o.topic, o.tracingspancontext,
			w.id IS NOT NULL
		FROM outbox_events o LEFT JOIN outbox_waiting w USING (position, ordinal) ORDER BY o.position, o.ordinal`)
	type stored struct {
		id, aggregateType, aggregateID, typ, payload, topic string
		trace                                               *string
		waiting                                             bool
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		err := r.Scan(&s.id, &s.aggregateType, &s.aggregateID, &s.typ, &s.payload, &s.topic, &s.trace, &s.waiting)
		return s, err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []stored{
		{id: eventID(e), aggregateType: "order", aggregateID: "A-1", typ: "order.test", payload: `{"order_no":"A-1", "n":1}`, topic: topic, waiting: true},
		{id: eventID(orderEvent("A-1", 2)), aggregateType: "order", aggregateID: "A-1", typ: "order.test", payload: `{"n":2,"order_no":"A-1"}`, topic: topic, waiting: true},
		{id: eventID(e), aggregateType: "order", aggregateID: "A-1", typ: "order.test", payload: `{"order_no":"A-1", "n":1}`, topic: topic, waiting: true},
		{id: eventID(orderEvent("B-1", 1)), aggregateType: "order", aggregateID: "B-1", typ: "order.test", payload: `{"n":1,"order_no":"B-1"}`, topic: topic, waiting: true},
		{id: eventID(orderEvent("A-1", 3)), aggregateType: "order", aggregateID: "A-1", typ: "order.test", payload: `{"n":3,"order_no":"A-1"}`, topic: topic, waiting: true},
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].trace != nil {
			t.Errorf("row %d: tracingspancontext %q without a trace context, want NULL", i, *got[i].trace)
		}
		got[i].trace = nil
		if got[i] != want[i] {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

func TestEmitInvalid(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	valid := orderEvent("A-1", 1)
	for _, tc := range []struct {
		name   string
		change func(e *outbox.Event)
		want   string
	}{
		{"NoTopic", func(e *outbox.Event) { e.Topic = "" }, "Topic is required"},
		{"NoAggregateType", func(e *outbox.Event) { e.AggregateType = "" }, "AggregateType is required"},
		{"NoAggregateID", func(e *outbox.Event) { e.AggregateID = "" }, "AggregateID is required"},
		{"NoType", func(e *outbox.Event) { e.Type = "" }, "Type is required"},
		{"NoCause", func(e *outbox.Event) { e.Cause = "" }, "Cause is required"},
		{"NoPayload", func(e *outbox.Event) { e.Payload = nil }, "Payload: required"},
		{"InvalidJSON", func(e *outbox.Event) { e.Payload = []byte(`{"a":`) }, "Payload: not valid JSON"},
		{"Unencodable", func(e *outbox.Event) { e.Payload = func() {} }, "Payload: json: unsupported type"},
		{"LongID", func(e *outbox.Event) { e.AggregateID = strings.Repeat("x", 256) }, "AggregateID is longer than 255"},
		{"NUL", func(e *outbox.Event) { e.AggregateID = "a\x00b" }, "AggregateID contains a NUL"},
		{"BadUTF8", func(e *outbox.Event) { e.Type = "\xff" }, "Type is not valid UTF-8"},
		{"Large", func(e *outbox.Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("x", outbox.MaxPayloadBytes) + `"`)
		}, "more than 524288"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := valid
			tc.change(&e)
			err := outbox.EmitBatch(context.Background(), tx, []outbox.Event{valid, e})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "event 2 of 2") {
				t.Errorf("error %v, want one about event 2 of 2 saying %q", err, tc.want)
			}
		})
	}
	var n int
	if err := tx.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written by invalid batches (%v), want none", n, err)
	}
}

// TestEmitTraceContext: the W3C trace context of the emitter's context is stored as Debezium reads
// it, and the relay sends it as headers.
func TestEmitTraceContext(t *testing.T) {
	// Not parallel: it sets the global propagator, as the process's tracing set-up does.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	e := setup(t)
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, _ := trace.ParseTraceState("vendor=value")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true}))
	if err := inbox.WithTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Emit(ctx, tx, orderEvent("A-1", 1))
	}); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := e.db.Pool.QueryRow(ctx, `SELECT tracingspancontext FROM outbox_events`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if want := "traceparent=" + parent + "\ntracestate=vendor=value\n"; stored != want {
		t.Errorf("tracingspancontext %q, want %q", stored, want)
	}

	e.startRelay(e.relayConfig(e.db.Pool))
	e.waitPublished(1)
	got := e.readTopic()
	if len(got) != 1 || got[0].headers["traceparent"] != parent || got[0].headers["tracestate"] != "vendor=value" {
		t.Errorf("published %+v, want one event with headers traceparent %s and tracestate vendor=value", got, parent)
	}
}

// TestEmitSameIDMeanwhile: an event emitted twice in one batch is written once, as it was first, in
// either layout; in the layout of a row per event (WithEventRows, for Debezium), whose primary key
// is the event's id, an event that another transaction writes while an emitter of the same id for
// another aggregate (whose locks do not hold the emitter back) inserts it is written once, by the
// transaction that commits it first.
func TestEmitSameIDMeanwhile(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name string
		ctx  context.Context
	}{{"Batches", context.Background()}, {"EventRows", outbox.WithEventRows(context.Background())}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Schema(t)
			emitTwiceInOneBatch(t, layout.ctx, db.Pool)
		})
	}
	ctx := outbox.WithEventRows(context.Background())
	db := pgtest.Schema(t)

	first := orderEvent("A-1", 1)
	second := first
	second.AggregateID, second.Payload = "B-1", json.RawMessage(`{"second":true}`)
	tx1, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if err := outbox.Emit(ctx, tx1, first); err != nil {
		t.Fatal(err)
	}
	pids, emitted := make(chan int, 1), make(chan error, 1)
	go func() {
		emitted <- inbox.WithTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			return outbox.Emit(ctx, tx, second)
		})
	}()
	var pid int
	select {
	case pid = <-pids:
	case err := <-emitted:
		t.Fatalf("the second emitter: %v", err)
	}
	poll.For(t, "the second emitter's insert to wait for the first's transaction", func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype = 'transactionid')`,
			pid).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-emitted; err != nil {
		t.Fatalf("the second emitter: %v", err)
	}
	if got, want := payloads(t, db.Pool, `id = '`+eventID(first)+`'`), `{"n":1,"order_no":"A-1"}`; got != want {
		t.Errorf("payloads of the event %s, want the first emitter's alone, %s", got, want)
	}
}

// emitTwiceInOneBatch emits, in one batch under ctx, an event, another, then the first again with
// another payload, and checks that the first was written once, as it was first.
func emitTwiceInOneBatch(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	twice := orderEvent("T-1", 1)
	again := twice
	again.Payload = json.RawMessage(`{"again":true}`)
	if err := inbox.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.EmitBatch(ctx, tx, []outbox.Event{twice, orderEvent("T-1", 2), again})
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := payloads(t, pool, `aggregateid = 'T-1'`), `{"n":1,"order_no":"T-1"} {"n":2,"order_no":"T-1"}`; got != want {
		t.Errorf("payloads %s, want %s", got, want)
	}
}

// payloads are the payloads of the outbox's rows where condition holds, in position order, joined
// by spaces.
func payloads(t *testing.T, q *pgxpool.Pool, condition string) string {
	t.Helper()
	rows, _ := q.Query(context.Background(), `SELECT payload::text FROM outbox_events WHERE `+condition+` ORDER BY position, ordinal`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, " ")
}
