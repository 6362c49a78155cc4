package cli

import (
	"context"
	"errors"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/replay"
	"github.com/inboxworker/inboxworker/internal/settings"
)

func replayCommand() *command {
	var opts replay.Options
	return &command{
		name:    "replay",
		args:    "DLQ_TOPIC",
		maxArgs: 1,
		summary: "put dead letters back on their original topic, once their cause is fixed",
		details: "Reads every partition of DLQ_TOPIC (a topic ending with DLQ_SUFFIX) from its first offset\n" +
			"to its end offset as of the start, without a consumer group, then the dead letters DLQ_TOPIC\n" +
			"refused for good (too large for it, not authorised), which the worker kept in the table\n" +
			"dead_letters of DATABASE_URL, not replayed yet. It produces each dead letter whose\n" +
			deadletter.HeaderReason + " is --reason (all when unset) to the topic its " + deadletter.HeaderOriginalTopic + "\n" +
			"header names: the original key, value and headers (Idempotency-Key among them), less the\n" +
			"dlq-* headers, partitioned by key as producers do. A dead letter without\n" +
			deadletter.HeaderOriginalTopic + " is skipped with a warning; one naming a dead-letter topic\n" +
			"stops the command before anything is written. Prints one line per dead letter replayed\n" +
			"and a summary.\n" +
			"\n" +
			"Nothing is deleted: Kafka topics are append-only, so replaying twice puts a message back\n" +
			"twice. The inbox makes that harmless for a message that was applied (its key is skipped as\n" +
			"a duplicate); a message that fails again is dead-lettered again. A row of dead_letters is\n" +
			"replayed once, even by two replays at once: each claims a row before writing it and marks it\n" +
			"replayed after; a row another replay holds is skipped, and the claim of a replay that died\n" +
			"lapses after 2 minutes, when the next replay takes the row. Try --dry-run first, and replay\n" +
			"only the --reason whose cause you fixed.",
		use: settings.UseReplay,
		flags: []*settings.Var{
			{Flag: "reason", Meta: "REASON",
				Usage: "replay only the dead letters whose reason is REASON (unset: all)",
				Set:   func(_ *settings.Config, v string) error { opts.Reason = v; return nil }},
			{Flag: "dry-run", Default: "false",
				Usage: "print what would be replayed and write nothing",
				Set:   func(_ *settings.Config, v string) error { return envflag.Bool(&opts.DryRun, v) }},
			{Flag: "limit", Meta: "N",
				Usage: "replay at most N dead letters (unset: all)",
				Set:   func(_ *settings.Config, v string) error { return envflag.Limit(&opts.Limit, v) }},
		},
		run: func(ctx context.Context, a *app, cfg *Config, args []string) error {
			return runReplay(ctx, a, cfg, args, opts)
		},
	}
}

// runReplay is `worker replay DLQ_TOPIC`.
func runReplay(ctx context.Context, a *app, cfg *Config, args []string, opts replay.Options) error {
	if len(args) == 0 {
		return errors.New("missing DLQ_TOPIC, the dead-letter topic to replay (see worker replay --help)")
	}
	logger := newLogger(cfg, a.stderr)
	r, err := replay.New(replay.Config{DLQTopic: args[0], DLQSuffix: cfg.DLQSuffix, Options: opts,
		Kafka: kafkaOf(cfg, logger), Postgres: postgres(cfg, logger, ""), Out: a.stdout, Logger: logger})
	if err != nil {
		return err
	}
	logStart(ctx, logger, "replay", cfg)
	return r.Run(ctx)
}
