// Package cli is the worker's command line: it reads the configuration (environment and flags),
// builds the parts (Postgres pool, inbox, handlers, Kafka consumer, HTTP endpoints) and runs them.
//
// Commands: run (consume until SIGTERM/SIGINT), migrate (apply or list migrations), dev (an embedded
// broker plus the worker), demo (dev plus a generated stream and a summary), replay (put dead
// letters back on their original topic), parked (the park, seen and handled by hand) and inspect
// (what the database knows of one idempotency key); each is declared in a file of its own. Every
// setting is one entry of the table of package settings. Each route (topic, inbox name, retention,
// handler) is one row of routes.go, wired in run.go. Configuration errors and unreachable dependencies end the
// process with exit code 1 and one line naming the setting; secrets never reach the output.
//
// cli holds no business logic and no protocol work: the order state machine, SMS sending, the
// inbox and the Kafka runtime live in their own packages, and so do what the commands do beyond
// wiring: waiting for the dependencies (startup), replaying dead letters (replay), reading what the
// database knows of a key (inspect), the demo's scenario (demo), the embedded broker (devbroker),
// the settings and reading them (settings, envflag) and masking secrets (redact).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/tracing"
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
	a := &app{getenv: getenv, stdout: stdout, stderr: stderr, routes: bundledRoutes}
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
	// routes are the binary's routes: bundledRoutes.
	routes []routeRow
}

// A command is one of the worker's subcommands. Each is declared in its own file.
type command struct {
	name    string
	args    string // positional arguments, for --help
	summary string
	details string
	// use is the command's bit: it reads the settings whose use includes it.
	use uint64
	// flags are the command's own flags, flag-only, bound to what its run reads.
	flags []*settings.Var
	// defaults describes the command's own defaults, where they differ from the settings', by env name.
	defaults map[string]string
	// maxArgs is how many positional arguments it takes.
	maxArgs int
	run     func(ctx context.Context, a *app, cfg *Config, args []string) error
}

// commands returns the worker's commands, in the order --help lists them. Each call returns new
// ones: a command's own flags are bound to values of that call.
func commands() []*command {
	return []*command{runCommand(), migrateCommand(), devCommand(), demoCommand(), replayCommand(), parkedCommand(),
		inspectCommand()}
}

// commandNames lists the commands, for errors.
func commandNames() string {
	cmds := commands()
	names := make([]string, len(cmds))
	for i, c := range cmds {
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
				cmd.usage(a.stdout, a.settings())
				return nil
			}
			return fmt.Errorf("unknown command %q (%s)", args[1], commandNames())
		}
		usage(a.stdout, a.settings())
		return nil
	}
	cmd := findCommand(args[0])
	if cmd == nil {
		if strings.HasPrefix(args[0], "-") {
			return fmt.Errorf("flags go after the command: worker CMD %s; see worker --help", args[0])
		}
		return fmt.Errorf("unknown command %q (%s); see worker --help", args[0], commandNames())
	}
	all := a.settings()
	fs := envflag.NewSet(cmd.name, cmd.selected(all))
	positional, err := fs.Parse(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		cmd.usage(a.stdout, all)
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (see worker %s --help)", err, cmd.name)
	}
	if len(positional) > cmd.maxArgs {
		return fmt.Errorf("unexpected argument %q (see worker %s --help)", positional[cmd.maxArgs], cmd.name)
	}
	cfg, err := cmd.resolve(fs, a.getenv, a.routes, all)
	if err != nil {
		return err
	}
	err = cmd.run(ctx, a, cfg, positional)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped by SIGTERM/SIGINT before it was up (waiting for a dependency, say): a clean stop.
		return nil
	}
	return err
}

// resolve resolves the command's settings (see resolve) and, for a command that traces, checks
// OpenTelemetry's OTEL_* variables: one the worker cannot honour is refused as a bad setting is,
// before anything starts.
func (c *command) resolve(fs *envflag.Set[settings.Config], getenv func(string) string, routes []routeRow, all []*settings.Var) (*Config, error) {
	cfg, err := resolve(fs, getenv, routes, all)
	if err != nil {
		return nil, err
	}
	cfg.Use(c.selected(all))
	if c.use&settings.UseTracing != 0 {
		if err := tracing.Check(getenv); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// settings are the binary's settings, its routes' among them.
func (a *app) settings() []*settings.Var { return settingsOf(a.routes) }

// selected returns the command's settings of all, in their order, then its own flags.
func (c *command) selected(all []*settings.Var) []*settings.Var {
	var out []*settings.Var
	for _, s := range all {
		if s.Use&c.use != 0 {
			out = append(out, s)
		}
	}
	return append(out, c.flags...)
}

func usage(w io.Writer, vars []*settings.Var) {
	fmt.Fprint(w, `worker consumes Kafka payment callbacks and SMS events and applies each one exactly once,
recording its idempotency key in a Postgres inbox in the same transaction as its effect.

Usage: worker COMMAND [flags]

Commands:
`)
	all := vars
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		all = append(all[:len(all):len(all)], c.flags...)
	}
	fmt.Fprint(w, `
Every setting is read from its environment variable; the matching flag, given after the
command, wins over it. "worker COMMAND --help" lists the flags a command reads.

Flags:
`)
	envflag.PrintHelp(w, all, nil)
}

func (c *command) usage(w io.Writer, all []*settings.Var) {
	fmt.Fprintf(w, "Usage: worker %s [flags]", c.name)
	if c.args != "" {
		fmt.Fprintf(w, " %s", c.args)
	}
	fmt.Fprintf(w, "\n\n%s\n\nFlags (each wins over its environment variable):\n", c.details)
	envflag.PrintHelp(w, c.selected(all), c.defaults)
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
