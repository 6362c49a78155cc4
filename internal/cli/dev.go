package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/inboxworker/inboxworker/internal/devbroker"
	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/settings"
)

func devCommand() *command {
	return &command{
		name:    "dev",
		summary: "run the worker against an embedded Kafka broker",
		details: "Starts an embedded Kafka broker (the real wire protocol, in memory) on DEV_KAFKA_ADDR with\n" +
			"the topics and their dead-letter topics created (and those of DEV_TOPICS, for a binary of\n" +
			"your own on the worker's API to consume), prints how to produce to it, then runs the\n" +
			"worker against it until stopped. SMS are only logged unless SMS_PROVIDER_URL is set.",
		defaults: map[string]string{"LOG_FORMAT": "text"},
		use:      settings.UseDev,
		run:      dev,
	}
}

// dev is `worker dev`.
func dev(ctx context.Context, a *app, cfg *Config, _ []string) error {
	if !cfg.Explicit("LOG_FORMAT") {
		_ = cfg.Override("LOG_FORMAT", "text") // worker dev is watched by a person, as the demo is
	}
	logger := newLogger(cfg, a.stderr)
	cfg.Receipts = true
	broker, err := devbroker.Start(ctx, cfg.DevKafkaAddr, cfg.devTopics(), cfg.DLQSuffix, logger)
	if err != nil {
		return err
	}
	defer broker.Close()
	cfg.KafkaBrokers = []string{broker.Addr}
	printHowTo(a.stdout, broker.Addr, cfg)

	logStart(ctx, logger, "dev", cfg)
	w, err := newWorker(ctx, cfg, logger, workerOptions{getenv: a.getenv, migrate: true, serveHTTP: true})
	if err != nil {
		return err
	}
	return w.run(ctx)
}

// printHowTo tells the person running worker dev how to produce to the embedded broker.
func printHowTo(w io.Writer, addr string, cfg *Config) {
	fmt.Fprintf(w, `Embedded Kafka broker listening on %[1]s (in memory: its messages go when the worker stops).
Topics: %[6]s (each with its dead-letter topic, topic%[4]s), %[5]d partitions each.

Produce with any Kafka client, e.g. kcat. A payment callback pays an order the order service
created; create one first:
  psql '%[7]s' -c "INSERT INTO orders (order_no, user_id, amount, currency, status) VALUES ('A-1', 'u-1', 99.90, 'CNY', 'PENDING')"
  echo '{"event_id":"evt-1","order_no":"A-1","provider":"alipay","provider_txn_id":"T-1","amount":"99.90","currency":"CNY","result":"SUCCESS","paid_at":"2025-01-01T12:00:00Z"}' \
    | kcat -P -b %[1]s -t %[2]s -k A-1 -H Idempotency-Key=evt-1
  echo '{"event_id":"sms-1","phone":"+8613800138000","template":"verify_code","params":{"code":"123456"}}' \
    | kcat -P -b %[1]s -t %[3]s -k +8613800138000
Read the dead letters with:
  kcat -C -b %[1]s -t %[2]s%[4]s -f '%%k %%h %%s\n'

`, addr, cfg.Topic(paymentsInbox), cfg.Topic(smsInbox), cfg.DLQSuffix, devbroker.Partitions,
		strings.Join(cfg.devTopics(), ", "), redact.URL(cfg.DatabaseURL))
}
