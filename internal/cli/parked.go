package cli

import (
	"context"
	"log/slog"

	"github.com/inboxworker/inboxworker/internal/parked"
	"github.com/inboxworker/inboxworker/internal/settings"
)

// parkedCommand is `worker parked list|retry|dead-letter`: what waits in the park, and an operator's
// hand on it. It is a command of its own rather than an option of replay: replay reads dead-letter
// topics in Kafka, the park is a table in Postgres, and listing it needs no broker.
func parkedCommand() *command {
	return &command{
		name:    "parked",
		args:    "list [TOPIC] | retry ID...|all [TOPIC] | dead-letter ID...",
		maxArgs: 1000,
		summary: "list the messages parked for a retry, retry them now, or dead-letter them",
		details: "A message whose retryable error outlasts its first retries in place is parked in Postgres,\n" +
			"and so is every later message of its key, behind it, so that the key keeps its order while\n" +
			"the rest of its partition goes on. The worker retries the head of each key until it is\n" +
			"applied or its retry budget (RETRY_MAX_ELAPSED) runs out.\n" +
			"\n" +
			"  list [TOPIC]          one line per parked message, each key's head first: where it came\n" +
			"                        from, its Kafka and idempotency keys, what it waits for (next=: the\n" +
			"                        messages of its key ahead of it, or its next attempt), its attempts,\n" +
			"                        the retry budget spent and left (of RETRY_MAX_ELAPSED: give the\n" +
			"                        worker's), its last error, and the reason it is dead-lettered with\n" +
			"                        should its budget run out (reason_if_exhausted=); then a count per\n" +
			"                        topic\n" +
			"  retry ID...|all [TOPIC]\n" +
			"                        make them due now (a message still waits for those ahead of it)\n" +
			"  dead-letter ID...     write them to their dead-letter topic (the original key, value and\n" +
			"                        headers, with the dlq-* headers and the message's reason), then take\n" +
			"                        them out of the park; the key's next message gets its turn. A message\n" +
			"                        the worker is retrying at that moment is refused: try again.\n" +
			"\n" +
			"Only dead-letter connects to Kafka.",
		use: settings.UseParked,
		run: runParked,
	}
}

func runParked(ctx context.Context, a *app, cfg *Config, args []string) error {
	verb, rest, err := parked.Verb(args)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, a.stderr)
	logStartAt(ctx, logger, slog.LevelDebug, "parked "+verb, cfg)
	return parked.Run(ctx, parked.Config{Verb: verb, Args: rest, DLQSuffix: cfg.DLQSuffix, RetryBudget: cfg.RetryMaxElapsed,
		Postgres: postgres(cfg, logger, ""), Kafka: kafkaOf(cfg, logger), Out: a.stdout, Logger: logger})
}
