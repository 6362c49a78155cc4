package notify_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testEvent is the SMS event every handler test sends.
var testEvent = []byte(`{"event_id":"e","phone":"+8613800138000","template":"verify_code","params":{"code":"123456"}}`)

// env is a migrated schema, an inbox, a fake provider and a handler sending to it with testToken.
type env struct {
	pool     *pgxpool.Pool
	store    *inbox.Store
	provider *notifytest.Provider
	handler  *notify.Handler
	logger   *slog.Logger
	logs     *logBuffer
}

func setup(t *testing.T) *env {
	t.Helper()
	db := pgtest.Schema(t)
	store, err := inbox.NewStore(db.Pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{pool: db.Pool, store: store, provider: notifytest.NewProvider(t), logs: newLogBuffer(t)}
	e.provider.RequireToken(testToken)
	e.logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: e.provider.URL, Token: testToken, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.handler = e.newHandler(t, sender)
	return e
}

func (e *env) newHandler(t *testing.T, sender notify.Sender) *notify.Handler {
	t.Helper()
	h, err := notify.NewHandler(notify.Config{Sender: sender, Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The consumer runs a Handler as a CallHandler: the send outside any transaction.
var _ inboxworker.CallHandler = (*notify.Handler)(nil)

// callOf is d through h in the three steps of a call, as the consumer runs it.
func callOf(h *notify.Handler, d inbox.Delivery) inbox.Call {
	return inbox.Call{
		Lease: 15 * time.Second,
		Check: func(ctx context.Context, tx pgx.Tx) error { return h.Check(ctx, tx, d) },
		Run: func(ctx context.Context, attempt int) (inbox.Effect, error) {
			d.Attempt = attempt
			return h.Call(ctx, d)
		},
	}
}

// process runs one delivery of value under key through the inbox and h, as the consumer does, and
// logs a failure as the consumer would.
func (e *env) process(t *testing.T, h *notify.Handler, key string, value []byte, attempt int) (inbox.Outcome, error) {
	t.Helper()
	msg := inbox.Message{Handler: "sms", Key: key, Fingerprint: inbox.Fingerprint(value), Topic: "notifications.sms"}
	outcome, err := e.store.ProcessCall(context.Background(), msg, callOf(h, inbox.Delivery{Key: key, Value: value, Attempt: attempt}))
	if err != nil {
		kind, reason, _ := fault.Classify(err)
		e.logger.Error("message failed", slog.String("key", key), slog.String("kind", kind.String()),
			slog.String("reason", string(reason)), slog.Any("error", err))
	}
	return outcome, err
}

type notification struct {
	recipient, template, status string
	providerMessageID           *string
	attempts                    int
}

// recorded returns key's notifications row and whether its inbox row exists; nil if there is no
// notifications row.
func (e *env) recorded(t *testing.T, key string) (*notification, bool) {
	t.Helper()
	ctx := context.Background()
	var inInbox bool
	if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox WHERE idempotency_key = $1)`,
		key).Scan(&inInbox); err != nil {
		t.Fatal(err)
	}
	var n notification
	err := e.pool.QueryRow(ctx, `SELECT recipient, template, status, provider_message_id, attempts
		FROM notifications WHERE idempotency_key = $1`, key).
		Scan(&n.recipient, &n.template, &n.status, &n.providerMessageID, &n.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, inInbox
	}
	if err != nil {
		t.Fatal(err)
	}
	return &n, inInbox
}

// checkSent fails unless key's SMS was recorded as sent on attempt with the provider's message id.
func (e *env) checkSent(t *testing.T, key string, attempt int) {
	t.Helper()
	n, inInbox := e.recorded(t, key)
	want := e.provider.MessageID(key)
	if n == nil || !inInbox || want == "" {
		t.Fatalf("key %s: notification %+v, inbox row %v, provider id %q; want all three", key, n, inInbox, want)
	}
	if n.recipient != testPhone || n.template != "verify_code" || n.status != "SENT" ||
		n.providerMessageID == nil || *n.providerMessageID != want || n.attempts != attempt {
		t.Fatalf("key %s: notification %+v (id %v), want %s verify_code SENT %s attempts %d", key, n,
			n.providerMessageID, testPhone, want, attempt)
	}
}

// checkNothingRecorded fails if key left a notifications or an inbox row, or a lease.
func (e *env) checkNothingRecorded(t *testing.T, key string) {
	t.Helper()
	if n, inInbox := e.recorded(t, key); n != nil || inInbox {
		t.Fatalf("key %s: notification %+v, inbox row %v; want neither", key, n, inInbox)
	}
	if leased := e.leased(t, key); leased {
		t.Fatalf("key %s: a live lease is left", key)
	}
}

// leased reports whether key has a live lease.
func (e *env) leased(t *testing.T, key string) bool {
	t.Helper()
	var leased bool
	if err := e.pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM inbox_leases WHERE idempotency_key = $1 AND expires_at > now())`,
		key).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	return leased
}

// anotherWorkersLease writes the lease a worker sending key would hold, expiring in expiresIn.
func (e *env) anotherWorkersLease(t *testing.T, key string, expiresIn time.Duration) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO inbox_leases (handler, idempotency_key, holder, expires_at, attempts)
		VALUES ('sms', $1, 'another-worker', now() + $2 * interval '1 microsecond', 1)`,
		key, expiresIn.Microseconds()); err != nil {
		t.Fatal(err)
	}
}

// logBuffer captures the log lines of a test, sends them on to t.Log and checks, when the test ends,
// that they hold no secret.
type logBuffer struct {
	t  *testing.T
	mu sync.Mutex
	b  bytes.Buffer
}

func newLogBuffer(t *testing.T) *logBuffer {
	l := &logBuffer{t: t}
	t.Cleanup(func() {
		logs := l.String()
		if logs == "" {
			t.Error("nothing was logged")
		}
		checkNoSecrets(t, "logs", logs)
	})
	return l
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestHandleSends(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if outcome, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
		t.Fatalf("Process = %q, %v; want applied", outcome, err)
	}
	e.checkSent(t, "k1", 1)
	d := e.provider.Delivered()
	if len(d) != 1 || d[0].Key != "k1" || d[0].Reference != "k1" || d[0].To != testPhone ||
		d[0].Template != "verify_code" || d[0].Params["code"] != "123456" || d[0].Authorization != "Bearer "+testToken {
		t.Fatalf("provider delivered %+v, want one verify_code to %s under k1 with the token", d, testPhone)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "+86138****8000") || !strings.Contains(logs, "k1") {
		t.Fatalf("logs do not name the masked number and the key:\n%s", logs)
	}
}

func TestHandleRetriesAfterProviderError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.provider.SetHook(func(r notifytest.Request) notifytest.Reply {
		if r.Call == 1 {
			return notifytest.Reply{Status: http.StatusServiceUnavailable, RetryAfter: "1", Body: `{"error":"busy"}`}
		}
		return notifytest.Reply{}
	})

	_, err := e.process(t, e.handler, "k1", testEvent, 1)
	if kind, _, retryAfter := fault.Classify(err); kind != fault.KindRetryable || retryAfter != time.Second {
		t.Fatalf("first delivery: error %v classified %v after %v, want retryable after 1s", err, kind, retryAfter)
	}
	e.checkNothingRecorded(t, "k1")

	// The consumer retries the message after its backoff, outside any transaction.
	if outcome, err := e.process(t, e.handler, "k1", testEvent, 2); err != nil || outcome != inbox.Applied {
		t.Fatalf("retry: Process = %q, %v; want applied", outcome, err)
	}
	e.checkSent(t, "k1", 2)
	if calls, delivered := e.provider.Calls("k1"), len(e.provider.Delivered()); calls != 2 || delivered != 1 {
		t.Fatalf("provider: %d calls, %d deliveries; want 2 and 1", calls, delivered)
	}
}

func TestHandleFailures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	timeoutSender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: e.provider.URL, Token: testToken,
		Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	longAnswer := `{"error":"template verify_code is not approved for +8613800138000 ` + strings.Repeat("x", 300) + `"}`
	for _, tt := range []struct {
		name       string
		value      []byte
		reply      notifytest.Reply
		sender     notify.Sender
		wantKind   fault.Kind
		wantReason inboxtype.Reason
		wantError  string
		wantCalls  int
	}{
		{name: "Rejected", reply: notifytest.Reply{Status: 400, Body: longAnswer},
			wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected, wantCalls: 1,
			wantError: `sms provider: 400 Bad Request: {"error":"template verify_code is not approved for +86138****8000 xxx`},
		{name: "Forbidden", reply: notifytest.Reply{Status: 403}, wantKind: fault.KindPermanent,
			wantReason: notify.ProviderRejected, wantCalls: 1, wantError: "403 Forbidden"},
		{name: "RequestTimeout", reply: notifytest.Reply{Status: 408}, wantKind: fault.KindRetryable,
			wantReason: inboxtype.RetriesExhausted, wantCalls: 1},
		{name: "TooManyRequests", reply: notifytest.Reply{Status: 429, RetryAfter: "3"}, wantKind: fault.KindRetryable,
			wantReason: inboxtype.RetriesExhausted, wantCalls: 1},
		{name: "InternalServerError", reply: notifytest.Reply{Status: 500}, wantKind: fault.KindRetryable,
			wantReason: inboxtype.RetriesExhausted, wantCalls: 1},
		{name: "Timeout", reply: notifytest.Reply{Delay: time.Minute}, sender: timeoutSender,
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted, wantCalls: 1, wantError: "no answer within"},
		{name: "InvalidPayload", value: []byte(`{"phone":"8613800138000","template":"t"}`),
			wantKind: fault.KindPermanent, wantReason: inboxtype.InvalidPayload, wantError: "phone"},
		{name: "TokenRefused", sender: must(notify.NewHTTPSender(notify.HTTPConfig{URL: e.provider.URL, Token: "wrong"})),
			wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected, wantCalls: 0, wantError: "401"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "k-" + tt.name
			e.provider.SetHook(func(notifytest.Request) notifytest.Reply { return tt.reply })
			h := e.handler
			if tt.sender != nil {
				h = e.newHandler(t, tt.sender)
			}
			value := testEvent
			if tt.value != nil {
				value = tt.value
			}
			_, err := e.process(t, h, key, value, 1)
			if kind, reason, _ := fault.Classify(err); kind != tt.wantKind || reason != tt.wantReason {
				t.Fatalf("error %v classified %v %q, want %v %q", err, kind, reason, tt.wantKind, tt.wantReason)
			}
			if !strings.Contains(err.Error(), tt.wantError) {
				t.Fatalf("error %q does not contain %q", err, tt.wantError)
			}
			checkNoSecrets(t, "error", err.Error())
			if tt.name == "Timeout" {
				// No answer came: the provider may still be working on the request, so the lease
				// stays live until it expires, and no other call of the key overlaps it.
				if !e.leased(t, key) {
					t.Fatalf("key %s: the lease of a call that timed out is gone; want it live", key)
				}
				if n, inInbox := e.recorded(t, key); n != nil || inInbox {
					t.Fatalf("key %s: notification %+v, inbox row %v; want neither", key, n, inInbox)
				}
			} else {
				e.checkNothingRecorded(t, key)
			}
			if calls := e.provider.Calls(key); calls != tt.wantCalls {
				t.Fatalf("provider: %d calls, want %d", calls, tt.wantCalls)
			}
		})
	}
	if n := len(e.provider.Delivered()); n != 0 {
		t.Fatalf("provider delivered %d messages, want none", n)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestHandleRedelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i, want := range []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Duplicate} {
		if outcome, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil || outcome != want {
			t.Fatalf("delivery %d: Process = %q, %v; want %q", i+1, outcome, err, want)
		}
	}
	e.checkSent(t, "k1", 1)
	if calls := e.provider.Calls("k1"); calls != 1 {
		t.Fatalf("provider: %d calls, want 1", calls)
	}
}

// TestHandleLostCommit plays the window between the provider's acceptance and the commit: the
// transaction fails after the send, so nothing is recorded, and the message is processed again. The
// resend carries the same key, so the provider delivers once and the row holds the first message's id.
func TestHandleLostCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	msg := inbox.Message{Handler: "sms", Key: "k1", Fingerprint: inbox.Fingerprint(testEvent), Topic: "notifications.sms"}
	lost := fault.Unavailable(errors.New("connection lost before commit"))
	call := callOf(e.handler, inbox.Delivery{Key: "k1", Value: testEvent, Attempt: 1})
	run := call.Run
	call.Run = func(ctx context.Context, attempt int) (inbox.Effect, error) {
		complete, err := run(ctx, attempt)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := complete(ctx, tx); err != nil {
				return err
			}
			return lost
		}, nil
	}
	_, err := e.store.ProcessCall(context.Background(), msg, call)
	if !errors.Is(err, lost) {
		t.Fatalf("Process: %v, want %v", err, lost)
	}
	e.checkNothingRecorded(t, "k1")

	if outcome, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
		t.Fatalf("redelivery: Process = %q, %v; want applied", outcome, err)
	}
	e.checkSent(t, "k1", 2) // the second call for the key
	if calls, delivered := e.provider.Calls("k1"), len(e.provider.Delivered()); calls != 2 || delivered != 1 {
		t.Fatalf("provider: %d calls, %d deliveries; want 2 and 1", calls, delivered)
	}
}

// TestHandleAfterInboxExpiry: the notifications row outlives the inbox key, and still stops a resend.
func TestHandleAfterInboxExpiry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM inbox`); err != nil {
		t.Fatal(err)
	}
	if outcome, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil || outcome != inbox.Duplicate {
		t.Fatalf("Process = %q, %v; want duplicate", outcome, err)
	}
	if calls := e.provider.Calls("k1"); calls != 1 {
		t.Fatalf("provider: %d calls, want 1", calls)
	}
}

// TestHandleLeaseHeld: while another worker holds the key's lease (its send may be out), the SMS is
// not sent: the attempt fails with a retryable error that waits for the lease.
func TestHandleLeaseHeld(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.anotherWorkersLease(t, "k1", time.Minute)
	_, err := e.process(t, e.handler, "k1", testEvent, 1)
	if kind, _, retryAfter := fault.Classify(err); !errors.Is(err, inbox.ErrLeaseHeld) || kind != fault.KindRetryable ||
		retryAfter <= 50*time.Second {
		t.Fatalf("Process: %v, %v after %v; want retryable ErrLeaseHeld after the lease's remaining minute", err, kind, retryAfter)
	}
	if calls := e.provider.Calls("k1"); calls != 0 {
		t.Fatalf("provider: %d calls, want none while the lease is held", calls)
	}
	if n, inInbox := e.recorded(t, "k1"); n != nil || inInbox || !e.leased(t, "k1") {
		t.Fatalf("notification %+v, inbox row %v; want neither, and the other worker's lease kept", n, inInbox)
	}
}

// TestHandleLeaseExpired: a worker died while its send was out; once its lease has expired, the
// redelivery takes it over and sends again with the same key, which the provider delivers once.
func TestHandleLeaseExpired(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The dead worker's send reached the provider, which delivered it.
	sms := notify.SMS{Key: "k1", To: testPhone, Template: "verify_code", Params: map[string]string{"code": "123456"}}
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: e.provider.URL, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	first, err := sender.Send(context.Background(), sms)
	if err != nil {
		t.Fatal(err)
	}
	e.anotherWorkersLease(t, "k1", -time.Second)

	if outcome, err := e.process(t, e.handler, "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
		t.Fatalf("Process = %q, %v; want applied", outcome, err)
	}
	e.checkSent(t, "k1", 2) // the second call for the key
	requests := e.provider.Requests()
	if len(requests) != 2 || requests[1].Key != "k1" || requests[1].Reference != "k1" || len(e.provider.Delivered()) != 1 {
		t.Fatalf("provider requests %+v, %d delivered; want a second with key k1, one delivery", requests, len(e.provider.Delivered()))
	}
	if n, _ := e.recorded(t, "k1"); *n.providerMessageID != first || e.leased(t, "k1") {
		t.Fatalf("recorded id %q, want the first send's %q, and no lease left", *n.providerMessageID, first)
	}
}

func TestHandleAcceptedWithoutID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	})
	if outcome, err := e.process(t, e.newHandler(t, sender), "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
		t.Fatalf("Process = %q, %v; want applied", outcome, err)
	}
	if n, _ := e.recorded(t, "k1"); n == nil || n.status != "SENT" || n.providerMessageID != nil {
		t.Fatalf("notification %+v, want SENT without a provider id", n)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "without an id") {
		t.Fatalf("no warning logged:\n%s", logs)
	}
}

// TestHandleAmbiguousID: an answer with two different ids is accepted, recorded with no id, and
// warned about, as an answer without one is.
func TestHandleAmbiguousID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"id":"m-1","id":"m-2"}`))
	})
	if outcome, err := e.process(t, e.newHandler(t, sender), "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
		t.Fatalf("Process = %q, %v; want applied", outcome, err)
	}
	if n, _ := e.recorded(t, "k1"); n == nil || n.status != "SENT" || n.providerMessageID != nil {
		t.Fatalf("notification %+v, want SENT without a provider id", n)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "two that differ") {
		t.Fatalf("no warning logged:\n%s", logs)
	}
}

// TestHandleMasksPhoneLikeID: a provider whose message id is a phone number (the recipient's, or
// another) has it stored whole, and logged masked, as every number is; an id of a hash is logged
// whole.
func TestHandleMasksPhoneLikeID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ id, logged string }{
		{"+8613800138000", "provider_message_id=+86138****8000"},
		{"sms-8613800138000", "provider_message_id=sms-86138****8000"},
		{"log-17333563ad1ca5ad", "provider_message_id=log-17333563ad1ca5ad"},
		{"+8613900139000", "provider_message_id=+[number]"},
		{"m-123456", "provider_message_id=m-123456"},
	} {
		e := setup(t)
		sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"id":"` + tt.id + `"}`))
		})
		if outcome, err := e.process(t, e.newHandler(t, sender), "k1", testEvent, 1); err != nil || outcome != inbox.Applied {
			t.Fatalf("Process = %q, %v; want applied", outcome, err)
		}
		if n, _ := e.recorded(t, "k1"); n == nil || n.providerMessageID == nil || *n.providerMessageID != tt.id {
			t.Fatalf("notification %+v, want the id %q stored whole", n, tt.id)
		}
		logs := e.logs.String()
		if !strings.Contains(logs, tt.logged) || strings.Contains(logs, "13800138000") || strings.Contains(logs, "13900139000") {
			t.Errorf("id %s: want %s in the log, and no whole number:\n%s", tt.id, tt.logged, logs)
		}
	}
}

func TestLogSender(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.newHandler(t, notify.NewLogSender())
	for _, key := range []string{"k1", "k2"} {
		if outcome, err := e.process(t, h, key, testEvent, 1); err != nil || outcome != inbox.Applied {
			t.Fatalf("Process = %q, %v; want applied", outcome, err)
		}
	}
	n1, _ := e.recorded(t, "k1")
	n2, _ := e.recorded(t, "k2")
	if n1 == nil || n2 == nil || !strings.HasPrefix(*n1.providerMessageID, "log-") || *n1.providerMessageID == *n2.providerMessageID {
		t.Fatalf("notifications %+v, %+v; want two distinct log- ids", n1, n2)
	}
	again, err := notify.NewLogSender().Send(context.Background(), notify.SMS{Key: "k1", To: testPhone, Template: "t"})
	if err != nil || again != *n1.providerMessageID {
		t.Fatalf("Send k1 again = %q, %v; want %q", again, err, *n1.providerMessageID)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "+86138****8000") || strings.Contains(logs, "123456") {
		t.Fatalf("logs want the masked number and no param value:\n%s", logs)
	}
	if len(e.provider.Requests()) != 0 {
		t.Fatal("the log sender reached the provider")
	}
}

func TestNewHandler(t *testing.T) {
	t.Parallel()
	if _, err := notify.NewHandler(notify.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Sender") {
		t.Fatalf("NewHandler without a sender: %v, want an error naming Config.Sender", err)
	}
}
