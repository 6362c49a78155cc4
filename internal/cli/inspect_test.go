package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestInspect runs `worker inspect` against a migrated schema, without a broker: a known key's
// report on stdout with exit code 0 (in the route --route names, by name or by topic, and in no
// other), an unknown key's one line on stderr with exit code 1, and the command in worker --help.
func TestInspect(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ('sms', 'evt-1', '\x00', 'sms.in', 0, 5, now() + interval '1 hour');
		INSERT INTO notifications (idempotency_key, recipient, template, status, attempts)
		VALUES ('evt-1', '+8613800138000', 'verify_code', 'SENT', 1)`)
	if err != nil {
		t.Fatal(err)
	}
	// The routes' topics come from the settings, as the worker's do; no broker is reachable.
	env := map[string]string{"DATABASE_URL": db.URL, "STARTUP_TIMEOUT": "5s", "LOG_FORMAT": "text",
		"TOPIC_SMS": "sms.in", "KAFKA_BROKERS": "127.0.0.1:1"}

	for _, args := range [][]string{{"evt-1"}, {"--route", "sms", "evt-1"}, {"--route=sms.in", "evt-1"}} {
		r := runMain(t, env, append([]string{"inspect"}, args...)...)
		t.Logf("worker inspect %v: exit %d\nstdout:\n%sstderr:\n%s", args, r.code, r.stdout, r.stderr)
		if r.code != 0 || !strings.Contains(r.stdout, "\nroute sms, topic sms.in\n") ||
			!strings.Contains(r.stdout, "SENT to +86138****8000") || strings.Contains(r.stdout, "13800138000") {
			t.Errorf("worker inspect %v: exit %d, stdout %q; want 0 and the SMS's report, its number masked", args, r.code, r.stdout)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"evt-2"}, `worker: unknown idempotency key evt-2: no inbox row, parked message, stored dead letter, lease or effect of it in payments (payments.callbacks), sms (sms.in)`},
		{[]string{"--route", "payments", "evt-1"}, `worker: unknown idempotency key evt-1: no inbox row, parked message, stored dead letter, lease or effect of it in payments (payments.callbacks) `},
		{[]string{"--route", "mail", "evt-1"}, `worker: --route: no route "mail" (routes: payments (payments.callbacks), sms (sms.in), payment_events (payments.events))`},
		{nil, `worker: missing KEY, the idempotency key to look for (see worker inspect --help)`},
		{[]string{"a", "b"}, `worker: unexpected argument "b" (see worker inspect --help)`},
	} {
		r := runMain(t, env, append([]string{"inspect"}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if last := lines[len(lines)-1]; r.code != 1 || r.stdout != "" || !strings.HasPrefix(last, tc.want) {
			t.Errorf("worker inspect %v: exit %d, stdout %q, last line of stderr %q; want exit 1, nothing on stdout and %q",
				tc.args, r.code, r.stdout, last, tc.want)
		}
	}

	r := runMain(t, nil, "--help")
	if !strings.Contains(r.stdout, "\n  inspect  show everything the database knows of one idempotency key") {
		t.Errorf("worker --help does not list inspect:\n%s", r.stdout)
	}
	r = runMain(t, nil, "inspect", "--help")
	for _, want := range []string{"Usage: worker inspect [flags] KEY", "--route NAME", "DATABASE_URL", "exit code 1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("worker inspect --help has no %q:\n%s", want, r.stdout)
		}
	}
}
