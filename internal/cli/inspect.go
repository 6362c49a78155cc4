package cli

import (
	"context"
	"errors"
	"log/slog"

	"github.com/inboxworker/inboxworker/internal/inspect"
	"github.com/inboxworker/inboxworker/internal/settings"
)

// inspectCommand is `worker inspect KEY`: what the database knows of one idempotency key.
func inspectCommand() *command {
	var route string
	return &command{
		name:    "inspect",
		args:    "KEY",
		maxArgs: 1,
		summary: "show everything the database knows of one idempotency key (no broker needed)",
		details: "Prints, for each route that knows KEY (or the one --route names): what became of its\n" +
			"message, its inbox row (when it was recorded, from which topic, partition and offset, until\n" +
			"when it is remembered), what its effect left (payments: the payments row, the anomalies, the\n" +
			"order and the provider transaction's binding; SMS: the notifications row, number masked),\n" +
			"its parked messages with their retry history, its dead letters kept in the table\n" +
			"dead_letters, and its call lease. It reads DATABASE_URL only, in one read-only transaction,\n" +
			"and changes nothing.\n" +
			"\n" +
			"A key that nothing in the database knows ends with exit code 1 and one line saying where it\n" +
			"looked: a key purged after its retention, and a dead letter in a dead-letter topic (see\n" +
			"worker replay DLQ_TOPIC --dry-run), leave no trace in the database.",
		use: settings.UseInspect,
		flags: []*settings.Var{
			{Flag: "route", Meta: "NAME",
				Usage: "look only in the route NAME (payments or sms) or the route of topic NAME (unset: every route)",
				Set:   func(_ *settings.Config, v string) error { route = v; return nil }},
		},
		run: func(ctx context.Context, a *app, cfg *Config, args []string) error {
			if len(args) == 0 {
				return errors.New("missing KEY, the idempotency key to look for (see worker inspect --help)")
			}
			logger := newLogger(cfg, a.stderr)
			logStartAt(ctx, logger, slog.LevelDebug, "inspect", cfg)
			var rs []inspect.Route
			for _, r := range cfg.routes {
				rs = append(rs, inspect.Route{Name: r.Name, Topic: cfg.Topic(r.Name), Kind: r.inspect})
			}
			return inspect.Run(ctx, inspect.Config{Key: args[0], Route: route, Routes: rs, DLQSuffix: cfg.DLQSuffix,
				Postgres: postgres(cfg, logger, ""), Out: a.stdout})
		},
	}
}
