package settings_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/settings"
)

// audit is an optional route of a binary of its own.
var audit = settings.Route{Name: "audit", Topic: "audit.events", What: "audit event", Concurrency: 2,
	MaxConcurrency: 8, ConcurrencyHelp: "most audit transactions at once", Optional: true}

// resolve resolves the settings of a binary with the audit route, from env and args.
func resolve(t *testing.T, env map[string]string, extra func(*settings.Config, settings.Fail) error, args ...string) (*settings.Config, error) {
	t.Helper()
	all := settings.All([]settings.Route{audit})
	fs := envflag.NewSet("run", all)
	if _, err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return settings.Resolve(fs, func(k string) string { return env[k] }, []settings.Route{audit}, all, extra)
}

// TestResolve: a route's settings come from its row; an optional route is consumed only when its
// topic is given (or Receipts); the binary's own check names a setting as it was given.
func TestResolve(t *testing.T) {
	t.Parallel()
	cfg, err := resolve(t, map[string]string{"AUDIT_CONCURRENCY": "3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Route("audit"); r.Topic != "audit.events" || r.Concurrency != 3 {
		t.Errorf("the audit route's settings %+v, want its default topic and concurrency 3", *r)
	}
	if cfg.Consumes(audit) || len(cfg.Topics()) != 0 {
		t.Errorf("an optional route whose topic was not given is consumed: %q", cfg.Topics())
	}
	cfg.Receipts = true
	if !cfg.Consumes(audit) {
		t.Error("an optional route is not consumed with Receipts")
	}

	refuse := func(_ *settings.Config, fail settings.Fail) error { return fail("TOPIC_AUDIT", "is refused") }
	_, err = resolve(t, nil, refuse, "--topic-audit", "audit.v2")
	var se *settings.Error
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "--topic-audit") || !strings.Contains(err.Error(), "is refused") {
		t.Errorf("the check's error %v, want it about --topic-audit, as given", err)
	}
	if _, err := resolve(t, map[string]string{"AUDIT_CONCURRENCY": "9"}, nil); err == nil {
		t.Error("AUDIT_CONCURRENCY=9 accepted over its bound of 8")
	}
}
