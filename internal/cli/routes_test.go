package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// audit is a third route, as a team would add one: a package with its handler, and a row.
var audit = routeRow{Route: settings.Route{Name: "audit", Topic: "audit.events", What: "audit event",
	Concurrency: 2, MaxConcurrency: 8, ConcurrencyHelp: "most audit transactions at once"},
	handler: func(*Config, routeDeps) (inboxworker.Route, error) {
		return inboxworker.Route{Handler: inboxworker.HandlerFunc(
			func(context.Context, pgx.Tx, inboxworker.Delivery) error { return nil })}, nil
	}}

// TestThirdRoute: a route is one row. Adding one gives the binary its topic, retention and
// concurrency settings — in --help, resolved, bounded, checked against the other topics — and its
// topic among those the worker consumes, checks at start and creates in worker dev.
func TestThirdRoute(t *testing.T) {
	t.Parallel()
	routes := append(slices.Clone(bundledRoutes), audit)
	var help bytes.Buffer
	a := &app{getenv: func(string) string { return "" }, stdout: &help, stderr: io.Discard, routes: routes}
	if err := a.main(context.Background(), []string{"run", "--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("worker run --help: %v", err)
	}
	for _, want := range []string{
		`--topic-audit TOPIC  (env TOPIC_AUDIT, default "audit.events")`,
		`--inbox-retention-audit DURATION  (env INBOX_RETENTION_AUDIT, default unset, from 1h to 87600h)`,
		`--audit-concurrency N  (env AUDIT_CONCURRENCY, default "2", from 1 to 8)`,
	} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("worker run --help lacks %s:\n%s", want, help.String())
		}
	}

	resolveWith := func(env map[string]string) (*Config, error) {
		all := settingsOf(routes)
		fs := envflag.NewSet("run", findCommand("run").selected(all))
		if _, err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		return resolve(fs, func(k string) string { return env[k] }, routes, all)
	}
	cfg, err := resolveWith(map[string]string{"TOPIC_AUDIT": "audit.v2", "AUDIT_CONCURRENCY": "3"})
	if err != nil {
		t.Fatal(err)
	}
	if got := *cfg.Route("audit"); got != (settings.RouteSettings{Topic: "audit.v2", Concurrency: 3}) {
		t.Errorf("the audit route's settings %+v", got)
	}
	if got := cfg.Topics(); !slices.Equal(got, []string{"payments.callbacks", "notifications.sms", "audit.v2"}) {
		t.Errorf("topics %q, want the audit route's after the bundled ones", got)
	}
	built, err := cfg.workerRoutes(routeDeps{logger: testlog.New(t)})
	if err != nil || len(built) != 3 || built[2].Name != "audit" || built[2].Topic != "audit.v2" ||
		built[2].Concurrency != 3 || built[2].Handler == nil {
		t.Errorf("worker routes %+v, %v; want the audit route third, with its handler and settings", built, err)
	}

	for env, want := range map[string]string{
		"AUDIT_CONCURRENCY": `AUDIT_CONCURRENCY: must be from 1 to 8, got "9"`,
		"TOPIC_AUDIT":       `TOPIC_AUDIT: must differ from TOPIC_SMS (both are "notifications.sms")`,
	} {
		value := map[string]string{"AUDIT_CONCURRENCY": "9", "TOPIC_AUDIT": "notifications.sms"}[env]
		if _, err := resolveWith(map[string]string{env: value}); err == nil || err.Error() != want {
			t.Errorf("%s=%s: %v, want %q", env, value, err, want)
		}
	}
}
