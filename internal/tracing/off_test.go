package tracing_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/segmentio/kafka-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/tracing"
)

// onePass runs what the consumer does for one message of a batch, and for one SMS: its span, the
// batch's span linked to it, the inbox transaction, a provider request (req, whose context is the
// caller's), the outcome, a dead letter's headers.
func onePass(tracer *tracing.Tracer, ctx context.Context, m tracing.Message, req *http.Request) []kafka.Header {
	msgCtx, msg := tracer.StartMessage(ctx, m)
	batchCtx, batch := tracer.StartBatch(ctx, tracing.Batch{Group: m.Group, Topic: m.Topic, Partition: m.Partition, Messages: 1})
	batch.Link(msg)
	_, tx := tracer.StartTransaction(batchCtx, "payments")
	tx.End()
	batch.End()
	_, call := tracer.StartRequest(req)
	call.SetHTTPStatus(503)
	call.End()
	msg.Fail("retries_exhausted", nil)
	msg.SetOutcome("dead_lettered")
	headers := tracer.Inject(msgCtx, m.Headers)
	msg.End()
	return headers
}

// TestOff checks that a Tracer that is off — nil, New(nil), or Setup's with nothing configured —
// records nothing, propagates nothing and allocates nothing, however traced the message is. It does
// not run in parallel: AllocsPerRun counts the allocations of the whole process.
func TestOff(t *testing.T) {
	setupOff, err := tracing.Setup(context.Background(), tracing.Config{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	// A span in the context, as a caller traced by other means may have: still nothing.
	exporter := tracetest.NewInMemoryExporter()
	other := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = other.Shutdown(context.Background()) })
	ctx, outer := other.Tracer("other").Start(context.Background(), "outer")
	defer outer.End()

	headers := []kafka.Header{{Key: "traceparent", Value: []byte(producerParent)}}
	m := message(headers...)
	m.MaskKey = func(k string) string { return "masked" }
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/send", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tracer := range map[string]*tracing.Tracer{"Nil": nil, "NewNil": tracing.New(nil), "Setup": setupOff} {
		t.Run(name, func(t *testing.T) {
			if got := onePass(tracer, ctx, m, req); &got[0] != &headers[0] {
				t.Error("Inject changed the headers")
			}
			if got := req.Header.Get("traceparent"); got != "" {
				t.Errorf("StartRequest put traceparent %q in the request", got)
			}
			if allocs := testing.AllocsPerRun(100, func() { onePass(tracer, ctx, m, req) }); allocs != 0 {
				t.Errorf("%v allocations per message, want 0", allocs)
			}
			if err := tracer.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		})
	}
	if spans := exporter.GetSpans(); len(spans) != 0 {
		t.Errorf("%d spans recorded, want none: %v", len(spans), names(spans))
	}
	if sc := trace.SpanContextFromContext(ctx); !sc.IsValid() {
		t.Fatal("the test's own span is not valid")
	}
}

// BenchmarkMessage is the cost of the spans of one message (onePass) with tracing off, and on with
// every span sampled and exported to memory.
func BenchmarkMessage(b *testing.B) {
	headers := []kafka.Header{{Key: "Idempotency-Key", Value: []byte("evt-1")}, {Key: "traceparent", Value: []byte(producerParent)}}
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/send", nil)
	if err != nil {
		b.Fatal(err)
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m := message(headers...)
	for name, tracer := range map[string]*tracing.Tracer{"Off": tracing.New(nil), "On": tracing.New(provider)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				onePass(tracer, context.Background(), m, req)
			}
		})
	}
}
