package main_test

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestStartupErrors runs the binary with a bad setting or an unreachable dependency: it must exit 1
// at once with one plain line naming the setting (after its JSON logs, if it got as far as logging),
// with no password in any of its output, and never a panic.
func TestStartupErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		// want is the whole last line, or its beginning when it ends with "…".
		want string
		// onlyLine: nothing else may be printed (a configuration error stops before any log).
		onlyLine bool
	}{
		{
			name:     "BadDatabaseURL",
			env:      []string{"DATABASE_URL=postgres://app:s3cret@db:5432/shop?sslmode=sometimes"},
			args:     []string{"migrate"},
			want:     `worker: DATABASE_URL: invalid URL "postgres://app:xxxxx@db:5432/shop?sslmode=sometimes": failed to configure TLS (sslmode is invalid)`,
			onlyLine: true,
		},
		{
			name:     "NotAPostgresURL",
			env:      []string{"DATABASE_URL=mysql://app:s3cret@db/shop"},
			args:     []string{"run"},
			want:     `worker: DATABASE_URL: invalid URL "mysql://app:xxxxx@db/shop" (want postgres://user:password@host:port/database)`,
			onlyLine: true,
		},
		{
			name:     "BadDuration",
			env:      []string{"RETRY_MAX_ELAPSED=abc"},
			args:     []string{"run"},
			want:     `worker: RETRY_MAX_ELAPSED: invalid duration "abc"`,
			onlyLine: true,
		},
		{
			name:     "BadTraceSampler",
			env:      []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER=ratio"},
			args:     []string{"run"},
			want:     `worker: OTEL_TRACES_SAMPLER: unsupported sampler "ratio" (use parentbased_always_on, parentbased_always_off, parentbased_traceidratio, always_on, always_off or traceidratio)`,
			onlyLine: true,
		},
		{
			name:     "TraceEndpointNotHTTP",
			env:      []string{"OTEL_EXPORTER_OTLP_ENDPOINT=grpc://otel:s3cret@collector:4317"},
			args:     []string{"demo"},
			want:     `worker: OTEL_EXPORTER_OTLP_ENDPOINT: invalid URL "grpc://otel:xxxxx@collector:4317" (want http:// or https://, e.g. http://localhost:4318)`,
			onlyLine: true,
		},
		{
			name:     "UnknownFlag",
			args:     []string{"run", "--retry-max=1s"},
			want:     `worker: unknown flag --retry-max (see worker run --help)`,
			onlyLine: true,
		},
		{
			name: "UnreachableDatabase",
			env:  []string{"DATABASE_URL=postgres://app:s3cret@127.0.0.1:1/shop?sslmode=disable", "STARTUP_TIMEOUT=300ms"},
			args: []string{"run"},
			want: `worker: DATABASE_URL: Postgres at postgres://app:xxxxx@127.0.0.1:1/shop?sslmode=disable unreachable after 300ms: …`,
		},
		{
			name: "UnreachableKafka",
			// Long enough for Postgres, reached first, to answer on a busy machine: 300ms was not.
			env:  []string{"DATABASE_URL=" + pgtest.ServerURL(), "KAFKA_BROKERS=127.0.0.1:1", "STARTUP_TIMEOUT=3s", "HTTP_ADDR=127.0.0.1:0"},
			args: []string{"run", "--no-migrate"},
			want: `worker: KAFKA_BROKERS: Kafka at 127.0.0.1:1 unreachable after 3s: …`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startWorker(t, tt.env, tt.args...)
			if code := p.wait(); code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			stdout, lines := p.output()
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if len(lines) == 0 {
				t.Fatal("nothing on stderr")
			}
			last := lines[len(lines)-1]
			if prefix, ok := strings.CutSuffix(tt.want, "…"); ok {
				if !strings.HasPrefix(last, prefix) {
					t.Errorf("last line %q, want it to begin with %q", last, prefix)
				}
			} else if last != tt.want {
				t.Errorf("last line %q, want %q", last, tt.want)
			}
			if tt.onlyLine && len(lines) != 1 {
				t.Errorf("%d lines on stderr, want 1", len(lines))
			}
			for _, l := range lines[:len(lines)-1] {
				if !json.Valid([]byte(l)) {
					t.Errorf("a line before the error is not a JSON log: %q", l)
				}
			}
			for _, l := range lines {
				if strings.Contains(l, "s3cret") || strings.Contains(l, "panic") {
					t.Errorf("a password or a panic in the output: %q", l)
				}
			}
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"migrate", "-h"}} {
		p := startWorker(t, nil, args...)
		if code := p.wait(); code != 0 {
			t.Errorf("worker %s: exit code %d, want 0", strings.Join(args, " "), code)
		}
		if stdout, _ := p.output(); !strings.Contains(stdout, "--database-url URL") {
			t.Errorf("worker %s does not describe --database-url:\n%s", strings.Join(args, " "), stdout)
		}
	}
}

// TestStopWhileStarting stops the worker while it waits for Postgres: a clean stop, exit code 0.
func TestStopWhileStarting(t *testing.T) {
	t.Parallel()
	p := startWorker(t, []string{"DATABASE_URL=postgres://app@127.0.0.1:1/shop", "STARTUP_TIMEOUT=1m",
		"HTTP_ADDR=127.0.0.1:0"}, "run")
	p.waitLog("waiting for Postgres")
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}
