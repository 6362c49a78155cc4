// Package cli is the worker's command line: it reads the configuration (environment and flags),
// builds the parts (Postgres pool, inbox, handlers, Kafka consumer, HTTP endpoints) and runs them.
//
// Commands: run (consume until SIGTERM/SIGINT), migrate (apply or list migrations), dev (an embedded
// broker plus the worker), demo (dev plus a generated stream and a summary) and replay (put dead
// letters back on their original topic). Configuration errors
// and unreachable dependencies end the process with exit code 1 and one line naming the setting;
// secrets never reach the output. cli holds no business logic: the order state machine, SMS sending,
// the inbox and the Kafka runtime live in their own packages.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/inboxworker/inboxworker/internal/deadletter"
)

// Main runs the command in args (os.Args[1:]) with the environment read through getenv, and returns
// the process's exit code: 0 on success, 1 on any error, reported as one line on stderr. ctx is
// cancelled on SIGTERM/SIGINT.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "worker: internal error: %s\n", oneLine(fmt.Sprint(r)))
			code = 1
		}
	}()
	a := &app{getenv: getenv, stdout: stdout, stderr: stderr}
	err := a.main(ctx, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "worker: %s\n", oneLine(err.Error()))
	return 1
}

// app is what every command shares: the process's environment and outputs. Logs go to stderr;
// what a person asked for (help, the dev broker's address, the demo's summary) goes to stdout.
type app struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

// A command is one of the worker's subcommands.
type command struct {
	name    string
	args    string // positional arguments, for --help
	summary string
	details string
	// settings are the env names (or, for flag-only settings, flag names) the command reads.
	settings []string
	// defaults describes the command's own defaults, where they differ from the settings', by env name.
	defaults map[string]string
	// maxArgs is how many positional arguments it takes.
	maxArgs int
	run     func(ctx context.Context, a *app, cfg *Config, args []string) error
}

var (
	kafkaSettings = []string{"KAFKA_BROKERS", "KAFKA_GROUP_ID", "KAFKA_SESSION_TIMEOUT",
		"KAFKA_SASL_MECHANISM", "KAFKA_USERNAME", "KAFKA_PASSWORD", "KAFKA_TLS"}
	databaseSettings = []string{"DATABASE_URL", "STARTUP_TIMEOUT"}
	workerSettings   = []string{"TOPIC_PAYMENTS", "TOPIC_SMS", "DLQ_SUFFIX",
		"SMS_PROVIDER_URL", "SMS_PROVIDER_TOKEN",
		"RETRY_INITIAL_INTERVAL", "RETRY_MAX_INTERVAL", "RETRY_MAX_ELAPSED", "RETRY_PARK_AFTER",
		"INBOX_RETENTION_PAYMENTS", "INBOX_RETENTION_SMS", "BATCH_SIZE", "BATCH_WAIT",
		"ORDERING", "MAX_IN_FLIGHT", "PAYMENTS_CONCURRENCY", "SMS_CONCURRENCY", "SHUTDOWN_TIMEOUT"}
	logSettings = []string{"LOG_LEVEL", "LOG_FORMAT"}
)

func join(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

var commands = []*command{
	{
		name:    "run",
		summary: "apply pending migrations, then consume until SIGTERM/SIGINT",
		details: "Applies pending migrations (unless --no-migrate), joins the consumer group and consumes\n" +
			"until SIGTERM or SIGINT, then stops fetching, lets in-flight messages finish within\n" +
			"SHUTDOWN_TIMEOUT, commits their offsets and exits 0. Serves /healthz, /readyz and /metrics\n" +
			"on HTTP_ADDR and purges expired idempotency keys in the background.",
		settings: join(kafkaSettings, databaseSettings, workerSettings, []string{"HTTP_ADDR"},
			logSettings, []string{"no-migrate"}),
		run: runCommand,
	},
	{
		name:    "migrate",
		args:    "[status]",
		maxArgs: 1,
		summary: "apply pending migrations and exit; `migrate status` lists them",
		details: "Applies pending migrations to DATABASE_URL and exits. With `status`, lists every\n" +
			"migration and whether it has been applied, and changes nothing.",
		settings: join(databaseSettings, logSettings),
		run:      migrateCommand,
	},
	{
		name:    "dev",
		summary: "run the worker against an embedded Kafka broker",
		details: "Starts an embedded Kafka broker (the real wire protocol, in memory) on DEV_KAFKA_ADDR with\n" +
			"the topics and their dead-letter topics created, prints how to produce to it, then runs the\n" +
			"worker against it until stopped. SMS are only logged unless SMS_PROVIDER_URL is set.",
		defaults: map[string]string{"LOG_FORMAT": "text"},
		settings: join([]string{"DEV_KAFKA_ADDR", "KAFKA_GROUP_ID", "KAFKA_SESSION_TIMEOUT"},
			databaseSettings, workerSettings, []string{"HTTP_ADDR"}, logSettings),
		run: devCommand,
	},
	{
		name:    "demo",
		summary: "dev plus a generated stream of messages; prints a summary and exits",
		details: "Runs the worker against an embedded broker and a generated stream of payment callbacks\n" +
			"and SMS events with redeliveries, retries and bad messages, then prints a summary read\n" +
			"from the database and the dead-letter topics. Its orders and tables live in the schema\n" +
			demoSchema + " of DATABASE_URL, recreated on every run: no other data is touched.\n" +
			"The broker listens on DEV_KAFKA_ADDR when it is set, else on any free local port.",
		defaults: map[string]string{"DEV_KAFKA_ADDR": "any free local port", "LOG_FORMAT": "text"},
		settings: join([]string{"DEV_KAFKA_ADDR", "KAFKA_GROUP_ID"}, databaseSettings,
			[]string{"TOPIC_PAYMENTS", "TOPIC_SMS", "DLQ_SUFFIX", "SMS_PROVIDER_URL", "SMS_PROVIDER_TOKEN"},
			logSettings),
		run: demoCommand,
	},
	{
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
			"twice (a row of dead_letters is marked replayed, and replayed once). The inbox makes that\n" +
			"harmless for a message that was applied (its key is skipped as a duplicate); a message that\n" +
			"fails again is dead-lettered again. Try --dry-run first, and replay only the --reason whose\n" +
			"cause you fixed.",
		settings: join([]string{"KAFKA_BROKERS", "KAFKA_SASL_MECHANISM", "KAFKA_USERNAME", "KAFKA_PASSWORD",
			"KAFKA_TLS", "DLQ_SUFFIX"}, databaseSettings, logSettings, []string{"reason", "dry-run", "limit"}),
		run: replayCommand,
	},
	parkedCommand,
}

// commandNames lists the commands, for errors.
func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

func (a *app) main(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no command given (%s); see worker --help", commandNames())
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && args[0] == "help" {
			if cmd := findCommand(args[1]); cmd != nil {
				cmd.usage(a.stdout)
				return nil
			}
			return fmt.Errorf("unknown command %q (%s)", args[1], commandNames())
		}
		usage(a.stdout)
		return nil
	}
	cmd := findCommand(args[0])
	if cmd == nil {
		if strings.HasPrefix(args[0], "-") {
			return fmt.Errorf("flags go after the command: worker CMD %s; see worker --help", args[0])
		}
		return fmt.Errorf("unknown command %q (%s); see worker --help", args[0], commandNames())
	}
	cf := newConfigFlags(cmd.name, cmd.selected())
	positional, err := cf.parse(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		cmd.usage(a.stdout)
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (see worker %s --help)", err, cmd.name)
	}
	if len(positional) > cmd.maxArgs {
		return fmt.Errorf("unexpected argument %q (see worker %s --help)", positional[cmd.maxArgs], cmd.name)
	}
	cfg, err := cf.config(a.getenv)
	if err != nil {
		return err
	}
	cfg.used = cmd.selected()
	err = cmd.run(ctx, a, cfg, positional)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped by SIGTERM/SIGINT before it was up (waiting for a dependency, say): a clean stop.
		return nil
	}
	return err
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// selected returns the command's settings in the order of the settings table.
func (c *command) selected() []*setting {
	want := map[string]bool{}
	for _, n := range c.settings {
		want[n] = true
	}
	var out []*setting
	for _, s := range settings {
		if want[s.env] || (s.envless && want[s.flag]) {
			out = append(out, s)
		}
	}
	return out
}

func usage(w io.Writer) {
	fmt.Fprint(w, `worker consumes Kafka payment callbacks and SMS events and applies each one exactly once,
recording its idempotency key in a Postgres inbox in the same transaction as its effect.

Usage: worker COMMAND [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every setting is read from its environment variable; the matching flag, given after the
command, wins over it. "worker COMMAND --help" lists the flags a command reads.

Flags:
`)
	printFlags(w, settings, nil)
}

func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: worker %s [flags]", c.name)
	if c.args != "" {
		fmt.Fprintf(w, " %s", c.args)
	}
	fmt.Fprintf(w, "\n\n%s\n\nFlags (each wins over its environment variable):\n", c.details)
	printFlags(w, c.selected(), c.defaults)
}

func printFlags(w io.Writer, ss []*setting, defaults map[string]string) {
	for _, s := range ss {
		head := "  --" + s.flag
		if !s.boolean() {
			head += " " + s.meta
		}
		var notes []string
		if !s.envless {
			notes = append(notes, "env "+s.env)
		}
		if d, ok := defaults[s.env]; ok {
			notes = append(notes, "default "+d)
		} else if s.def != "" {
			notes = append(notes, fmt.Sprintf("default %q", s.def))
		} else {
			notes = append(notes, "default unset")
		}
		fmt.Fprintf(w, "%s  (%s)\n        %s\n", head, strings.Join(notes, ", "), s.usage)
	}
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
