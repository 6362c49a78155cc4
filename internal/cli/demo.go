package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/inboxworker/inboxworker/internal/demo"
	"github.com/inboxworker/inboxworker/internal/devbroker"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/startup"
)

func demoCommand() *command {
	return &command{
		name:    "demo",
		summary: "dev plus a generated stream of messages; prints a summary and exits",
		details: "Runs the worker against an embedded broker and a generated stream of payment callbacks\n" +
			"and SMS events with redeliveries, retries and bad messages, then prints a summary read\n" +
			"from the database and the dead-letter topics. Its orders and tables live in the schema\n" +
			demo.Schema + " of DATABASE_URL, recreated on every run: no other data is touched.\n" +
			"The broker listens on DEV_KAFKA_ADDR when it is set, else on any free local port.",
		defaults: map[string]string{"DEV_KAFKA_ADDR": "any free local port", "LOG_FORMAT": "text"},
		use:      settings.UseDemo,
		run:      runDemo,
	}
}

// runDemo is `worker demo`: it wires the embedded broker, the worker and the demo's schema, and
// lets package demo play its scenario against them.
func runDemo(ctx context.Context, a *app, cfg *Config, _ []string) error {
	ctx, cancel := context.WithTimeout(ctx, demo.Timeout)
	defer cancel()
	if !cfg.Explicit("LOG_FORMAT") {
		_ = cfg.Override("LOG_FORMAT", "text") // the demo is watched by a person
	}
	logger := newLogger(cfg, a.stderr)
	cfg.Receipts = true

	addr := "127.0.0.1:0"
	if cfg.Explicit("DEV_KAFKA_ADDR") {
		addr = cfg.DevKafkaAddr
	}
	broker, err := devbroker.Start(ctx, addr, cfg.devTopics(), cfg.DLQSuffix, logger)
	if err != nil {
		return err
	}
	defer broker.Close()
	return playDemo(ctx, a, cfg, logger, broker.Addr)
}

// demoProvider serves the demo's payment status endpoint on a local port and points
// PAYMENT_STATUS_URL at it, unless the setting was given: the demo shows a lost callback found by
// reconciliation. RECONCILE_AFTER, unless given, lets only the demo's lost order be asked about.
func demoProvider(cfg *Config) (stop func(), err error) {
	if cfg.Explicit("PAYMENT_STATUS_URL") {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: the payment status endpoint: %w", err)
	}
	srv := &http.Server{Handler: demo.StatusEndpoint(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	if err := cfg.Override("PAYMENT_STATUS_URL", "http://"+ln.Addr().String()+"/status"); err != nil {
		_ = srv.Close()
		return nil, err
	}
	if !cfg.Explicit("RECONCILE_AFTER") {
		if err := cfg.Override("RECONCILE_AFTER", demo.ReconcileAfter); err != nil {
			_ = srv.Close()
			return nil, err
		}
	}
	return func() { _ = srv.Close() }, nil
}

// playDemo runs the worker and the demo's scenario against the broker at brokerAddr, whose topics
// exist, and prints the summary.
func playDemo(ctx context.Context, a *app, cfg *Config, logger *slog.Logger, brokerAddr string) error {
	cfg.Receipts = true
	// The address bound, for the worker and the startup line.
	if err := cfg.Override("KAFKA_BROKERS", brokerAddr); err != nil {
		return err
	}
	if err := cfg.Override("DEV_KAFKA_ADDR", brokerAddr); err != nil {
		return err
	}
	stopProvider, err := demoProvider(cfg)
	if err != nil {
		return err
	}
	defer stopProvider()
	logStart(ctx, logger, "demo", cfg)

	pool, err := startup.OpenPostgres(ctx, postgres(cfg, logger, demo.Schema))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := demo.ResetSchema(ctx, pool); err != nil {
		return err
	}
	w, err := newWorker(ctx, cfg, logger, workerOptions{getenv: a.getenv, schema: demo.Schema, migrate: true})
	if err != nil {
		return err
	}
	if err := demo.CreateOrders(ctx, pool); err != nil {
		w.close()
		return err
	}

	workerCtx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	stopped := make(chan error, 1)
	go func() { stopped <- w.run(workerCtx) }()

	fmt.Fprintf(a.stdout, "Demo: embedded Kafka broker on %s, Postgres schema %s (recreated).\n", brokerAddr, demo.Schema)
	scenario := demo.Config{Broker: brokerAddr, Partitions: devbroker.Partitions, GroupID: cfg.KafkaGroupID,
		TopicPayments: cfg.Topic(paymentsInbox), TopicSMS: cfg.Topic(smsInbox),
		TopicPaymentEvents: cfg.Topic(paymentEventsInbox), EventsInbox: paymentEventsInbox, DLQSuffix: cfg.DLQSuffix,
		PaymentsInbox: paymentsInbox, Pool: pool, DatabaseURL: cfg.DatabaseURL, Metrics: w.registry, Out: a.stdout}
	outcomes, err := demo.Play(ctx, scenario)
	stopWorker()
	if stopErr := <-stopped; err == nil {
		err = stopErr
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := demo.Report(ctx, scenario, outcomes); err != nil {
		return fmt.Errorf("demo: summary: %w", err)
	}
	return nil
}
