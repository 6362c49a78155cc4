package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestOpsEndpoints checks /healthz, /readyz and /metrics, and that /readyz turns 503 with its
// reason when the worker is not ready and from the moment it drains.
func TestOpsEndpoints(t *testing.T) {
	t.Parallel()
	var notReady error
	reg := prometheus.NewRegistry()
	consumer.NewMetrics(reg).Messages.WithLabelValues("payments.callbacks", "applied").Inc()
	s, err := listenOps("127.0.0.1:0", reg, func(context.Context) error { return notReady }, testlog.New(t))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.serve() }()
	t.Cleanup(s.shutdown)
	base := "http://" + s.listener.Addr().String()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	check := func(path string, wantCode int, wantBody string) {
		t.Helper()
		if code, body := get(path); code != wantCode || !strings.Contains(body, wantBody) {
			t.Errorf("GET %s = %d %q, want %d and %q in the body", path, code, body, wantCode, wantBody)
		}
	}

	check("/healthz", 200, "ok")
	check("/readyz", 200, "ready")
	check("/metrics", 200, `inboxworker_messages_total{outcome="applied",topic="payments.callbacks"} 1`)
	notReady = errors.New("postgres: not answering")
	check("/readyz", 503, "postgres: not answering")
	notReady = nil
	s.draining()
	check("/readyz", 503, "stopping")
	check("/healthz", 200, "ok")
}

// TestReady checks what /readyz asks of the worker: Postgres answers, and the consumer has joined
// its group.
func TestReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Schema(t)
	down, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	notStarted, err := inboxworker.New(inboxworker.Config{
		Brokers: []string{"127.0.0.1:1"},
		Pool:    db.Pool,
		Routes:  []inboxworker.Route{{Topic: "t", Name: "t", Handler: nopHandler{}}},
	})
	if err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name string
		pool *pgxpool.Pool
		want string
	}{
		{"PostgresDown", down, "postgres: not answering"},
		{"NotJoined", db.Pool, "kafka: not joined to the consumer group yet"},
	} {
		w := &worker{pool: tt.pool, worker: notStarted}
		if err := w.ready(ctx); err == nil || err.Error() != tt.want {
			t.Errorf("%s: ready() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

type nopHandler struct{}

func (nopHandler) Handle(context.Context, pgx.Tx, inbox.Delivery) error { return nil }
