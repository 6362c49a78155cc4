package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/migrations"
)

// The handlers' names in the inbox: idempotency keys are unique per name.
const (
	paymentsHandler = "payments"
	smsHandler      = "sms"
)

// purgeInterval is how often expired idempotency keys are deleted.
const purgeInterval = 10 * time.Minute

// runCommand is `worker run`.
func runCommand(ctx context.Context, a *app, cfg *Config, _ []string) error {
	logger := newLogger(cfg, a.stderr)
	logStart(ctx, logger, "run", cfg)
	w, err := newWorker(ctx, cfg, logger, workerOptions{migrate: !cfg.NoMigrate, serveHTTP: true})
	if err != nil {
		return err
	}
	return w.run(ctx)
}

// logStart writes the startup line: the command and its effective configuration, secrets masked.
func logStart(ctx context.Context, logger *slog.Logger, command string, cfg *Config) {
	logger.LogAttrs(ctx, slog.LevelInfo, "starting", slog.String("command", command),
		slog.Attr{Key: "config", Value: slog.GroupValue(cfg.masked(cfg.used)...)})
}

type workerOptions struct {
	// schema, when set, is the Postgres schema the worker works in (search_path).
	schema string
	// migrate applies pending migrations at start.
	migrate bool
	// serveHTTP serves /healthz, /readyz and /metrics on HTTP_ADDR.
	serveHTTP bool
}

// worker is the assembled process: a database pool, the inbox, the handlers behind the consumer,
// and the HTTP endpoints.
type worker struct {
	cfg       *Config
	logger    *slog.Logger
	pool      *pgxpool.Pool
	store     *inbox.Store
	consumer  *consumer.Consumer
	registry  *prometheus.Registry
	metrics   *consumer.Metrics
	anomalies *anomalyGauge
	ops       *opsServer
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

	w.registry = prometheus.NewRegistry()
	w.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	w.metrics = consumer.NewMetrics(w.registry)
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

	if w.pool, err = openDatabase(ctx, cfg, logger, opts.schema); err != nil {
		return nil, err
	}
	if opts.migrate {
		if _, err := migrations.Up(ctx, w.pool, logger); err != nil {
			return nil, err
		}
	}
	if err := checkKafka(ctx, cfg, logger); err != nil {
		return nil, err
	}

	w.store, err = inbox.NewStore(w.pool, inbox.Config{
		Retention: map[string]time.Duration{
			paymentsHandler: cfg.InboxRetentionPayments,
			smsHandler:      cfg.InboxRetentionSMS,
		},
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	payments, err := payment.NewHandler(payment.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	sender, err := smsSender(cfg, logger)
	if err != nil {
		return nil, err
	}
	sms, err := notify.NewHandler(notify.Config{Sender: sender, Logger: logger})
	if err != nil {
		return nil, err
	}

	mechanism, tlsConfig, err := kafkaAuth(cfg)
	if err != nil {
		return nil, err
	}
	w.consumer, err = consumer.New(consumer.Config{
		Brokers: cfg.KafkaBrokers,
		GroupID: cfg.KafkaGroupID,
		Routes: []consumer.Route{
			{Topic: cfg.TopicPayments, Name: paymentsHandler, Handler: payments, Concurrency: cfg.PaymentsConcurrency},
			{Topic: cfg.TopicSMS, Name: smsHandler, Handler: sms, Concurrency: cfg.SMSConcurrency},
		},
		SASL:           mechanism,
		TLS:            tlsConfig,
		SessionTimeout: cfg.KafkaSessionTimeout,
		DLQSuffix:      cfg.DLQSuffix,
		Retry: consumer.Retry{
			InitialInterval: cfg.RetryInitialInterval,
			MaxInterval:     cfg.RetryMaxInterval,
			MaxElapsed:      cfg.RetryMaxElapsed,
		},
		Ordering:        ordering(cfg.Ordering),
		ParkAfter:       cfg.RetryParkAfter,
		MaxInFlight:     cfg.MaxInFlight,
		BatchSize:       cfg.BatchSize,
		BatchWait:       cfg.BatchWait,
		LagInterval:     cfg.LagInterval,
		ShutdownTimeout: drainTimeout(cfg.ShutdownTimeout),
		Store:           w.store,
		DeadLetters:     deadletter.NewStore(w.pool),
		Metrics:         w.metrics,
		Logger:          logger,
	})
	if err != nil {
		return nil, err
	}

	return w, nil
}

// ordering is ORDERING's value for the consumer.
func ordering(v string) consumer.Ordering {
	if v == "partition" {
		return consumer.ByPartition
	}
	return consumer.ByKey
}

// drainTimeout is the part of SHUTDOWN_TIMEOUT given to in-flight messages; the rest is left to
// commit their offsets, leave the group and close the connections, which takes about 200ms on the
// embedded broker: half of a short timeout, 2s of a long one.
func drainTimeout(shutdown time.Duration) time.Duration {
	return shutdown - min(shutdown/2, 2*time.Second)
}

// smsSender is the HTTP gateway of SMS_PROVIDER_URL, or a sender that only logs when it is unset.
func smsSender(cfg *Config, logger *slog.Logger) (notify.Sender, error) {
	if cfg.SMSProviderURL == "" {
		logger.Warn("SMS_PROVIDER_URL is unset: SMS are written to the log, not sent")
		return notify.NewLogSender(logger), nil
	}
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: cfg.SMSProviderURL, Token: cfg.SMSProviderToken})
	switch {
	case errors.Is(err, notify.ErrInvalidToken):
		return nil, &settingError{name: "SMS_PROVIDER_TOKEN", err: err}
	case err != nil:
		return nil, &settingError{name: "SMS_PROVIDER_URL", err: err}
	}
	return sender, nil
}

// ready is /readyz: Postgres answers and the consumer has joined its group.
func (w *worker) ready(ctx context.Context) error {
	if err := w.pool.Ping(ctx); err != nil {
		return errors.New("postgres: not answering")
	}
	if !w.consumer.Ready() {
		return errors.New("kafka: not joined to the consumer group yet")
	}
	return nil
}

// readyValue is the inboxworker_ready gauge, read at each scrape: /readyz as a metric, for alerts.
func (w *worker) readyValue() float64 {
	if w.pool == nil || w.consumer == nil || (w.ops != nil && w.ops.stopping.Load()) {
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
	wg.Go(func() { w.store.RunPurger(purgeCtx, purgeInterval) })
	wg.Go(func() { w.anomalies.run(purgeCtx, w.pool, w.logger) })
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
	go func() { done <- w.consumer.Run(ctx) }()

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
	w.logger.Info("stopping: finishing in-flight messages", slog.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
	if w.ops != nil {
		w.ops.draining()
	}
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

func (w *worker) close() {
	if w.ops != nil {
		_ = w.ops.listener.Close()
	}
	if w.pool != nil {
		w.pool.Close()
	}
}
