// Package tracingtest is an OTLP/HTTP endpoint for tests: an HTTP server that takes the spans a
// worker exports (protobuf, as OTEL_EXPORTER_OTLP_ENDPOINT makes it post them) and keeps them, in a
// form a test compares easily. It answers every well-formed export with success, and anything else
// with 400. It is for tests only; it is not a collector beyond that.
package tracingtest

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one span received.
type Span struct {
	// Service is the service.name of the span's resource.
	Service string
	// Scope is the name of its instrumentation scope.
	Scope string
	Name  string
	Kind  trace.SpanKind
	// TraceID, SpanID and ParentSpanID are hex, as a traceparent header writes them; ParentSpanID
	// is "" for a root span.
	TraceID, SpanID, ParentSpanID string
	// Attributes are its attributes' values as text (an int in decimal, a bool as true or false).
	Attributes map[string]string
	// Links are the spans it links to.
	Links []Link
	// Failed: its status is Error, with Description.
	Failed      bool
	Description string
}

// Link is a link of a span to another.
type Link struct{ TraceID, SpanID string }

// Traceparent is the traceparent header of a sampled span with these ids.
func Traceparent(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// Collector is an OTLP/HTTP endpoint. Use NewCollector.
type Collector struct {
	// URL is its base URL, for OTEL_EXPORTER_OTLP_ENDPOINT; spans are posted to URL + "/v1/traces".
	URL string

	mu    sync.Mutex
	paths []string
	spans []Span
}

// NewCollector starts a Collector on a local port. It stops when the test ends.
func NewCollector(tb testing.TB) *Collector {
	tb.Helper()
	c := &Collector{}
	srv := httptest.NewServer(http.HandlerFunc(c.serve))
	tb.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// Spans returns the spans received so far, in the order received.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

// Paths returns the path of each export received, in order.
func (c *Collector) Paths() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.paths)
}

func (c *Collector) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 16<<20))
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" ||
		proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	var spans []Span
	for _, rs := range req.ResourceSpans {
		service := attributes(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				spans = append(spans, span(service, ss.GetScope().GetName(), s))
			}
		}
	}
	c.mu.Lock()
	c.paths = append(c.paths, r.URL.Path)
	c.spans = append(c.spans, spans...)
	c.mu.Unlock()
	answer, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(answer)
}

func span(service, scope string, s *tracepb.Span) Span {
	out := Span{
		Service:      service,
		Scope:        scope,
		Name:         s.Name,
		Kind:         trace.SpanKind(s.Kind), // the same numbers
		TraceID:      hex.EncodeToString(s.TraceId),
		SpanID:       hex.EncodeToString(s.SpanId),
		ParentSpanID: hex.EncodeToString(s.ParentSpanId),
		Attributes:   attributes(s.Attributes),
		Failed:       s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
		Description:  s.GetStatus().GetMessage(),
	}
	for _, l := range s.Links {
		out.Links = append(out.Links, Link{TraceID: hex.EncodeToString(l.TraceId), SpanID: hex.EncodeToString(l.SpanId)})
	}
	return out
}

func attributes(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue(); v.GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = strconv.FormatInt(v.GetIntValue(), 10)
		case *commonpb.AnyValue_BoolValue:
			out[kv.Key] = strconv.FormatBool(v.GetBoolValue())
		case *commonpb.AnyValue_DoubleValue:
			out[kv.Key] = strconv.FormatFloat(v.GetDoubleValue(), 'g', -1, 64)
		default:
			out[kv.Key] = v.GetStringValue()
		}
	}
	return out
}
