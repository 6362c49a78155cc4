package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

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
			"Nothing is deleted: Kafka topics are append-only. Each dead letter is replayed once, even by\n" +
			"two replays at once: each claims a letter before writing it and marks it replayed after (in\n" +
			"the tables dead_letter_replays and dead_letters); a letter replayed before is skipped and\n" +
			"counted (--again replays it anyway), one another replay holds is skipped, and the claim of\n" +
			"a replay that died lapses after 2 minutes, when the next replay takes the letter. A message\n" +
			"that fails again is dead-lettered again: a new dead letter. Try --dry-run first, and replay\n" +
			"only the --reason whose cause you fixed, --since it was fixed.",
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
			{Flag: "again", Default: "false",
				Usage: "replay the dead letters of the topic replayed before too",
				Set:   func(_ *settings.Config, v string) error { return envflag.Bool(&opts.Again, v) }},
			{Flag: "since", Meta: "TIME",
				Usage: "replay only the dead letters that failed at or after TIME: RFC 3339 (2026-12-05T08:00:00Z), or a duration ago (2h) (unset: all)",
				Set:   func(_ *settings.Config, v string) error { return parseSince(&opts.Since, v, time.Now()) }},
			{Flag: "from-offset", Meta: "N",
				Usage: "replay only the topic's dead letters from offset N of each partition on (unset: all)",
				Set:   func(_ *settings.Config, v string) error { return parseOffset(&opts.FromOffset, v) }},
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
	logStartAt(ctx, logger, slog.LevelDebug, "replay", cfg)
	return r.Run(ctx)
}

// parseSince sets since to v: an RFC 3339 time, or a duration before now (at most 10 years); ""
// leaves it unset.
func parseSince(since *time.Time, v string, now time.Time) error {
	if v == "" {
		return nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		if t.After(now) {
			return fmt.Errorf("%s is in the future", v)
		}
		*since = t
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > 10*365*24*time.Hour {
		return fmt.Errorf("want an RFC 3339 time (2026-12-05T08:00:00Z) or a duration ago from 1ns to 10 years (2h), not %q", v)
	}
	*since = now.Add(-d)
	return nil
}

// parseOffset sets offset to v, an offset of a partition: 0 or more; "" leaves it unset.
func parseOffset(offset *int64, v string) error {
	if v == "" {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("want an offset, 0 or more, not %q", v)
	}
	*offset = n
	return nil
}
