package tracing

import (
	"context"
	"strings"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"
)

// HeaderCarrier is a Kafka message's headers as OpenTelemetry's propagation.TextMapCarrier. Header
// names are matched in any case: Get reads the last header of a name, Set replaces every header of
// that name with one.
type HeaderCarrier []kafka.Header

// Get returns the value of the last header named key, "" if there is none.
func (c *HeaderCarrier) Get(key string) string {
	for i := len(*c) - 1; i >= 0; i-- {
		if strings.EqualFold((*c)[i].Key, key) {
			return string((*c)[i].Value)
		}
	}
	return ""
}

// Set replaces the headers named key with one of value. It changes the slice's backing array in
// place: copy headers that are shared before.
func (c *HeaderCarrier) Set(key, value string) {
	*c = c.without(key)
	*c = append(*c, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the names of the headers, in order.
func (c *HeaderCarrier) Keys() []string {
	keys := make([]string, len(*c))
	for i, h := range *c {
		keys[i] = h.Key
	}
	return keys
}

// without returns the headers but those named key, in the same backing array.
func (c *HeaderCarrier) without(key string) HeaderCarrier {
	kept := (*c)[:0]
	for _, h := range *c {
		if !strings.EqualFold(h.Key, key) {
			kept = append(kept, h)
		}
	}
	return kept
}

// Inject returns headers with the trace context of ctx's span (traceparent, tracestate) and ctx's
// baggage in place of any they had: the headers of a message the worker writes on behalf of the
// span, such as a dead letter, which keeps the original message's other headers. headers itself is
// not changed. When tracing is off, or ctx has no span, it returns headers as they are: a dead
// letter then keeps the original message's traceparent.
func (t *Tracer) Inject(ctx context.Context, headers []kafka.Header) []kafka.Header {
	if t.off() || !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	carrier := make(HeaderCarrier, 0, len(headers)+3)
	carrier = append(carrier, headers...)
	for _, field := range t.propagator.Fields() {
		carrier = carrier.without(field)
	}
	t.propagator.Inject(ctx, &carrier)
	return carrier
}
