package notify_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// TestHTTPSenderTraces checks that each request is a client span, child of the span of Send's
// context, whose trace context the provider receives as traceparent, and that the span says how
// the request ended without carrying the token or the number.
func TestHTTPSenderTraces(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		status     int // 0: the connection is closed without an answer; -1: no answer in time
		wantStatus codes.Code
		wantType   string
	}{
		{name: "Accepted", status: 200, wantStatus: codes.Unset},
		{name: "Unavailable", status: 503, wantStatus: codes.Error, wantType: "503"},
		{name: "Rejected", status: 400, wantStatus: codes.Error, wantType: "400"},
		{name: "Redirect", status: 302, wantStatus: codes.Error, wantType: "302"},
		{name: "NoAnswer", wantStatus: codes.Error, wantType: "connection_error"},
		{name: "Timeout", status: -1, wantStatus: codes.Error, wantType: "timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			exporter := tracetest.NewInMemoryExporter()
			provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
			t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
			traceparent := make(chan string, 1)
			// The timeout is spent only where the provider never answers: elsewhere a busy machine's
			// slowness must not turn another ending into a timeout.
			timeout := time.Minute
			if tt.status == -1 {
				timeout = 100 * time.Millisecond
			}
			config := notify.HTTPConfig{Token: testToken, Tracer: tracing.New(provider), Timeout: timeout}
			sender := newProvider(t, config,
				func(w http.ResponseWriter, r *http.Request) {
					traceparent <- r.Header.Get("traceparent")
					switch tt.status {
					case -1: // the request's context ends when the client goes away, once its body is read
						_, _ = io.Copy(io.Discard, r.Body)
						<-r.Context().Done()
						return
					case 0:
						conn, _, _ := w.(http.Hijacker).Hijack()
						_ = conn.Close()
						return
					}
					w.Header().Set("Location", "/elsewhere")
					w.WriteHeader(tt.status)
					_, _ = w.Write([]byte(`{"id":"m-1","to":"` + testPhone + `"}`))
				})

			ctx, parent := provider.Tracer("test").Start(context.Background(), "process notifications.sms")
			_, _ = sender.Send(ctx, testSMS)
			parent.End()

			var span tracetest.SpanStub
			for _, s := range exporter.GetSpans() {
				if s.Name == "POST" {
					span = s
				}
			}
			if span.Name == "" {
				t.Fatalf("no POST span among %d", len(exporter.GetSpans()))
			}
			if span.SpanKind != trace.SpanKindClient || span.Parent.SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("span: kind %v, parent %v; want client, child of %v", span.SpanKind, span.Parent.SpanID(), parent.SpanContext().SpanID())
			}
			want := "00-" + span.SpanContext.TraceID().String() + "-" + span.SpanContext.SpanID().String() + "-01"
			if got := <-traceparent; got != want {
				t.Errorf("the provider got traceparent %q, want the span's %q", got, want)
			}
			attrs := map[string]string{}
			for _, kv := range span.Attributes {
				attrs[string(kv.Key)] = kv.Value.String()
			}
			if attrs["error.type"] != tt.wantType || span.Status.Code != tt.wantStatus {
				t.Errorf("span: error.type %q, status %v; want %q, %v", attrs["error.type"], span.Status.Code, tt.wantType, tt.wantStatus)
			}
			host, _, _ := net.SplitHostPort(strings.TrimPrefix(attrs["url.full"], "http://"))
			if attrs["http.request.method"] != "POST" || attrs["server.address"] != host || host == "" {
				t.Errorf("span attributes %v, want the method and the server of url.full", attrs)
			}
			checkNoSecrets(t, "the span", span.Status.Description+" "+strings.Join(mapValues(attrs), " "))
		})
	}

	t.Run("WithoutTracer", func(t *testing.T) {
		t.Parallel()
		headers := make(chan http.Header, 1)
		sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
			headers <- r.Header
			_, _ = w.Write([]byte(`{"id":"m-1"}`))
		})
		exporter := tracetest.NewInMemoryExporter()
		provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
		t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
		ctx, parent := provider.Tracer("test").Start(context.Background(), "outer")
		defer parent.End()
		if _, err := sender.Send(ctx, testSMS); err != nil {
			t.Fatal(err)
		}
		if h := <-headers; h.Get("traceparent") != "" {
			t.Errorf("traceparent %q sent without a tracer", h.Get("traceparent"))
		}
	})
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
