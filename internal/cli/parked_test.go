package cli

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// parkEnv is a migrated schema with messages parked in it, and the environment `worker parked` runs in.
type parkEnv struct {
	t     *testing.T
	db    *pgtest.DB
	store *inbox.Store
	env   map[string]string
}

func setupPark(t *testing.T) *parkEnv {
	t.Helper()
	db := pgtest.Schema(t)
	store, err := inbox.NewStore(db.Pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &parkEnv{t: t, db: db, store: store, env: map[string]string{
		"DATABASE_URL": db.URL, "STARTUP_TIMEOUT": "5s", "LOG_FORMAT": "text",
	}}
}

// park parks a message of topic with ordering key orderKey at offset, due in retryIn, and returns its id.
func (e *parkEnv) park(topic, orderKey string, offset int64, retryIn time.Duration, f func(*inbox.Parked)) int64 {
	e.t.Helper()
	p := inbox.Parked{
		Handler: "payments", Topic: topic, Partition: 1, Offset: offset,
		OrderingKey: []byte(orderKey), MessageKey: []byte(orderKey),
		IdempotencyKey: fmt.Sprintf("evt-%d", offset),
		Value:          []byte(fmt.Sprintf(`{"event_id":"evt-%d","order_no":%q}`, offset, orderKey)),
		Headers:        []inbox.Header{{Key: "Idempotency-Key", Value: []byte(fmt.Sprintf("evt-%d", offset))}},
	}
	if f != nil {
		f(&p)
	}
	ctx := context.Background()
	if _, err := e.store.Park().Add(ctx, p, retryIn); err != nil {
		e.t.Fatal(err)
	}
	var id int64
	if err := e.db.Pool.QueryRow(ctx, `SELECT id FROM inbox_parked WHERE topic = $1 AND "offset" = $2`, topic, offset).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *parkEnv) run(args ...string) result {
	e.t.Helper()
	r := runMain(e.t, e.env, append([]string{"parked"}, args...)...)
	e.t.Logf("worker parked %s: exit %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

func (e *parkEnv) ids() []int64 {
	e.t.Helper()
	list, err := e.store.Park().List(context.Background(), "", 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []int64
	for _, p := range list {
		ids = append(ids, p.ID)
	}
	return ids
}

func TestParkedList(t *testing.T) {
	t.Parallel()
	e := setupPark(t)
	head := e.park("payments.callbacks", "A-1001", 40, 30*time.Second, func(p *inbox.Parked) {
		p.Attempts, p.Reason, p.LastError, p.BudgetSpent = 3, reasonUnknownOrder, "no order A-1001", 70*time.Second
	})
	behind := e.park("payments.callbacks", "A-1001", 41, 0, nil)
	e.park("notifications.sms", "+8613800138000", 7, 0, func(p *inbox.Parked) {
		p.Handler, p.LastError = "sms", "provider answered 503"
	})

	r := e.run("list")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 3 messages and a summary", len(lines))
	}
	for i, want := range []*regexp.Regexp{
		regexp.MustCompile(`^id=\d+ topic=notifications.sms partition=1 offset=7 key=\+86138\*\*\*\*8000 idempotency_key=evt-7 ahead=0 attempts=0 parked=\d+s-ago next=due budget_spent=0s budget_left=5m0s last_error="provider answered 503"$`),
		regexp.MustCompile(fmt.Sprintf(`^id=%d topic=payments.callbacks partition=1 offset=40 key=A-1001 idempotency_key=evt-40 ahead=0 attempts=3 parked=\d+s-ago next=in-(29|30)s budget_spent=1m10s budget_left=3m50s last_error="no order A-1001" reason_if_exhausted=unknown_order$`, head)),
		regexp.MustCompile(fmt.Sprintf(`^id=%d topic=payments.callbacks partition=1 offset=41 key=A-1001 idempotency_key=evt-41 ahead=1 attempts=0 parked=\d+s-ago next=after-1-ahead budget_spent=0s budget_left=5m0s$`, behind)),
		regexp.MustCompile(`^3 parked \(notifications.sms 1, payments.callbacks 2\)$`),
	} {
		if !want.MatchString(lines[i]) {
			t.Errorf("line %d:\n%s\nwant it to match\n%s", i, lines[i], want)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "13800138000") {
		t.Error("a full phone number in the output")
	}

	// The budget left is RETRY_MAX_ELAPSED's, as the worker's: one set lower shows less left, none
	// once spent. A message whose budget ran out is never listed with a reason of its own: what is
	// listed waits, and the reason is what it would get.
	e.env["RETRY_MAX_ELAPSED"] = "1m"
	r = e.run("list", "payments.callbacks")
	if !strings.Contains(r.stdout, "budget_spent=1m10s budget_left=0s last_error=") || strings.Contains(r.stdout, " reason=") {
		t.Errorf("list with RETRY_MAX_ELAPSED=1m:\n%s", r.stdout)
	}
	delete(e.env, "RETRY_MAX_ELAPSED")

	r = e.run("list", "payments.callbacks")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || !strings.HasSuffix(r.stdout, "2 parked (payments.callbacks 2)\n") {
		t.Errorf("list payments.callbacks: exit %d, output %q; want its 2 messages", r.code, r.stdout)
	}
	if r = e.run("list", "other"); r.code != 0 || r.stdout != "0 parked\n" {
		t.Errorf("list other: exit %d, output %q; want 0 parked", r.code, r.stdout)
	}
}

func TestParkedRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupPark(t)
	a := e.park("payments.callbacks", "A", 1, time.Hour, nil)
	e.park("payments.callbacks", "B", 2, time.Hour, nil)
	e.park("notifications.sms", "C", 3, time.Hour, nil)
	due := func() []string {
		t.Helper()
		rows, err := e.db.Pool.Query(ctx, `SELECT idempotency_key FROM inbox_parked WHERE next_attempt_at <= now() ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		return keys
	}

	if r := e.run("retry", fmt.Sprint(a)); r.code != 0 || !strings.HasPrefix(r.stdout, "1 parked messages due now") {
		t.Fatalf("retry %d: exit %d, %q", a, r.code, r.stdout)
	}
	if got := due(); !slices.Equal(got, []string{"evt-1"}) {
		t.Errorf("due %q, want evt-1", got)
	}
	if r := e.run("retry", "all", "payments.callbacks"); r.code != 0 || !strings.HasPrefix(r.stdout, "2 parked messages due now") {
		t.Fatalf("retry all payments.callbacks: exit %d, %q", r.code, r.stdout)
	}
	if got := due(); !slices.Equal(got, []string{"evt-1", "evt-2"}) {
		t.Errorf("due %q, want evt-1 and evt-2", got)
	}
	if r := e.run("retry", "all"); r.code != 0 || !strings.HasPrefix(r.stdout, "3 parked messages due now") {
		t.Fatalf("retry all: exit %d, %q", r.code, r.stdout)
	}
	// An id that is not in the park is an error, said in one line; the others are made due.
	if r := e.run("retry", "99999"); r.code != 1 || r.stdout != "" ||
		!strings.HasSuffix(r.stderr, "worker: parked message 99999: not in the park (applied, dead-lettered, or a wrong id; see worker parked list)\n") {
		t.Errorf("retry 99999: exit %d, stdout %q, stderr %q; want exit 1 and that it is not in the park", r.code, r.stdout, r.stderr)
	}
	if r := e.run("retry", fmt.Sprint(a), "99998", fmt.Sprint(a), "99999"); r.code != 1 || !strings.HasPrefix(r.stdout, "1 parked messages due now") ||
		!strings.HasSuffix(r.stderr, "worker: parked messages 99998, 99999: not in the park (applied, dead-lettered, or wrong ids; see worker parked list); the 1 other was made due now\n") {
		t.Errorf("retry %d 99998 %d 99999: exit %d, stdout %q, stderr %q", a, a, r.code, r.stdout, r.stderr)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "worker: missing what to do: list, retry or dead-letter (see worker parked --help)\n"},
		{[]string{"drop"}, `worker: unknown parked command "drop": use list, retry or dead-letter (see worker parked --help)` + "\n"},
		{[]string{"retry"}, "worker: missing the ids to retry, or all (see worker parked --help)\n"},
		{[]string{"retry", "12", "x"}, `worker: ID: "x" is not the id of a parked message (see worker parked list)` + "\n"},
		{[]string{"dead-letter", "0"}, `worker: ID: "0" is not the id of a parked message (see worker parked list)` + "\n"},
		{[]string{"list", "a", "b"}, `worker: unexpected argument "b": list takes at most a topic (see worker parked --help)` + "\n"},
	} {
		r := e.run(c.args...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, c.want) && !strings.Contains(r.stderr, c.want) {
			t.Errorf("parked %q: exit %d, stderr %q; want 1 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

func TestParkedDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := kafkatest.Start(t, 2, "payments.callbacks", "payments.callbacks.dlq")
	e := setupPark(t)
	e.env["KAFKA_BROKERS"] = cluster.Addr
	head := e.park("payments.callbacks", "A-1", 40, time.Hour, func(p *inbox.Parked) {
		p.Attempts, p.Reason, p.LastError = 5, reasonUnknownOrder, "no order A-1"
	})
	behind := e.park("payments.callbacks", "A-1", 41, 0, nil)

	// A worker is retrying the head: the operator is refused, and nothing is written.
	taken, err := e.store.Park().TakeDue(ctx, "payments.callbacks", 1, "worker", time.Hour, 10)
	if err != nil || len(taken) != 0 {
		t.Fatalf("TakeDue = %d, %v; want nothing due", len(taken), err)
	}
	if _, err := e.db.Pool.Exec(ctx, `UPDATE inbox_parked SET held_by = 'worker', held_until = now() + interval '1 hour' WHERE id = $1`, head); err != nil {
		t.Fatal(err)
	}
	if r := e.run("dead-letter", fmt.Sprint(head)); r.code != 1 || !strings.Contains(r.stderr, "the worker is retrying it right now") {
		t.Errorf("dead-letter of a claimed message: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := e.db.Pool.Exec(ctx, `UPDATE inbox_parked SET held_by = NULL, held_until = NULL`); err != nil {
		t.Fatal(err)
	}

	r := e.run("dead-letter", fmt.Sprint(head))
	if r.code != 0 || !strings.HasPrefix(r.stdout, fmt.Sprintf("dead-lettered id=%d topic=payments.callbacks partition=1 offset=40 idempotency_key=evt-40 to=payments.callbacks.dlq", head)) {
		t.Fatalf("dead-letter: exit %d, %q", r.code, r.stdout)
	}
	if got := e.ids(); !slices.Equal(got, []int64{behind}) {
		t.Errorf("parked %v, want only the message behind, %d", got, behind)
	}
	letters := append(cluster.ReadAll(t, "payments.callbacks.dlq", 0), cluster.ReadAll(t, "payments.callbacks.dlq", 1)...)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	m := letters[0]
	headers := map[string]string{}
	for _, h := range m.Headers {
		headers[h.Key] = string(h.Value)
	}
	want := map[string]string{
		"Idempotency-Key": "evt-40", "dlq-reason": "unknown_order",
		"dlq-error":          "dead-lettered by an operator from the park: no order A-1",
		"dlq-original-topic": "payments.callbacks", "dlq-original-partition": "1", "dlq-original-offset": "40",
		"dlq-attempts": "5",
	}
	for k, v := range want {
		if headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, headers[k], v)
		}
	}
	if at, err := time.Parse(time.RFC3339, headers["dlq-failed-at"]); err != nil || time.Since(at) > time.Minute {
		t.Errorf("dlq-failed-at %q, %v", headers["dlq-failed-at"], err)
	}
	if string(m.Key) != "A-1" || string(m.Value) != `{"event_id":"evt-40","order_no":"A-1"}` {
		t.Errorf("dead letter key %q value %q, want the original's", m.Key, m.Value)
	}
	// The key's next message is now its head, due.
	taken, err = e.store.Park().TakeDue(ctx, "payments.callbacks", 1, "worker", time.Hour, 10)
	if err != nil || len(taken) != 1 || taken[0].ID != behind {
		t.Errorf("TakeDue after = %+v, %v; want the message behind", taken, err)
	}

	if r := e.run("dead-letter", fmt.Sprint(head)); r.code != 1 || !strings.Contains(r.stderr, "not in the park") {
		t.Errorf("dead-letter again: exit %d, stderr %q; want not in the park", r.code, r.stderr)
	}
	if n := len(cluster.ReadAll(t, "payments.callbacks.dlq", 0)) + len(cluster.ReadAll(t, "payments.callbacks.dlq", 1)); n != 1 {
		t.Errorf("%d dead letters after a refused second try, want still 1", n)
	}
}
