package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/migrations"
)

func migrateCommand() *command {
	return &command{
		name:    "migrate",
		args:    "[status]",
		maxArgs: 1,
		summary: "apply pending migrations and exit; `migrate status` lists them",
		details: "Applies pending migrations to DATABASE_URL and exits. With `status`, lists every\n" +
			"migration and whether it has been applied, and changes nothing.",
		use: settings.UseMigrate,
		run: migrate,
	}
}

// migrate is `worker migrate [status]`.
func migrate(ctx context.Context, a *app, cfg *Config, args []string) error {
	if len(args) == 1 && args[0] != "status" {
		return fmt.Errorf("unknown migrate subcommand %q (want: worker migrate, or worker migrate status)", args[0])
	}
	logger := newLogger(cfg, a.stderr)
	pool, err := startup.OpenPostgres(ctx, postgres(cfg, logger, ""))
	if err != nil {
		return err
	}
	defer pool.Close()

	if len(args) == 1 {
		list, err := migrations.List(ctx, pool)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "VERSION\tMIGRATION\tSTATE")
		for _, m := range list {
			state := "pending"
			if m.Applied {
				state = "applied"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\n", m.Version, m.Name, state)
		}
		return w.Flush()
	}

	applied, err := migrations.Up(ctx, pool, logger)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(a.stdout, "no pending migrations")
		return nil
	}
	fmt.Fprintf(a.stdout, "applied %d migration(s)\n", len(applied))
	return nil
}
