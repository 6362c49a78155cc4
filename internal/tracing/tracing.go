// Package tracing is the worker's OpenTelemetry tracing: set up from the standard OTEL_*
// variables (Setup), off unless an OTLP endpoint or exporter is configured, and the few spans the
// worker records, with the messaging semantic conventions of semconv v1.43.0:
//
//   - a consumer span per message (StartMessage), child of the W3C traceparent in its headers;
//   - a consumer span per batch transaction (StartBatch), linked to its messages' spans (Span.Link);
//   - a client span per inbox transaction (StartTransaction) and per provider request
//     (StartRequest, which also puts the traceparent in the request's headers);
//   - the outcome of a message (Span.SetOutcome: applied, duplicate, dead_lettered, …) and the
//     reason of a failure (Span.Fail);
//   - the span's context in the headers of a message the worker writes (Inject: a dead letter, an
//     outbox event), through a carrier over kafka-go headers (HeaderCarrier).
//
// Tracing off costs a few nil checks: Setup's Tracer then has no provider, no exporter and no
// goroutine, and every method of it, as of a nil *Tracer, returns its context unchanged and a Span
// that does nothing, without reading the headers or allocating (TestOff, BenchmarkMessage).
//
// tracing decides nothing about messages: the consumer says when a message starts and how it
// ended, and masks what must not leave the process (Message.MaskKey). It records no metrics and
// logs nothing but whether tracing is on and the SDK's own errors (a failed export).
package tracing

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the worker's spans.
const ScopeName = "github.com/inboxworker/inboxworker"

// AttributeOutcome is the attribute that Span.SetOutcome records: what came of a message.
const AttributeOutcome = attribute.Key("inboxworker.outcome")

// Tracer starts the worker's spans. Use Setup, or New with a provider of your own (a test's, with
// an in-memory exporter). A nil *Tracer, like Setup's when tracing is off, starts none.
type Tracer struct {
	tracer     trace.Tracer // nil: tracing is off
	propagator propagation.TextMapPropagator
	provider   *sdktrace.TracerProvider // Setup's, which Shutdown shuts down; nil otherwise
}

// New returns a Tracer that starts its spans with provider and propagates their context with the
// W3C Trace Context and Baggage formats. A nil provider is tracing off.
func New(provider trace.TracerProvider) *Tracer {
	if provider == nil {
		return &Tracer{}
	}
	return &Tracer{
		tracer:     provider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

func (t *Tracer) off() bool { return t == nil || t.tracer == nil }

// Provider returns the provider Setup made, to hand to package inboxworker's Config; nil when
// tracing is off or the Tracer was made by New.
func (t *Tracer) Provider() trace.TracerProvider {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider
}

// Shutdown exports the spans not exported yet and stops the exporter, within ctx. It does nothing
// for a Tracer that Setup did not make with tracing on.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Span is a span a Tracer started. The zero Span, which a Tracer that is off returns, does nothing.
// Its methods are not safe for concurrent use with End.
type Span struct {
	span trace.Span
}

// End ends the span. Nothing recorded on it after End is kept.
func (s Span) End() {
	if s.span != nil {
		s.span.End()
	}
}

// SetOutcome records what came of the message or messages of the span, as inboxworker.outcome: the
// consumer's outcome names (applied, duplicate, dead_lettered, expired, suppressed), or parked.
func (s Span) SetOutcome(outcome string) {
	if s.span != nil {
		s.span.SetAttributes(AttributeOutcome.String(valid(outcome)))
	}
}

// Fail marks the span as failed: error.type is reason (a dead-letter reason, say, or the error's
// class) and the span's status is Error, with err's text as its description (reason when err is nil).
func (s Span) Fail(reason string, err error) {
	if s.span == nil {
		return
	}
	text := reason
	if err != nil {
		text = err.Error()
	}
	s.span.SetAttributes(semconv.ErrorTypeKey.String(valid(reason)))
	s.span.SetStatus(codes.Error, description(text))
}

// Link links the span to other (a batch transaction's span to the span of each of its messages).
// It does nothing if either span is not recorded.
func (s Span) Link(other Span) {
	if s.span == nil || other.span == nil || !other.span.SpanContext().IsValid() {
		return
	}
	s.span.AddLink(trace.Link{SpanContext: other.span.SpanContext()})
}

// SetHTTPStatus records the status code of a provider's answer (http.response.status_code). 4xx
// and 5xx mark the span as failed, error.type being the code, as the HTTP conventions say of a
// client span.
func (s Span) SetHTTPStatus(code int) {
	if s.span == nil {
		return
	}
	s.span.SetAttributes(semconv.HTTPResponseStatusCode(code))
	if code >= 400 {
		text := strconv.Itoa(code)
		s.span.SetAttributes(semconv.ErrorTypeKey.String(text))
		s.span.SetStatus(codes.Error, text)
	}
}
