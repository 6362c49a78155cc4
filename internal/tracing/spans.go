package tracing

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/redact"
)

// Attributes of the worker's own, beside the semantic conventions'.
const (
	// AttributeIdempotencyKey is a message's idempotency key, to find what happened to one.
	AttributeIdempotencyKey = attribute.Key("inboxworker.idempotency_key")
	// AttributeInbox is the inbox name (route) an inbox transaction claims keys in.
	AttributeInbox = attribute.Key("inboxworker.inbox")
)

// Message is what a consumer span records of the message it processes.
type Message struct {
	// Group is the consumer group (messaging.consumer.group.name).
	Group string
	// Topic, Partition and Offset say where the message was read (messaging.destination.name,
	// messaging.destination.partition.id, messaging.kafka.offset).
	Topic     string
	Partition int
	Offset    int64
	// Key is the Kafka message key (messaging.kafka.message.key); none is recorded when it is empty.
	Key []byte
	// MaskKey, when set, is how Key appears in the trace. Set it where the key is personal data: the
	// SMS events' key is the recipient's number, which leaves the process only masked.
	MaskKey func(string) string
	// IdempotencyKey is the message's idempotency key (inboxworker.idempotency_key), "" when it has
	// no valid one.
	IdempotencyKey string
	// Headers are the message's headers, whose traceparent (and tracestate, baggage) is the span's
	// parent.
	Headers []kafka.Header
}

// StartMessage starts the consumer span of one message, "process <topic>", child of the trace
// context in the message's headers (a new trace when they have none), and returns a context
// holding it. Its children are the message's inbox transactions and provider requests; the
// consumer ends it once the message is settled, with its outcome (Span.SetOutcome).
func (t *Tracer) StartMessage(ctx context.Context, m Message) (context.Context, Span) {
	if t.off() {
		return ctx, Span{}
	}
	carrier := HeaderCarrier(m.Headers)
	ctx = t.propagator.Extract(ctx, &carrier)
	attrs := append(destination(m.Group, m.Topic, m.Partition, 3), semconv.MessagingKafkaOffset(int(m.Offset)))
	if len(m.Key) > 0 {
		key := string(m.Key)
		if m.MaskKey != nil {
			key = m.MaskKey(key)
		}
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(valid(key)))
	}
	if m.IdempotencyKey != "" {
		attrs = append(attrs, AttributeIdempotencyKey.String(valid(m.IdempotencyKey)))
	}
	ctx, span := t.tracer.Start(ctx, "process "+m.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, Span{span}
}

// Batch is what a batch transaction's span records of the batch.
type Batch struct {
	// Group, Topic and Partition are the batch's messages', as in Message.
	Group     string
	Topic     string
	Partition int
	// Messages is how many messages the transaction applies (messaging.batch.message_count).
	Messages int
}

// StartBatch starts the consumer span of one batch transaction, "process <topic>", in a new trace
// unless ctx holds a span, and returns a context holding it. Link it to the span of each of its
// messages (Span.Link); its child is the batch's inbox transaction.
func (t *Tracer) StartBatch(ctx context.Context, b Batch) (context.Context, Span) {
	if t.off() {
		return ctx, Span{}
	}
	attrs := append(destination(b.Group, b.Topic, b.Partition, 1), semconv.MessagingBatchMessageCount(b.Messages))
	ctx, span := t.tracer.Start(ctx, "process "+b.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, Span{span}
}

// destination is the attributes that a message's and a batch's spans share, with room for
// more of their own.
func destination(group, topic string, partition, more int) []attribute.KeyValue {
	return append(make([]attribute.KeyValue, 0, 6+more),
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingConsumerGroupName(group),
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(partition)),
	)
}

// StartTransaction starts the client span of one inbox transaction in the inbox named inbox,
// "inbox transaction", child of ctx's span, and returns a context holding it.
func (t *Tracer) StartTransaction(ctx context.Context, inbox string) (context.Context, Span) {
	if t.off() {
		return ctx, Span{}
	}
	ctx, span := t.tracer.Start(ctx, "inbox transaction", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, AttributeInbox.String(inbox)))
	return ctx, Span{span}
}

// StartRequest starts the client span of a request to a provider, named for its method, child of
// the request's context's span, puts the span's trace context in the request's headers
// (traceparent), and returns the request with a context holding the span. The span records the
// method, the server and the URL (its password and query values masked); record the answer's
// status with Span.SetHTTPStatus, or a request that got none with Span.Fail.
func (t *Tracer) StartRequest(req *http.Request) (*http.Request, Span) {
	if t.off() {
		return req, Span{}
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[req.URL.Scheme]
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.ServerAddress(host),
		semconv.URLFull(redact.URL(req.URL.String())),
	}
	if n, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, semconv.ServerPort(n))
	}
	ctx, span := t.tracer.Start(req.Context(), req.Method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	req = req.WithContext(ctx)
	t.propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req, Span{span}
}

// valid makes s fit for a span's attribute: OTLP carries valid UTF-8 only, and refuses a whole
// export that holds any other string.
func valid(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// maxDescription bounds a failed span's status description, in bytes: an error may quote a payload.
const maxDescription = 1024

// description is an error's text fit for a span's status: valid UTF-8, at most maxDescription bytes.
func description(text string) string {
	text = valid(text)
	if len(text) <= maxDescription {
		return text
	}
	cut := maxDescription
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + "…"
}
