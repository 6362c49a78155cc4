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
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/receipt"
	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/migrations"
)

func runCommand() *command {
	return &command{
		name:    "run",
		summary: "apply pending migrations, then consume until SIGTERM/SIGINT",
		details: "Applies pending migrations (unless --no-migrate), joins the consumer group and consumes\n" +
			"until SIGTERM or SIGINT, then stops fetching, lets in-flight messages finish within\n" +
			"SHUTDOWN_TIMEOUT, commits their offsets and exits 0. Serves /healthz, /readyz and /metrics\n" +
			"on HTTP_ADDR and purges expired idempotency keys in the background.",
		use: useRun,
		run: func(ctx context.Context, a *app, cfg *Config, _ []string) error {
			logger := newLogger(cfg, a.stderr)
			logStart(ctx, logger, "run", cfg)
			w, err := newWorker(ctx, cfg, logger, workerOptions{migrate: !cfg.NoMigrate, serveHTTP: true})
			if err != nil {
				return err
			}
			return w.run(ctx)
		},
	}
}

// logStart writes the startup line: the command and its effective configuration, secrets masked.
func logStart(ctx context.Context, logger *slog.Logger, command string, cfg *Config) {
	logger.LogAttrs(ctx, slog.LevelInfo, "starting", slog.String("command", command),
		slog.Attr{Key: "config", Value: slog.GroupValue(cfg.startupAttrs()...)})
}

// A route is one consumed topic and all that is wired to it, in one place: its inbox name (keys
// are unique per name), how long its keys are remembered and the setting that says so, and how its
// handler is built.
type route struct {
	topic string
	inbox string
	// retention is the setting's field: 0 when unset, until checkKafka settles it from the topic.
	retention        *time.Duration
	retentionSetting string
	// concurrency is the most of its transactions (or calls) at once, across partitions.
	concurrency int
	handler     func(cfg *Config, logger *slog.Logger) (any, error) // a consumer.Handler or CallHandler
}

// paymentsInbox is the inbox name of the payment callbacks, which the demo's summary reads.
const paymentsInbox = "payments"

// routes are the worker's routes: the payments and the SMS, and, while the order events are
// emitted, the order events' route that asks for the payment-received SMS — in worker dev and demo,
// whose broker has the topic, and in worker run when TOPIC_PAYMENT_EVENTS is set: a consumer group
// whose topic does not exist consumes none of its topics, so the default must not name one that
// may not exist yet.
func routes(cfg *Config) []route {
	rs := []route{
		{topic: cfg.TopicPayments, inbox: paymentsInbox,
			retention: &cfg.InboxRetentionPayments, retentionSetting: "INBOX_RETENTION_PAYMENTS",
			concurrency: cfg.PaymentsConcurrency,
			handler: func(cfg *Config, logger *slog.Logger) (any, error) {
				return payment.NewHandler(payment.Config{EventsTopic: cfg.TopicPaymentEvents, Logger: logger})
			}},
		{topic: cfg.TopicSMS, inbox: "sms",
			retention: &cfg.InboxRetentionSMS, retentionSetting: "INBOX_RETENTION_SMS",
			concurrency: cfg.SMSConcurrency,
			handler: func(cfg *Config, logger *slog.Logger) (any, error) {
				sender, err := smsSender(cfg, logger)
				if err != nil {
					return nil, err
				}
				return notify.NewHandler(notify.Config{Sender: sender, Logger: logger})
			}},
	}
	if cfg.TopicPaymentEvents != "" && (cfg.receipts || cfg.explicit("TOPIC_PAYMENT_EVENTS")) {
		rs = append(rs, route{topic: cfg.TopicPaymentEvents, inbox: receiptsInbox,
			retention: &cfg.InboxRetentionPaymentEvents, retentionSetting: "INBOX_RETENTION_PAYMENT_EVENTS",
			concurrency: cfg.PaymentsConcurrency,
			handler: func(cfg *Config, logger *slog.Logger) (any, error) {
				return receipt.NewHandler(receipt.Config{SMSTopic: cfg.TopicSMS, Logger: logger})
			}})
	}
	return rs
}

// receiptsInbox is the inbox name of the order events' route.
const receiptsInbox = "receipts"

// topics are the routes' topics.
func topics(cfg *Config) []string {
	var out []string
	for _, r := range routes(cfg) {
		out = append(out, r.topic)
	}
	return out
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
	relay     *outbox.Relay
	// outboxMetrics are the relay's, registered before it is built.
	outboxMetrics *outbox.Metrics
	ops           *opsServer
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
	w.outboxMetrics = outbox.NewMetrics(w.registry)
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
	rs := routes(cfg)
	topics := make([]startup.Topic, len(rs))
	for i, r := range rs {
		topics[i] = startup.Topic{Name: r.topic, InboxRetention: *r.retention, RetentionSetting: r.retentionSetting}
	}
	if err := startup.CheckKafka(ctx, kafkaOf(cfg, logger), topics); err != nil {
		return err
	}
	for i, r := range rs {
		*r.retention = topics[i].InboxRetention
	}
	return nil
}

// wire checks the routes' topics, then builds the inbox, the handlers and the consumer.
func (w *worker) wire(ctx context.Context) error {
	cfg, logger := w.cfg, w.logger
	if err := checkKafka(ctx, cfg, logger); err != nil {
		return err
	}
	retention := map[string]time.Duration{}
	var consumed []consumer.Route
	for _, r := range routes(cfg) {
		h, err := r.handler(cfg, logger)
		if err != nil {
			return err
		}
		retention[r.inbox] = *r.retention
		consumed = append(consumed, consumer.Route{Topic: r.topic, Name: r.inbox, Handler: h,
			Concurrency: r.concurrency})
	}
	var err error
	w.store, err = inbox.NewStore(w.pool, inbox.Config{Retention: retention, Logger: logger})
	if err != nil {
		return err
	}
	mechanism, tlsConfig, err := kafkaOf(cfg, logger).Auth()
	if err != nil {
		return err
	}
	w.consumer, err = consumer.New(consumer.Config{
		Brokers:        cfg.KafkaBrokers,
		GroupID:        cfg.KafkaGroupID,
		Routes:         consumed,
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
		return err
	}
	w.relay, err = outbox.NewRelay(outbox.RelayConfig{
		Pool:      w.pool,
		Brokers:   cfg.KafkaBrokers,
		SASL:      mechanism,
		TLS:       tlsConfig,
		Topics:    emittedTopics(cfg),
		Retention: cfg.OutboxRetention,
		Metrics:   w.outboxMetrics,
		Logger:    logger,
	})
	return err
}

// emittedTopics are the topics the routes emit events to through the outbox: the order events', and
// the SMS topic for the payment-received SMS; none while emission is off.
func emittedTopics(cfg *Config) []string {
	if cfg.TopicPaymentEvents == "" {
		return nil
	}
	return []string{cfg.TopicPaymentEvents, cfg.TopicSMS}
}

// ordering is ORDERING's value for the consumer.
func ordering(v string) consumer.Ordering {
	if v == "partition" {
		return consumer.ByPartition
	}
	return consumer.ByKey
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
func smsSender(cfg *Config, logger *slog.Logger) (notify.Sender, error) {
	sender, se := providerSender(cfg)
	switch {
	case se != nil:
		return nil, se
	case sender == nil:
		logger.Warn("SMS_PROVIDER_URL is unset: SMS are written to the log, not sent")
		return notify.NewLogSender(logger), nil
	}
	return sender, nil
}

// providerSender is the HTTP gateway of SMS_PROVIDER_URL, nil when it is unset. The sender checks
// the URL and the token itself; its errors are told here in the settings' terms, without the token
// and with the URL masked.
func providerSender(cfg *Config) (*notify.HTTPSender, *settingError) {
	if cfg.SMSProviderURL == "" {
		return nil, nil
	}
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: cfg.SMSProviderURL, Token: cfg.SMSProviderToken})
	switch {
	case errors.Is(err, notify.ErrInvalidToken):
		return nil, &settingError{Name: "SMS_PROVIDER_TOKEN", Err: errors.New("must be printable ASCII without spaces")}
	case err != nil:
		return nil, &settingError{Name: "SMS_PROVIDER_URL",
			Err: fmt.Errorf("invalid URL %q (want http:// or https://)", redact.URL(cfg.SMSProviderURL))}
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
	wg.Go(func() { w.store.RunPurger(purgeCtx, 0) }) // at the inbox's own interval
	wg.Go(func() { w.anomalies.run(purgeCtx, w.pool, w.logger) })
	// The relay stops at SIGTERM, ending its write in progress and giving its lease up, so that
	// another instance takes over at once; what the draining consumer emits meanwhile waits for it.
	wg.Go(func() { w.relay.Run(ctx) })
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
	// /readyz says 503 before the log line says so: whoever reads the line may rely on it.
	if w.ops != nil {
		w.ops.draining()
	}
	w.logger.Info("stopping: finishing in-flight messages", slog.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
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
