package cli

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxworker/inboxworker/internal/settings"
)

// readyCheck reports why the worker cannot take traffic, or nil when it can.
type readyCheck func(ctx context.Context) error

// opsServer serves /healthz, /readyz and /metrics.
type opsServer struct {
	server   *http.Server
	listener net.Listener
	stopping atomic.Bool
	logger   *slog.Logger
}

// listenOps binds addr at once, so that a port in use is reported at start, and logs the address
// bound (which differs from addr for port 0).
func listenOps(addr string, reg *prometheus.Registry, ready readyCheck, logger *slog.Logger) (*opsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &settings.Error{Name: "HTTP_ADDR", Err: err}
	}
	s := &opsServer{listener: ln, logger: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.stopping.Load() {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	logger.Info("http listening", slog.String("addr", ln.Addr().String()))
	return s, nil
}

// serve serves until shutdown is called.
func (s *opsServer) serve() error {
	if err := s.server.Serve(s.listener); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// draining makes /readyz answer 503 from now on: the worker is shutting down.
func (s *opsServer) draining() { s.stopping.Store(true) }

func (s *opsServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.server.Shutdown(ctx); err != nil {
		_ = s.server.Close()
	}
}
