package tracing_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxworker/inboxworker/internal/tracing"
)

// The spans of a consumer: one per message, child of the traceparent its producer sent; a batch
// transaction's span linked to its messages' spans, with the inbox transaction under it; and a dead
// letter's headers carrying the failed message's span.
func Example() {
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	tracer := tracing.New(provider) // in the worker: tracing.Setup(ctx, tracing.Config{Logger: logger})

	ctx := context.Background()
	fetched := []kafka.Message{
		{Topic: "payments.callbacks", Offset: 7, Key: []byte("A-1"), Headers: []kafka.Header{
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}},
		{Topic: "payments.callbacks", Offset: 8, Key: []byte("A-2")},
	}
	msgCtx := make([]context.Context, len(fetched))
	spans := make([]tracing.Span, len(fetched))
	for i, m := range fetched {
		msgCtx[i], spans[i] = tracer.StartMessage(ctx, tracing.Message{Group: "inboxworker", Topic: m.Topic,
			Partition: m.Partition, Offset: m.Offset, Key: m.Key, IdempotencyKey: fmt.Sprint("evt-", m.Offset), Headers: m.Headers})
	}

	batchCtx, batch := tracer.StartBatch(ctx, tracing.Batch{Group: "inboxworker", Topic: "payments.callbacks", Messages: 2})
	for _, s := range spans {
		batch.Link(s)
	}
	_, tx := tracer.StartTransaction(batchCtx, "payments") // around Store.ProcessBatch
	tx.End()
	batch.End()

	spans[0].SetOutcome("applied")
	spans[0].End()
	dlq := tracer.Inject(msgCtx[1], fetched[1].Headers) // the dead letter's headers
	spans[1].Fail("invalid_payload", errors.New("amount: not a decimal"))
	spans[1].SetOutcome("dead_lettered")
	spans[1].End()

	for _, s := range exporter.GetSpans() {
		fmt.Printf("%s (%s), links %d, parent from a producer: %v\n", s.Name, s.SpanKind, len(s.Links), s.Parent.IsRemote())
	}
	fmt.Println("the dead letter carries", dlq[0].Key)
	// Output:
	// inbox transaction (client), links 0, parent from a producer: false
	// process payments.callbacks (consumer), links 2, parent from a producer: false
	// process payments.callbacks (consumer), links 0, parent from a producer: true
	// process payments.callbacks (consumer), links 0, parent from a producer: false
	// the dead letter carries traceparent
}
