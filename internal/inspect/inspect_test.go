package inspect_test

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/inspect"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var routes = []inspect.Route{
	{Name: "payments", Topic: "payments.callbacks", Kind: inspect.Payments},
	{Name: "sms", Topic: "notifications.sms", Kind: inspect.SMS},
}

// env is a migrated schema with the worker's inbox and payment handler, for rows written as the
// worker writes them.
type env struct {
	t       *testing.T
	db      *pgtest.DB
	store   *inbox.Store
	payment *payment.Handler
}

func setup(t *testing.T) *env {
	t.Helper()
	db := pgtest.Schema(t)
	store, err := inbox.NewStore(db.Pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := payment.NewHandler(payment.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, db: db, store: store, payment: h}
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

func callback(key, orderNo, txn, result string) []byte {
	return []byte(`{"event_id":"` + key + `","order_no":"` + orderNo + `","provider":"alipay","provider_txn_id":"` + txn +
		`","amount":"99.90","currency":"CNY","result":"` + result + `","paid_at":"2026-11-30T12:00:00Z"}`)
}

// applyVerified runs a callback through the inbox and the payment handler, as the consumer does,
// its signature verified by the key named verifiedBy.
func (e *env) applyVerified(key string, value []byte, offset int64, verifiedBy string) inbox.Outcome {
	e.t.Helper()
	msg := inbox.Message{Handler: "payments", Key: key, Fingerprint: inbox.Fingerprint(value),
		Topic: "payments.callbacks", Partition: 2, Offset: offset}
	outcome, err := e.store.Process(context.Background(), msg, func(ctx context.Context, tx pgx.Tx) error {
		return e.payment.Handle(ctx, tx, inbox.Delivery{Key: key, Value: value, Attempt: 1, VerifiedBy: verifiedBy})
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return outcome
}

// inspect runs worker inspect for key and returns what it printed and its error.
func (e *env) inspect(key, route string) (string, error) {
	e.t.Helper()
	var out bytes.Buffer
	err := inspect.Run(context.Background(), inspect.Config{Key: key, Route: route, Routes: routes,
		Postgres: startup.Postgres{URL: e.db.URL, Timeout: 5 * time.Second, Logger: testlog.New(e.t)}, Out: &out})
	e.t.Logf("worker inspect %s:\n%s(error: %v)", key, out.String(), err)
	return out.String(), err
}

// expect checks that out has a line matching each pattern, and none of the forbidden strings.
func expect(t *testing.T, out string, patterns []string, forbidden ...string) {
	t.Helper()
	for _, p := range patterns {
		if !regexp.MustCompile(`(?m)` + p).MatchString(out) {
			t.Errorf("no line matches %q", p)
		}
	}
	for _, f := range forbidden {
		if strings.Contains(out, f) {
			t.Errorf("the report holds %q", f)
		}
	}
}

// TestPayments inspects payment callbacks in each state the database can know one in: applied
// (an order paid, an anomaly, a failed payment), a duplicate, parked with its history, dead-lettered
// into dead_letters, and unknown.
func TestPayments(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO orders (order_no, user_id, amount, currency) VALUES
		('A-1', 'u1', 99.90, 'CNY'), ('C-1', 'u2', 99.90, 'CNY'), ('F-1', 'u3', 99.90, 'CNY')`)
	e.exec(`UPDATE orders SET status = 'CANCELLED' WHERE order_no = 'C-1'`)
	for _, a := range []struct {
		key, order, txn, result, verifiedBy string
		want                                inbox.Outcome
	}{
		{"evt-paid", "A-1", "T-1", "SUCCESS", "", inbox.Applied},
		{"evt-resent", "A-1", "T-1", "SUCCESS", "", inbox.Duplicate}, // the provider's resend under a new key
		{"evt-flag", "C-1", "T-2", "SUCCESS", "", inbox.Applied},
		{"evt-failed", "F-1", "T-3", "FAILED", "provider-2026", inbox.Applied},
	} {
		if got := e.applyVerified(a.key, callback(a.key, a.order, a.txn, a.result), 4411, a.verifiedBy); got != a.want {
			t.Fatalf("%s: %s, want %s", a.key, got, a.want)
		}
	}

	t.Run("Paid", func(t *testing.T) {
		out, err := e.inspect("evt-paid", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{
			`^idempotency key evt-paid, as the database knows it at `,
			`^route payments, topic payments.callbacks$`,
			`^  outcome +applied: order A-1 paid by alipay T-1$`,
			`^  inbox +recorded .* ago\) from payments.callbacks/2 at offset 4411; remembered until .*\(in `,
			`^  payment +SUCCESS 99.90 CNY, alipay T-1, order A-1, paid at 2026-11-30T12:00:00Z, recorded [^,]*$`,
			`^  anomaly +none under this key$`,
			`^  order +A-1 PAID, 99.90 CNY, paid by T-1 at 2026-11-30T12:00:00Z, updated `,
			`^  transaction +alipay T-1 belongs to order A-1, 99.90 CNY`,
			`^  parked +no$`,
			`^  dead letter +\(none in dead_letters; dead letters that payments.callbacks.dlq took are in Kafka: worker replay payments.callbacks.dlq --dry-run\)$`,
		}, "route sms", "u1")
	})
	t.Run("Duplicate", func(t *testing.T) {
		out, err := e.inspect("evt-resent", "payments")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{`^  outcome +duplicate: recorded in the inbox, with no payment or anomaly under this key`,
			`^  payment +none under this key$`})
	})
	t.Run("Anomaly", func(t *testing.T) {
		out, err := e.inspect("evt-flag", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{
			`^  outcome +applied: anomaly paid_after_cancel recorded on order C-1`,
			`^  anomaly +paid_after_cancel on order C-1: 99.90 CNY received for 99.90 CNY expected, alipay T-2, recorded `,
			`^  order +C-1 CANCELLED, 99.90 CNY, updated `,
		})
	})
	t.Run("Failed", func(t *testing.T) {
		out, err := e.inspect("evt-failed", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{`^  outcome +applied: a failed payment recorded on order F-1, which it leaves as it was$`,
			`^  payment +FAILED 99.90 CNY, alipay T-3, order F-1, .*, signature verified by key provider-2026$`,
			`^  order +F-1 PENDING`})
	})

	t.Run("Parked", func(t *testing.T) {
		first := time.Now().Add(-time.Minute)
		for i, key := range []string{"evt-wait", "evt-behind"} {
			p := inbox.Parked{Handler: "payments", Topic: "payments.callbacks", Partition: 1, Offset: int64(40 + i),
				OrderingKey: []byte("B-1"), MessageKey: []byte("B-1"), IdempotencyKey: key,
				Value: callback(key, "B-1", "T-9", "SUCCESS")}
			if i == 0 {
				p.Attempts, p.Reason, p.FirstFailedAt, p.BudgetSpent = 4, payment.UnknownOrder, first, 3200*time.Millisecond
				p.FirstError, p.LastError = "payment: no order B-1", "payment: still no order B-1"
			}
			if _, err := e.store.Park().Add(context.Background(), p, 20*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		out, err := e.inspect("evt-wait", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{
			`^  outcome +parked, waiting for a retry: 4 attempt\(s\) so far, the next .*\(in 2\ds\)$`,
			`^  inbox +no row: not applied`,
			`^  parked +id \d+ from payments.callbacks/1 at offset 40, key B-1, the head of its key, parked `,
			`^ +4 attempt\(s\), 3.2s of the retry budget spent; first failed .*: "payment: no order B-1"; ` +
				`last error: "payment: still no order B-1"; next attempt .*; dead-lettered unknown_order once its budget runs out$`,
			`^ +message: callback SUCCESS for order B-1, 99.90 CNY, alipay T-9$`,
			`^  order +none named, or not in orders$`,
		})
		out, err = e.inspect("evt-behind", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{`^  outcome +parked behind 1 message\(s\) of its key, waiting for them$`,
			`^ +not run yet; next attempt once those ahead of it have left$`})
	})

	t.Run("DeadLetter", func(t *testing.T) {
		value := callback("", "A-1", "T-1", "SUCCESS") // another order's transaction: invalid_payload
		letter := deadletter.Letter{Reason: inboxtype.InvalidPayload, Error: "provider_txn_id: already recorded for order A-1",
			Topic: "payments.callbacks", Partition: 3, Offset: 77, Attempts: 1, FailedAt: time.Now().Add(-time.Hour)}
		original := []kafka.Header{{Key: "Idempotency-Key", Value: []byte("evt-dead")}}
		_, err := deadletter.NewStore(e.db.Pool).Save(context.Background(), deadletter.Stored{DLQTopic: "payments.callbacks.dlq",
			Letter: letter, Key: []byte("A-1"), Value: value, Headers: letter.Headers(original),
			WriteError: "MESSAGE_TOO_LARGE"})
		if err != nil {
			t.Fatal(err)
		}
		// A dead letter of another key that names the key in its value is not its.
		_, err = deadletter.NewStore(e.db.Pool).Save(context.Background(), deadletter.Stored{DLQTopic: "payments.callbacks.dlq",
			Letter: letter, Value: callback("evt-other", "evt-dead", "T-5", "SUCCESS"), Headers: letter.Headers(nil)})
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.inspect("evt-dead", "")
		if err != nil {
			t.Fatal(err)
		}
		expect(t, out, []string{
			`^  outcome +dead-lettered \(invalid_payload\), kept in dead_letters: fix the cause, then worker replay payments.callbacks.dlq$`,
			`^  dead letter +dead_letters id \d+: invalid_payload after 1 attempt\(s\), failed .*: "provider_txn_id: already recorded for order A-1"$`,
			`^ +from payments.callbacks/3 at offset 77, key A-1; payments.callbacks.dlq refused it: "MESSAGE_TOO_LARGE"; not replayed: worker replay payments.callbacks.dlq$`,
			`^ +message: not a valid callback \(payment callback: event_id: must not be empty\) for order A-1, alipay T-1$`,
			`^ +\(1 in dead_letters; `,
			`^  transaction +alipay T-1 belongs to order A-1`,
		}, "T-5")
	})

	t.Run("Unknown", func(t *testing.T) {
		out, err := e.inspect("evt-nobody", "")
		if !errors.Is(err, inspect.ErrUnknownKey) || out != "" {
			t.Errorf("got %q, %v; want nothing printed and ErrUnknownKey", out, err)
		}
		if err != nil && !strings.Contains(err.Error(), "payments (payments.callbacks), sms (notifications.sms)") {
			t.Errorf("the error %q does not say where it looked", err)
		}
		// A key of the payments route is unknown to the SMS route.
		if _, err := e.inspect("evt-paid", "notifications.sms"); !errors.Is(err, inspect.ErrUnknownKey) {
			t.Errorf("--route notifications.sms: %v, want ErrUnknownKey", err)
		}
		if _, err := e.inspect("evt-paid", "mail"); err == nil || !strings.Contains(err.Error(), `--route: no route "mail"`) {
			t.Errorf("--route mail: %v, want an error naming the route", err)
		}
	})
}

// TestSMS inspects SMS keys: sent (with the number masked), being sent (a live lease), a call made
// and not recorded (an expired lease), and a key in both routes.
func TestSMS(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ('sms', 'sms-1', '\x00', 'notifications.sms', 0, 5, now() + interval '26 hours'),
		       ('sms', 'both', '\x00', 'notifications.sms', 0, 6, now() + interval '26 hours'),
		       ('payments', 'both', '\x00', 'payments.callbacks', 1, 9, now() - interval '1 minute')`)
	e.exec(`INSERT INTO notifications (idempotency_key, recipient, template, status, provider_message_id, attempts)
		VALUES ('sms-1', '+8613800138000', 'verify_code', 'SENT', 'msg-77', 2)`)
	e.exec(`INSERT INTO inbox_leases (handler, idempotency_key, holder, expires_at, attempts) VALUES
		('sms', 'sms-out', 'host-a 123 x', now() + interval '10 seconds', 1),
		('sms', 'sms-lost', 'host-b 456 y', now() - interval '1 minute', 3)`)

	out, err := e.inspect("sms-1", "")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, out, []string{
		`^route sms, topic notifications.sms$`,
		`^  outcome +sent: the provider accepted it, and its notifications row committed with the inbox row$`,
		`^  sms +SENT to \+86138\*\*\*\*8000, template verify_code, provider message id msg-77, after 2 call\(s\), sent `,
		`^  lease +none: no call under the key is out$`,
	}, "13800138000", "route payments")

	out, err = e.inspect("sms-out", "sms")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, out, []string{`^  outcome +being sent: a call under the key is out`,
		`^  lease +held by "host-a 123 x", taken .*, 1 call\(s\) so far; live until .*\(in \d+s\)`})
	out, err = e.inspect("sms-lost", "sms")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, out, []string{`^  outcome +not sent yet: 3 call\(s\) made and none recorded`,
		`^  lease +.*expired .* ago\): the next call for the key takes it over$`})

	// A key that is a phone number is masked in the heading too; an inbox row with no
	// notifications row says it has no record of a send, not that it was applied.
	e.exec(`INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ('sms', '+8613800138000', '\x00', 'notifications.sms', 0, 7, now() + interval '26 hours')`)
	out, err = e.inspect("+8613800138000", "sms")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, out, []string{`^idempotency key \+86138\*\*\*\*8000, as the database knows it at `,
		`^  outcome +handled, with no record of a send: its inbox row committed, and no notifications row`,
		`^  sms +no notifications row`}, "13800138000", "applied")

	// A key both routes know shows both, each under its own heading.
	out, err = e.inspect("both", "")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, out, []string{`^route payments, topic payments.callbacks$`, `^route sms, topic notifications.sms$`,
		`^  inbox +recorded .* from payments.callbacks/1 at offset 9; expired .* ago\), purged soon`})
}

// TestSMSNotSent inspects SMS keys not sent on purpose: expired and suppressed, recorded with their
// key and a notifications row without a send time.
func TestSMSNotSent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ('sms', 'late', '\x00', 'notifications.sms', 0, 5, now() + interval '26 hours'),
		       ('sms', 'over', '\x00', 'notifications.sms', 0, 6, now() + interval '26 hours')`)
	e.exec(`INSERT INTO notifications (idempotency_key, recipient, template, status, attempts, sent_at)
		VALUES ('late', '+8613800138000', 'verify_code', 'EXPIRED', 3, NULL),
		       ('over', '+8613800138000', 'verify_code', 'SUPPRESSED', 1, NULL)`)
	for key, want := range map[string][]string{
		"late": {`^  outcome +expired: not sent, too late to be of use; its notifications row committed with the inbox row$`,
			`^  sms +EXPIRED to \+86138\*\*\*\*8000, template verify_code, not sent, after 3 attempt\(s\)$`},
		"over": {`^  outcome +suppressed: not sent, over its recipient's limit; its notifications row committed with the inbox row$`,
			`^  sms +SUPPRESSED to \+86138\*\*\*\*8000, template verify_code, not sent, after 1 attempt\(s\)$`},
	} {
		out, err := e.inspect(key, "sms")
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		expect(t, out, want, "13800138000")
	}
}
