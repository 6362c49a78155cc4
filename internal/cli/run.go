package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/migrations"
)

func runCommand() *command {
	return &command{
		name:    "run",
		summary: "apply pending migrations, then consume until SIGTERM/SIGINT",
		details: "Applies pending migrations (unless --no-migrate), joins the consumer group and consumes\n" +
			"until SIGTERM or SIGINT, then stops fetching, lets in-flight messages finish within\n" +
			"SHUTDOWN_TIMEOUT, commits their offsets and exits 0. Serves /healthz, /readyz and /metrics\n" +
			"on HTTP_ADDR and purges expired idempotency keys in the background. Traces over OTLP/HTTP\n" +
			"when OpenTelemetry's OTEL_EXPORTER_OTLP_ENDPOINT is set (see docs/operations.md).",
		use: settings.UseRun,
		run: func(ctx context.Context, a *app, cfg *Config, _ []string) error {
			logger := newLogger(cfg, a.stderr)
			logStart(ctx, logger, "run", cfg)
			w, err := newWorker(ctx, cfg, logger, workerOptions{getenv: a.getenv, migrate: !cfg.NoMigrate, serveHTTP: true})
			if err != nil {
				return err
			}
			return w.run(ctx)
		},
	}
}

// logStart writes the startup line: the command and its effective configuration, secrets masked.
func logStart(ctx context.Context, logger *slog.Logger, command string, cfg *Config) {
	logStartAt(ctx, logger, slog.LevelInfo, command, cfg)
}

// logStartAt is logStart at level: debug for a one-shot command (inspect, parked, replay), run by a
// person at a terminal, whose output is what it prints.
func logStartAt(ctx context.Context, logger *slog.Logger, level slog.Level, command string, cfg *Config) {
	logger.LogAttrs(ctx, level, "starting", slog.String("command", command),
		slog.Attr{Key: "config", Value: slog.GroupValue(cfg.StartupAttrs()...)})
}

type workerOptions struct {
	// getenv reads OpenTelemetry's OTEL_* variables, which set tracing up (package tracing).
	getenv func(string) string
	// schema, when set, is the Postgres schema the worker works in (search_path).
	schema string
	// migrate applies pending migrations at start.
	migrate bool
	// serveHTTP serves /healthz, /readyz and /metrics on HTTP_ADDR.
	serveHTTP bool
}

// worker is the assembled process: a database pool, the routes behind the worker of package
// inboxworker, the HTTP endpoints and the tracer.
type worker struct {
	cfg       *Config
	logger    *slog.Logger
	tracer    *tracing.Tracer
	pool      *pgxpool.Pool
	worker    *inboxworker.Worker
	registry  *prometheus.Registry
	anomalies *anomalyGauge
	// reconciliation counts the orders left PENDING, and asks the provider about them.
	reconciliation *reconciliation
	ops            *opsServer
	// stopBy is when SHUTDOWN_TIMEOUT runs out, once the worker is stopping; zero before.
	stopBy time.Time
}

// newWorker connects to Postgres and Kafka (waiting up to STARTUP_TIMEOUT for each), migrates, and
// builds every part. Nothing is consumed until run.
func newWorker(ctx context.Context, cfg *Config, logger *slog.Logger, opts workerOptions) (_ *worker, err error) {
	w := &worker{cfg: cfg, logger: logger}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	// Off unless an OTLP endpoint is set; a variable it cannot honour ends the start here, before
	// anything is reached.
	if w.tracer, err = tracing.Setup(ctx, tracing.Config{Getenv: opts.getenv, Logger: logger}); err != nil {
		return nil, err
	}

	w.registry = prometheus.NewRegistry()
	w.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	w.anomalies = newAnomalyGauge(w.registry)
	w.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "inboxworker_ready",
		Help: "1 when the instance is ready (what /readyz answers with 200: Postgres answers, the consumer has joined its group, not stopping), else 0.",
	}, w.readyValue))
	// The port is taken first, so that a port in use is reported before anything else is done.
	// Requests wait in the listen queue until run serves them, when every part is built.
	if opts.serveHTTP {
		if w.ops, err = listenOps(cfg.HTTPAddr, w.registry, w.ready, logger); err != nil {
			return nil, err
		}
	}

	if w.pool, err = startup.OpenPostgres(ctx, postgres(cfg, logger, opts.schema)); err != nil {
		return nil, err
	}
	if opts.migrate {
		if _, err := migrations.Up(ctx, w.pool, logger); err != nil {
			return nil, err
		}
	}
	if err := w.wire(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// checkKafka waits up to STARTUP_TIMEOUT for the brokers, warns about the routes' topics that do
// not exist, and settles the routes' inbox retentions against their topics' (in cfg).
func checkKafka(ctx context.Context, cfg *Config, logger *slog.Logger) error {
	active := cfg.active()
	topics := make([]startup.Topic, len(active))
	for i, r := range active {
		topics[i] = startup.Topic{Name: cfg.Topic(r.Name), InboxRetention: cfg.Route(r.Name).Retention,
			RetentionSetting: "INBOX_RETENTION_" + strings.ToUpper(r.Name)}
	}
	if err := startup.CheckKafka(ctx, kafkaOf(cfg, logger), topics); err != nil {
		return err
	}
	for i, r := range active {
		cfg.Route(r.Name).Retention = topics[i].InboxRetention
	}
	return nil
}

// wire checks the routes' topics, then builds the handlers and the worker of package inboxworker.
func (w *worker) wire(ctx context.Context) error {
	cfg, logger := w.cfg, w.logger
	if err := checkKafka(ctx, cfg, logger); err != nil {
		return err
	}
	routes, err := cfg.workerRoutes(routeDeps{logger: logger, tracer: w.tracer, pool: w.pool})
	if err != nil {
		return err
	}
	mechanism, tlsConfig, err := kafkaOf(cfg, logger).Auth()
	if err != nil {
		return err
	}
	if w.worker, err = inboxworker.New(w.workerConfig(routes, mechanism, tlsConfig)); err != nil {
		return err
	}
	w.reconciliation, err = newReconciliation(cfg, w.pool, w.registry, logger)
	return err
}

// workerConfig is the worker's configuration: the settings, with the parts already built. Every
// value the settings' bounds allow passes the worker's validation, whose errors name its fields,
// not the settings.
func (w *worker) workerConfig(routes []inboxworker.Route, mechanism sasl.Mechanism, tlsConfig *tls.Config) inboxworker.Config {
	cfg := w.cfg
	var registerer prometheus.Registerer
	if w.registry != nil {
		registerer = w.registry
	}
	return inboxworker.Config{
		Brokers:        cfg.KafkaBrokers,
		GroupID:        cfg.KafkaGroupID,
		SASL:           mechanism,
		TLS:            tlsConfig,
		SessionTimeout: cfg.KafkaSessionTimeout,
		Pool:           w.pool,
		Routes:         routes,
		DLQSuffix:      cfg.DLQSuffix,
		Retry: inboxworker.Retry{
			InitialInterval: cfg.RetryInitialInterval,
			MaxInterval:     cfg.RetryMaxInterval,
			MaxElapsed:      cfg.RetryMaxElapsed,
		},
		KillSwitch:           cfg.killSwitch(),
		ParkAfter:            cfg.RetryParkAfter,
		Ordering:             ordering(cfg.Ordering),
		MaxInFlight:          cfg.MaxInFlight,
		BatchSize:            cfg.BatchSize,
		BatchWait:            cfg.BatchWait,
		ShutdownTimeout:      drainTimeout(cfg.ShutdownTimeout),
		LagInterval:          cfg.LagInterval,
		CommitFailureTimeout: cfg.CommitFailureTimeout,
		EventTopics:          cfg.relayedTopics(),
		OutboxRetention:      cfg.OutboxRetention,
		Registerer:           registerer,
		TracerProvider:       w.tracer.Provider(),
		Logger:               w.logger,
	}
}

// killSwitch is the kill switch of the KILL_SWITCH_* settings.
func (c *Config) killSwitch() inboxworker.KillSwitch {
	return inboxworker.KillSwitch{After: c.KillSwitchAfter, Rate: float64(c.KillSwitchRate) / 100,
		MaxProbeInterval: c.KillSwitchMaxProbeInterval}
}

// ordering is ORDERING's value for the worker.
func ordering(v string) inboxworker.Ordering {
	if v == "partition" {
		return inboxworker.ByPartition
	}
	return inboxworker.ByKey
}

// postgres is where the commands find the database.
func postgres(cfg *Config, logger *slog.Logger, schema string) startup.Postgres {
	return startup.Postgres{URL: cfg.DatabaseURL, Schema: schema, Timeout: cfg.StartupTimeout, Logger: logger}
}

// kafkaOf is where the commands find the brokers.
func kafkaOf(cfg *Config, logger *slog.Logger) startup.Kafka {
	return startup.Kafka{Brokers: cfg.KafkaBrokers, SASLMechanism: cfg.KafkaSASLMechanism,
		Username: cfg.KafkaUsername, Password: cfg.KafkaPassword, TLS: cfg.KafkaTLS,
		Timeout: cfg.StartupTimeout, Logger: logger}
}

// drainTimeout is the part of SHUTDOWN_TIMEOUT given to in-flight messages; the rest is left to
// commit their offsets, leave the group and close the connections, which takes about 200ms on the
// embedded broker: half of a short timeout, 2s of a long one.
func drainTimeout(shutdown time.Duration) time.Duration {
	return shutdown - min(shutdown/2, 2*time.Second)
}

// smsSender is the HTTP gateway of SMS_PROVIDER_URL, or a sender that only logs when it is unset.
func smsSender(cfg *Config, logger *slog.Logger, tracer *tracing.Tracer) (notify.Sender, error) {
	sender, se := providerSender(cfg.Config, tracer)
	switch {
	case se != nil:
		return nil, se
	case sender == nil:
		logger.Warn("SMS_PROVIDER_URL is unset: SMS are written to the log, not sent")
		return notify.NewLogSender(), nil
	}
	return sender, nil
}

// providerSender is the HTTP gateway of SMS_PROVIDER_URL, nil when it is unset, tracing its
// requests with tracer. The sender checks the URL and the token itself; its errors are told here in
// the settings' terms, without the token and with the URL masked.
func providerSender(cfg *settings.Config, tracer *tracing.Tracer) (*notify.HTTPSender, *settings.Error) {
	if cfg.SMSProviderURL == "" {
		return nil, nil
	}
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: cfg.SMSProviderURL, Token: cfg.SMSProviderToken,
		Timeout: cfg.SMSProviderTimeout, Tracer: tracer})
	switch {
	case errors.Is(err, notify.ErrInvalidToken):
		return nil, &settings.Error{Name: "SMS_PROVIDER_TOKEN", Err: errors.New("must be printable ASCII without spaces")}
	case err != nil:
		return nil, &settings.Error{Name: "SMS_PROVIDER_URL",
			Err: fmt.Errorf("invalid URL %q (want http:// or https://)", redact.URL(cfg.SMSProviderURL))}
	}
	return sender, nil
}

// ready is /readyz: Postgres answers, the consumer has joined its group and its offset commits go
// through.
func (w *worker) ready(ctx context.Context) error {
	if err := w.pool.Ping(ctx); err != nil {
		return errors.New("postgres: not answering")
	}
	if err := w.worker.Ready(); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// readyValue is the inboxworker_ready gauge, read at each scrape: /readyz as a metric, for alerts.
func (w *worker) readyValue() float64 {
	if w.pool == nil || w.worker == nil || (w.ops != nil && w.ops.stopping.Load()) {
		return 0 // still starting, or stopping
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if w.ready(ctx) != nil {
		return 0
	}
	return 1
}

// run consumes until ctx is cancelled, then shuts down within SHUTDOWN_TIMEOUT and releases
// everything. It returns nil after a clean stop.
func (w *worker) run(ctx context.Context) (err error) {
	var wg sync.WaitGroup
	if w.ops != nil {
		wg.Go(func() {
			if err := w.ops.serve(); err != nil {
				w.logger.Error("http server failed", slog.String("err", err.Error()))
			}
		})
	}
	purgeCtx, stopPurge := context.WithCancel(ctx)
	wg.Go(func() { w.anomalies.run(purgeCtx, w.pool, w.logger) })
	wg.Go(func() { w.reconciliation.run(purgeCtx, w.cfg, w.pool, w.logger) })
	stuck := false
	defer func() {
		stopPurge()
		if w.ops != nil {
			w.ops.shutdown()
		}
		if stuck {
			return // the consumer still holds connections: closing the pool would wait for it
		}
		wg.Wait()
		w.close()
	}()

	done := make(chan error, 1)
	go func() { done <- w.worker.Run(ctx) }()

	select {
	case err := <-done:
		if ctx.Err() == nil {
			if err == nil {
				err = errors.New("stopped unexpectedly")
			}
			return fmt.Errorf("consumer: %w", err)
		}
		return w.stopped(err)
	case <-ctx.Done():
	}
	// /readyz says 503 before the log line says so: whoever reads the line may rely on it.
	if w.ops != nil {
		w.ops.draining()
	}
	w.logger.Info("stopping: finishing in-flight messages", slog.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
	w.stopBy = time.Now().Add(w.cfg.ShutdownTimeout)
	timer := time.NewTimer(w.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return w.stopped(err)
	case <-timer.C:
		// In-flight work was cancelled at the drain timeout and its transactions rolled back; what
		// is left is leaving the group and closing connections, which the group's session timeout
		// stands in for. Nothing is committed half, so this is still a clean stop.
		stuck = true
		w.logger.Warn("SHUTDOWN_TIMEOUT ran out before the consumer left its group; exiting anyway: "+
			"the group hands its partitions on after KAFKA_SESSION_TIMEOUT",
			slog.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
		return nil
	}
}

func (w *worker) stopped(err error) error {
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	w.logger.Info("stopped")
	return nil
}

// close releases everything, the tracer last: it exports the spans of all that ended, within
// tracingFlush, and never past what is left of SHUTDOWN_TIMEOUT once the worker is stopping. The
// offsets are committed by then: a collector that does not answer costs a few seconds of the stop,
// not the whole SHUTDOWN_TIMEOUT, after which an orchestrator kills the process.
func (w *worker) close() {
	if w.ops != nil {
		_ = w.ops.listener.Close()
	}
	if w.pool != nil {
		w.pool.Close()
	}
	deadline := time.Now().Add(tracingFlush)
	if !w.stopBy.IsZero() && w.stopBy.Before(deadline) {
		deadline = w.stopBy
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := w.tracer.Shutdown(ctx); err != nil {
		w.logger.Warn("tracing: not every span was exported before the worker stopped", slog.String("error", redact.URL(err.Error())))
	}
}

// tracingFlush bounds the export of the last spans.
const tracingFlush = 3 * time.Second
