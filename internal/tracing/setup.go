package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/redact"
)

// Config configures Setup.
type Config struct {
	// Getenv reads the variables that turn tracing on and that Setup checks: OTEL_SDK_DISABLED,
	// OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, their
	// _PROTOCOL, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG. The SDK and
	// the exporter read the others themselves from the process's environment (headers, timeout,
	// compression, certificates, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*). Defaults to os.Getenv.
	Getenv func(string) string
	// ServiceName is the service.name of the spans unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES names one. Defaults to "inboxworker".
	ServiceName string
	// Logger gets a line saying whether tracing is on, and the SDK's errors (a failed export) as
	// warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultEndpoint is where spans go with OTEL_TRACES_EXPORTER=otlp and no endpoint set.
const DefaultEndpoint = "http://localhost:4318/v1/traces"

// Setup returns the Tracer the OTEL_* variables configure. Tracing is on when an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp
// is set, and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none: spans are then
// exported in batches over OTLP/HTTP with protobuf, sampled by OTEL_TRACES_SAMPLER (default
// parentbased_always_on), and Shutdown exports the last ones. Otherwise the Tracer is off: no
// provider, no exporter, no goroutine.
//
// A variable whose value the worker cannot honour (an unknown sampler, a ratio out of [0, 1], a
// gRPC protocol, an endpoint that is not an http or https URL) is an error naming it, as an
// *envflag.Error. Setup connects to nothing: an unreachable collector shows as export errors in
// the log, and the spans it could not take are dropped.
func Setup(ctx context.Context, config Config) (*Tracer, error) {
	getenv := config.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	logger := cmp.Or(config.Logger, slog.Default())
	env, err := readEnv(getenv)
	switch {
	case err != nil:
		return nil, err
	case env.endpoint == "":
		logger.DebugContext(ctx, "tracing is off: no OTLP endpoint or exporter set (OTEL_EXPORTER_OTLP_ENDPOINT)")
		return &Tracer{}, nil
	}
	exporter, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(env.endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(cmp.Or(config.ServiceName, "inboxworker"))),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
		resource.WithAttributes(env.serviceName...),
	)
	if err != nil {
		return nil, &envflag.Error{Name: "OTEL_RESOURCE_ATTRIBUTES", Err: err}
	}
	// The SDK's errors go to the worker's log, as JSON lines like the others, not to stderr.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: the OpenTelemetry SDK failed; spans it could not export are dropped",
			slog.String("error", redact.URL(err.Error())), slog.String("endpoint", redact.URL(env.endpoint)))
	}))
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter), // OTEL_BSP_* tune it
		sdktrace.WithResource(res),
		sdktrace.WithSampler(env.sampler),
	)
	logger.InfoContext(ctx, "tracing is on: exporting spans over OTLP/HTTP",
		slog.String("endpoint", redact.URL(env.endpoint)), slog.String("sampler", env.samplerName),
		slog.String("service_name", serviceName(res)))
	t := New(provider)
	t.provider = provider
	return t, nil
}

// Check returns the error Setup would return for the variables of getenv (nil when they are fine),
// without setting anything up: a command checks its settings before it starts anything.
func Check(getenv func(string) string) error {
	_, err := readEnv(getenv)
	return err
}

// serviceName is the service.name of res.
func serviceName(res *resource.Resource) string {
	v, _ := res.Set().Value(semconv.ServiceNameKey)
	return v.String()
}

// otelEnv is what Setup reads of the OTEL_* variables.
type otelEnv struct {
	endpoint    string // the traces URL; "" when tracing is off
	sampler     sdktrace.Sampler
	samplerName string
	serviceName []attribute.KeyValue // OTEL_SERVICE_NAME's, if set
}

// readEnv reads and checks the variables of Config.Getenv.
func readEnv(getenv func(string) string) (otelEnv, error) {
	var env otelEnv
	disabled, err := readDisabled(getenv)
	if err != nil || disabled {
		return env, err
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	switch exporter {
	case "none":
		return env, nil
	case "", "otlp":
	default:
		return env, &envflag.Error{Name: "OTEL_TRACES_EXPORTER",
			Err: fmt.Errorf("unsupported exporter %q (use otlp or none)", exporter)}
	}
	if env.endpoint, err = readEndpoint(getenv); err != nil {
		return env, err
	}
	if env.endpoint == "" && exporter == "" {
		return env, nil // nothing configured: off
	}
	env.endpoint = cmp.Or(env.endpoint, DefaultEndpoint)
	if err := readProtocol(getenv); err != nil {
		return env, err
	}
	if env.sampler, env.samplerName, err = readSampler(getenv); err != nil {
		return env, err
	}
	if err := checkSDKSettings(getenv); err != nil {
		return env, err
	}
	if name := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); name != "" {
		env.serviceName = []attribute.KeyValue{semconv.ServiceName(name)}
	}
	return env, nil
}

// readDisabled reads OTEL_SDK_DISABLED: true or false, in any case; unset is false.
func readDisabled(getenv func(string) string) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(getenv("OTEL_SDK_DISABLED"))); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, &envflag.Error{Name: "OTEL_SDK_DISABLED", Err: fmt.Errorf("invalid value %q (use true or false)", v)}
	}
}

// readEndpoint returns the URL that spans are posted to: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it
// is, else OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces appended to its path, as the OTLP exporter
// specification says; "" when neither is set.
func readEndpoint(getenv func(string) string) (string, error) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", &envflag.Error{Name: name,
				Err: fmt.Errorf("invalid URL %q (want http:// or https://, e.g. http://localhost:4318)", redact.URL(v))}
		}
		if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			u.Path = path.Join("/", u.Path, "v1/traces")
		}
		return u.String(), nil
	}
	return "", nil
}

// readProtocol checks OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL: the
// worker exports with http/protobuf only.
func readProtocol(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch v := strings.TrimSpace(getenv(name)); v {
		case "":
			continue
		case "http/protobuf":
			return nil
		default:
			return &envflag.Error{Name: name, Err: fmt.Errorf(
				"unsupported protocol %q: the worker exports over OTLP/HTTP with protobuf (http/protobuf, port 4318)", v)}
		}
	}
	return nil
}

// readSampler reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG as the SDK does, but refuses
// what the SDK would replace with its default.
func readSampler(getenv func(string) string) (sdktrace.Sampler, string, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := 1.0
	if arg != "" && strings.HasSuffix(name, "traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return nil, "", &envflag.Error{Name: "OTEL_TRACES_SAMPLER_ARG",
				Err: fmt.Errorf("invalid ratio %q for %s (want a number from 0 to 1)", arg, name)}
		}
		ratio = r
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), "parentbased_always_on", nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), name + "=" + strconv.FormatFloat(ratio, 'g', -1, 64), nil
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), name + "=" + strconv.FormatFloat(ratio, 'g', -1, 64), nil
	}
	return nil, "", &envflag.Error{Name: "OTEL_TRACES_SAMPLER", Err: errors.New("unsupported sampler " +
		strconv.Quote(name) + " (use parentbased_always_on, parentbased_always_off, parentbased_traceidratio, " +
		"always_on, always_off or traceidratio)")}
}

// checkSDKSettings checks the variables the SDK reads itself, which it would otherwise take
// silently as their defaults when they are wrong (a negative delay, an unknown compression), or
// report in a raw line of its own: the exporter's headers and timeout and compression, the batch
// processor's settings, and the resource's attributes. An error quotes no header value: one may be
// a collector's API key.
func checkSDKSettings(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		if err := checkPairs(getenv(name), false); err != nil {
			return &envflag.Error{Name: name, Err: err}
		}
	}
	if err := checkPairs(getenv("OTEL_RESOURCE_ATTRIBUTES"), true); err != nil {
		return &envflag.Error{Name: "OTEL_RESOURCE_ATTRIBUTES", Err: err}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		switch v := strings.TrimSpace(getenv(name)); v {
		case "", "gzip", "none":
		default:
			return &envflag.Error{Name: name, Err: fmt.Errorf("unsupported compression %q (use gzip or none)", v)}
		}
	}
	for _, n := range []struct {
		name  string
		least int
	}{
		{"OTEL_EXPORTER_OTLP_TIMEOUT", 1}, {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 1}, {"OTEL_BSP_SCHEDULE_DELAY", 0},
		{"OTEL_BSP_EXPORT_TIMEOUT", 1}, {"OTEL_BSP_MAX_QUEUE_SIZE", 1}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1},
	} {
		v := strings.TrimSpace(getenv(n.name))
		if v == "" {
			continue
		}
		if i, err := strconv.Atoi(v); err != nil || i < n.least {
			return &envflag.Error{Name: n.name, Err: fmt.Errorf("invalid value %q (want a whole number, %d or more; times in milliseconds)", v, n.least)}
		}
	}
	return nil
}

// checkPairs checks s, a list of key=value pairs separated by commas (W3C Baggage's format, which
// OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES take); quote says whether an error may
// quote the entry.
func checkPairs(s string, quote bool) error {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	for i, entry := range strings.Split(s, ",") {
		key, _, ok := strings.Cut(entry, "=")
		if ok && strings.TrimSpace(key) != "" {
			continue
		}
		if quote {
			return fmt.Errorf("entry %d, %q, is not KEY=VALUE (want key1=value1,key2=value2)", i+1, entry)
		}
		return fmt.Errorf("entry %d is not KEY=VALUE (want key1=value1,key2=value2)", i+1)
	}
	return nil
}
