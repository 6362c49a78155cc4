package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/tracing"
)

// The trace context of a producer's span, as its message's traceparent header carries it.
const (
	producerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan   = "00f067aa0ba902b7"
	producerParent = "00-" + producerTrace + "-" + producerSpan + "-01"
)

// setup returns a Tracer that records every span, and the exporter that holds them once ended.
func setup(t *testing.T) (*tracing.Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	return tracing.New(provider), exporter
}

// ended returns the one span ended so far named name.
func ended(t *testing.T, exporter *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q ended, want 1 (all: %v)", len(found), name, names(exporter.GetSpans()))
	}
	return found[0]
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// attrs returns a span's attributes by key, as their values' text.
func attrs(s tracetest.SpanStub) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

func checkAttrs(t *testing.T, s tracetest.SpanStub, want map[string]string) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name, k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("span %q: unexpected attribute %s = %q", s.Name, k, got[k])
		}
	}
}

func message(headers ...kafka.Header) tracing.Message {
	return tracing.Message{Group: "inboxworker", Topic: "payments.callbacks", Partition: 3, Offset: 42,
		Key: []byte("A-1001"), IdempotencyKey: "evt-1", Headers: headers}
}

func TestStartMessage(t *testing.T) {
	t.Parallel()
	tracer, exporter := setup(t)
	ctx, span := tracer.StartMessage(context.Background(), message(
		kafka.Header{Key: "Idempotency-Key", Value: []byte("evt-1")},
		kafka.Header{Key: "traceparent", Value: []byte(producerParent)},
		kafka.Header{Key: "tracestate", Value: []byte("vendor=1")},
	))
	if got := trace.SpanContextFromContext(ctx); !got.IsValid() || got.TraceID().String() != producerTrace {
		t.Errorf("the context holds span context %v, want one of trace %s", got, producerTrace)
	}
	span.SetOutcome("applied")
	span.End()

	s := ended(t, exporter, "process payments.callbacks")
	if s.SpanKind != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", s.SpanKind)
	}
	if s.Parent.TraceID().String() != producerTrace || s.Parent.SpanID().String() != producerSpan || !s.Parent.IsRemote() {
		t.Errorf("parent %v, want the remote span %s of trace %s", s.Parent, producerSpan, producerTrace)
	}
	if s.SpanContext.TraceID().String() != producerTrace {
		t.Errorf("trace %s, want the producer's %s", s.SpanContext.TraceID(), producerTrace)
	}
	if got := s.SpanContext.TraceState().String(); got != "vendor=1" {
		t.Errorf("tracestate %q, want the message's vendor=1", got)
	}
	checkAttrs(t, s, map[string]string{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.consumer.group.name":      "inboxworker",
		"messaging.destination.name":         "payments.callbacks",
		"messaging.destination.partition.id": "3",
		"messaging.kafka.offset":             "42",
		"messaging.kafka.message.key":        "A-1001",
		"inboxworker.idempotency_key":        "evt-1",
		"inboxworker.outcome":                "applied",
	})
}

func TestStartMessageParent(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		headers []kafka.Header
		want    string // the parent's span id; "" for a new trace
	}{
		{name: "NoHeaders"},
		{name: "Malformed", headers: []kafka.Header{{Key: "traceparent", Value: []byte("00-nonsense")}}},
		{name: "AnyCase", headers: []kafka.Header{{Key: "TraceParent", Value: []byte(producerParent)}}, want: producerSpan},
		{name: "LastOfTwo", headers: []kafka.Header{
			{Key: "traceparent", Value: []byte("00-" + producerTrace + "-1111111111111111-01")},
			{Key: "traceparent", Value: []byte(producerParent)},
		}, want: producerSpan},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tracer, exporter := setup(t)
			_, span := tracer.StartMessage(context.Background(), message(tt.headers...))
			span.End()
			s := ended(t, exporter, "process payments.callbacks")
			switch {
			case tt.want == "" && s.Parent.IsValid():
				t.Errorf("parent %v, want none (a new trace)", s.Parent)
			case tt.want != "" && s.Parent.SpanID().String() != tt.want:
				t.Errorf("parent %v, want span %s", s.Parent, tt.want)
			}
		})
	}
}

func TestStartMessageKey(t *testing.T) {
	t.Parallel()
	tracer, exporter := setup(t)
	for _, m := range []tracing.Message{
		{Topic: "masked", Key: []byte("+8613800138000"), MaskKey: func(k string) string { return k[:4] + "*****" + k[len(k)-4:] }},
		{Topic: "invalid-utf8", Key: []byte{'k', 0xff, '1'}},
		{Topic: "no-key"},
	} {
		_, span := tracer.StartMessage(context.Background(), m)
		span.End()
	}
	for topic, want := range map[string]string{"masked": "+861*****8000", "invalid-utf8": "k\uFFFD1", "no-key": ""} {
		got, has := attrs(ended(t, exporter, "process "+topic))["messaging.kafka.message.key"]
		if got != want || has != (want != "") {
			t.Errorf("%s: messaging.kafka.message.key %q (set: %v), want %q", topic, got, has, want)
		}
	}
	if _, has := attrs(ended(t, exporter, "process no-key"))["inboxworker.idempotency_key"]; has {
		t.Error("a message without an idempotency key has the attribute")
	}
}

func TestStartBatch(t *testing.T) {
	t.Parallel()
	tracer, exporter := setup(t)
	var messages []tracing.Span
	for _, offset := range []int64{7, 8} {
		m := message(kafka.Header{Key: "traceparent", Value: []byte(producerParent)})
		m.Offset = offset
		_, span := tracer.StartMessage(context.Background(), m)
		messages = append(messages, span)
	}
	ctx, batch := tracer.StartBatch(context.Background(),
		tracing.Batch{Group: "inboxworker", Topic: "payments.callbacks", Partition: 3, Messages: len(messages)})
	for _, m := range messages {
		batch.Link(m)
	}
	batch.Link(tracing.Span{}) // a message not traced: no link
	_, tx := tracer.StartTransaction(ctx, "payments")
	tx.End()
	batch.End()
	for _, m := range messages {
		m.End()
	}

	var messageSpans []trace.SpanContext
	var b tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		switch {
		case s.Name == "process payments.callbacks" && attrs(s)["messaging.batch.message_count"] == "":
			messageSpans = append(messageSpans, s.SpanContext)
		case s.Name == "process payments.callbacks":
			b = s
		}
	}
	if len(messageSpans) != 2 {
		t.Fatalf("%d message spans, want 2", len(messageSpans))
	}
	if b.SpanKind != trace.SpanKindConsumer || b.Parent.IsValid() {
		t.Errorf("batch span: kind %v, parent %v; want a consumer span without a parent", b.SpanKind, b.Parent)
	}
	var linked []trace.SpanContext
	for _, l := range b.Links {
		linked = append(linked, l.SpanContext)
	}
	if !slices.EqualFunc(linked, messageSpans, func(a, b trace.SpanContext) bool { return a.Equal(b) }) {
		t.Errorf("batch span links %v, want the message spans %v", linked, messageSpans)
	}
	checkAttrs(t, b, map[string]string{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.consumer.group.name":      "inboxworker",
		"messaging.destination.name":         "payments.callbacks",
		"messaging.destination.partition.id": "3",
		"messaging.batch.message_count":      "2",
	})
	if s := ended(t, exporter, "inbox transaction"); s.Parent.SpanID() != b.SpanContext.SpanID() {
		t.Errorf("the batch's inbox transaction has parent %v, want the batch span %v", s.Parent.SpanID(), b.SpanContext.SpanID())
	}
}

func TestStartTransaction(t *testing.T) {
	t.Parallel()
	tracer, exporter := setup(t)
	ctx, msg := tracer.StartMessage(context.Background(), message())
	txCtx, tx := tracer.StartTransaction(ctx, "payments")
	if trace.SpanContextFromContext(txCtx).SpanID() == trace.SpanContextFromContext(ctx).SpanID() {
		t.Error("the transaction's context holds the message's span, not its own")
	}
	tx.End()
	msg.End()

	s := ended(t, exporter, "inbox transaction")
	m := ended(t, exporter, "process payments.callbacks")
	if s.Parent.SpanID() != m.SpanContext.SpanID() || s.SpanKind != trace.SpanKindClient {
		t.Errorf("inbox transaction: parent %v, kind %v; want the message's span %v, client",
			s.Parent.SpanID(), s.SpanKind, m.SpanContext.SpanID())
	}
	checkAttrs(t, s, map[string]string{"db.system.name": "postgresql", "inboxworker.inbox": "payments"})
}

func TestStartRequest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		status     int
		wantStatus codes.Code
		wantType   string
	}{
		{name: "Accepted", status: 200, wantStatus: codes.Unset},
		{name: "Unavailable", status: 503, wantStatus: codes.Error, wantType: "503"},
		{name: "Rejected", status: 400, wantStatus: codes.Error, wantType: "400"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tracer, exporter := setup(t)
			traceparent := make(chan string, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				traceparent <- r.Header.Get("traceparent")
				w.WriteHeader(tt.status)
			}))
			t.Cleanup(srv.Close)

			ctx, msg := tracer.StartMessage(context.Background(), message())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/send?api_key=s3cr3t", nil)
			if err != nil {
				t.Fatal(err)
			}
			req, span := tracer.StartRequest(req)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			span.SetHTTPStatus(resp.StatusCode)
			span.End()
			msg.End()

			s := ended(t, exporter, "POST")
			m := ended(t, exporter, "process payments.callbacks")
			want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
			if got := <-traceparent; got != want {
				t.Errorf("the provider got traceparent %q, want the request span's %q", got, want)
			}
			if s.Parent.SpanID() != m.SpanContext.SpanID() || s.SpanKind != trace.SpanKindClient {
				t.Errorf("request span: parent %v, kind %v; want the message's span %v, client",
					s.Parent.SpanID(), s.SpanKind, m.SpanContext.SpanID())
			}
			host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
			wantAttrs := map[string]string{
				"http.request.method":       "POST",
				"server.address":            host,
				"server.port":               port,
				"url.full":                  srv.URL + "/send?api_key=xxxxx",
				"http.response.status_code": itoa(tt.status),
			}
			if tt.wantType != "" {
				wantAttrs["error.type"] = tt.wantType
			}
			checkAttrs(t, s, wantAttrs)
			if s.Status.Code != tt.wantStatus {
				t.Errorf("status %v, want %v", s.Status.Code, tt.wantStatus)
			}
		})
	}
}

func itoa(n int) string { return attribute.IntValue(n).String() }

func TestFail(t *testing.T) {
	t.Parallel()
	tracer, exporter := setup(t)
	long := strings.Repeat("é", 1000) // 2000 bytes
	for _, tt := range []struct {
		topic, reason string
		err           error
		want          string
	}{
		{topic: "with-error", reason: "unknown_order", err: errors.New("no order A-1"), want: "no order A-1"},
		{topic: "without-error", reason: "retries_exhausted", want: "retries_exhausted"},
		{topic: "invalid-utf8", reason: "invalid_payload", err: errors.New("bad \xff byte"), want: "bad \uFFFD byte"},
		{topic: "long", reason: "invalid_payload", err: errors.New(long), want: long[:1024] + "…"},
	} {
		_, span := tracer.StartMessage(context.Background(), tracing.Message{Topic: tt.topic})
		span.Fail(tt.reason, tt.err)
		span.SetOutcome("dead_lettered")
		span.End()
		s := ended(t, exporter, "process "+tt.topic)
		if s.Status.Code != codes.Error || s.Status.Description != tt.want {
			t.Errorf("%s: status %v %q, want Error %q", tt.topic, s.Status.Code, s.Status.Description, tt.want)
		}
		if a := attrs(s); a["error.type"] != tt.reason || a["inboxworker.outcome"] != "dead_lettered" {
			t.Errorf("%s: error.type %q, outcome %q; want %q, dead_lettered", tt.topic, a["error.type"], a["inboxworker.outcome"], tt.reason)
		}
	}
}

func TestInject(t *testing.T) {
	t.Parallel()
	tracer, _ := setup(t)
	original := []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("evt-1")},
		{Key: "traceparent", Value: []byte(producerParent)},
		{Key: "Baggage", Value: []byte("tenant=a")},
	}
	kept := slices.Clone(original)
	ctx, span := tracer.StartMessage(context.Background(), message(original...))
	defer span.End()

	got := tracer.Inject(ctx, original)
	if !slices.EqualFunc(original, kept, headerEqual) {
		t.Errorf("Inject changed the headers it was given: %v", original)
	}
	sc := trace.SpanContextFromContext(ctx)
	want := []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("evt-1")},
		{Key: "traceparent", Value: []byte("00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01")},
		{Key: "baggage", Value: []byte("tenant=a")},
	}
	if !slices.EqualFunc(got, want, headerEqual) {
		t.Errorf("Inject: %s, want %s", show(got), show(want))
	}

	// Without a span in the context there is nothing to propagate: the headers stay as they are.
	if got := tracer.Inject(context.Background(), original); &got[0] != &original[0] {
		t.Errorf("Inject without a span: %s, want the headers themselves", show(got))
	}
}

func headerEqual(a, b kafka.Header) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }

func show(headers []kafka.Header) string {
	var parts []string
	for _, h := range headers {
		parts = append(parts, h.Key+"="+string(h.Value))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	c := tracing.HeaderCarrier{{Key: "a", Value: []byte("1")}, {Key: "B", Value: []byte("2")}, {Key: "b", Value: []byte("3")}}
	if got := c.Get("b"); got != "3" {
		t.Errorf(`Get("b") = %q, want the last one, "3"`, got)
	}
	if got := c.Get("c"); got != "" {
		t.Errorf(`Get("c") = %q, want ""`, got)
	}
	c.Set("b", "4")
	if got := show(c); got != "[a=1 b=4]" {
		t.Errorf(`after Set("b", "4"): %s, want [a=1 b=4]`, got)
	}
	if got := c.Keys(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Keys() = %v, want [a b]", got)
	}
}
