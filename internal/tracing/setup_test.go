package tracing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/internal/tracing/tracingtest"
)

// lockedBuffer is a log's output that the SDK's error handler, which is the process's, may write
// to from any test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

// TestSetupExports sets tracing up from the variables as an operator would and checks that the
// spans reach the endpoint, at the path the variables say, by Shutdown at the latest.
func TestSetupExports(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		vars    func(url string) map[string]string
		path    string
		service string
	}{
		{name: "Endpoint", path: "/v1/traces", service: "inboxworker", vars: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url}
		}},
		{name: "EndpointWithPath", path: "/otlp/v1/traces", service: "billing", vars: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url + "/otlp/", "OTEL_SERVICE_NAME": "billing",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
		}},
		{name: "TracesEndpoint", path: "/collect", service: "inboxworker", vars: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/collect",
				"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := tracingtest.NewCollector(t)
			logs := &lockedBuffer{}
			tracer, err := tracing.Setup(context.Background(), tracing.Config{Getenv: env(tt.vars(c.URL)),
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			_, span := tracer.StartMessage(context.Background(), message())
			span.End()
			if err := tracer.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if paths := c.Paths(); len(paths) == 0 || paths[0] != tt.path {
				t.Errorf("exports posted to %v, want %s", paths, tt.path)
			}
			spans := c.Spans()
			if len(spans) != 1 || spans[0].Name != "process payments.callbacks" || spans[0].Service != tt.service ||
				spans[0].Scope != tracing.ScopeName {
				t.Errorf("received %+v, want the message's span, of service %q and scope %s", spans, tt.service, tracing.ScopeName)
			}
			if !strings.Contains(logs.String(), "tracing is on") {
				t.Errorf("no line says that tracing is on: %s", logs.String())
			}
		})
	}
}

// TestSetupOff checks the settings that leave tracing off.
func TestSetupOff(t *testing.T) {
	t.Parallel()
	for name, vars := range map[string]map[string]string{
		"Nothing":          {},
		"OnlyServiceName":  {"OTEL_SERVICE_NAME": "billing", "OTEL_TRACES_SAMPLER": "always_on"},
		"Disabled":         {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
		"ExporterNone":     {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
		"DisabledIsFalse":  {"OTEL_SDK_DISABLED": "false"},
		"BlankEndpoint":    {"OTEL_EXPORTER_OTLP_ENDPOINT": " "},
		"NoneWithBadOther": {"OTEL_TRACES_EXPORTER": "none", "OTEL_TRACES_SAMPLER": "nonsense"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tracer, err := tracing.Setup(context.Background(), tracing.Config{Getenv: env(vars),
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, span := tracer.StartMessage(context.Background(), message())
			span.End()
			if ctx != context.Background() {
				t.Error("tracing is on, want off")
			}
			if err := tracing.Check(env(vars)); err != nil {
				t.Errorf("Check: %v, want nil", err)
			}
		})
	}
}

// TestSetupErrors checks that a value the worker cannot honour is refused with the variable's name.
func TestSetupErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		vars map[string]string
		want string // the error's text
	}{
		{name: "Disabled", vars: map[string]string{"OTEL_SDK_DISABLED": "yes"},
			want: `OTEL_SDK_DISABLED: invalid value "yes" (use true or false)`},
		{name: "Exporter", vars: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"},
			want: `OTEL_TRACES_EXPORTER: unsupported exporter "zipkin" (use otlp or none)`},
		{name: "EndpointWithoutScheme", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			want: `OTEL_EXPORTER_OTLP_ENDPOINT: invalid URL "collector:4318" (want http:// or https://, e.g. http://localhost:4318)`},
		{name: "TracesEndpointPassword", vars: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:hunter2@collector"},
			want: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: invalid URL "ftp://u:xxxxx@collector" (want http:// or https://, e.g. http://localhost:4318)`},
		{name: "GRPC", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: `OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol "grpc": the worker exports over OTLP/HTTP with protobuf (http/protobuf, port 4318)`},
		{name: "TracesProtocol", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			want: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: unsupported protocol "http/json": the worker exports over OTLP/HTTP with protobuf (http/protobuf, port 4318)`},
		{name: "Sampler", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
			want: `OTEL_TRACES_SAMPLER: unsupported sampler "jaeger_remote" (use parentbased_always_on, parentbased_always_off, parentbased_traceidratio, always_on, always_off or traceidratio)`},
		{name: "RatioAboveOne", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10"},
			want: `OTEL_TRACES_SAMPLER_ARG: invalid ratio "10" for parentbased_traceidratio (want a number from 0 to 1)`},
		{name: "HeadersGarbage", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,garbage"},
			want: `OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not KEY=VALUE (want key1=value1,key2=value2)`},
		{name: "ResourceAttributes", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment"},
			want: `OTEL_RESOURCE_ATTRIBUTES: entry 1, "deployment.environment", is not KEY=VALUE (want key1=value1,key2=value2)`},
		{name: "Brotli", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"},
			want: `OTEL_EXPORTER_OTLP_COMPRESSION: unsupported compression "brotli" (use gzip or none)`},
		{name: "NegativeScheduleDelay", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "-5"},
			want: `OTEL_BSP_SCHEDULE_DELAY: invalid value "-5" (want a whole number, 0 or more; times in milliseconds)`},
		{name: "NegativeTimeout", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "-1"},
			want: `OTEL_EXPORTER_OTLP_TIMEOUT: invalid value "-1" (want a whole number, 1 or more; times in milliseconds)`},
		{name: "RatioNotANumber", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "NaN"},
			want: `OTEL_TRACES_SAMPLER_ARG: invalid ratio "NaN" for traceidratio (want a number from 0 to 1)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tracer, err := tracing.Setup(context.Background(), tracing.Config{Getenv: env(tt.vars)})
			var named *envflag.Error
			if err == nil || err.Error() != tt.want || !errors.As(err, &named) {
				t.Errorf("Setup: %v, want the *envflag.Error %q", err, tt.want)
			}
			if tracer != nil {
				t.Errorf("Setup returned a Tracer with its error")
			}
			if err := tracing.Check(env(tt.vars)); err == nil || err.Error() != tt.want {
				t.Errorf("Check: %v, want %q", err, tt.want)
			}
		})
	}
}

// TestSetupSampler checks that OTEL_TRACES_SAMPLER is honoured: a parent-based sampler follows the
// message's traceparent, sampled or not.
func TestSetupSampler(t *testing.T) {
	t.Parallel()
	notSampled := "00-" + producerTrace + "-" + producerSpan + "-00"
	for _, tt := range []struct {
		sampler, arg, traceparent string
		want                      bool // the message's span is recorded
	}{
		{sampler: "", traceparent: producerParent, want: true},
		{sampler: "", traceparent: notSampled, want: false},
		{sampler: "parentbased_traceidratio", arg: "0", traceparent: producerParent, want: true},
		{sampler: "parentbased_traceidratio", arg: "0", want: false},
		{sampler: "always_off", traceparent: producerParent, want: false},
		{sampler: "always_on", traceparent: notSampled, want: true},
	} {
		t.Run(tt.sampler+"/"+tt.arg+"/"+tt.traceparent, func(t *testing.T) {
			t.Parallel()
			tracer, err := tracing.Setup(context.Background(), tracing.Config{Getenv: env(map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": tracingtest.NewCollector(t).URL, "OTEL_TRACES_SAMPLER": tt.sampler,
				"OTEL_TRACES_SAMPLER_ARG": tt.arg}), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tracer.Shutdown(context.Background()) }()
			m := message()
			if tt.traceparent != "" {
				m = message(kafka.Header{Key: "traceparent", Value: []byte(tt.traceparent)})
			}
			ctx, span := tracer.StartMessage(context.Background(), m)
			if got := trace.SpanContextFromContext(ctx).IsSampled(); got != tt.want {
				t.Errorf("the message's span recorded: %v, want %v", got, tt.want)
			}
			span.End()
		})
	}
}
