package notify_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// limitedHandler is a handler of e's provider with config's validity, recipient limits and hold.
func (e *env) limitedHandler(t *testing.T, config notify.Config) *notify.Handler {
	t.Helper()
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: e.provider.URL, Token: testToken, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	config.Sender, config.Logger = sender, e.logger
	h, err := notify.NewHandler(config)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// deliver runs d through the inbox and h, as the consumer does, and returns its outcome.
func (e *env) deliver(t *testing.T, h *notify.Handler, d inbox.Delivery) (inbox.Outcome, error) {
	t.Helper()
	msg := inbox.Message{Handler: "sms", Key: d.Key, Fingerprint: inbox.Fingerprint(d.Value), Topic: "notifications.sms"}
	return e.store.ProcessCall(context.Background(), msg, callOf(h, d))
}

// smsEvent is an SMS event of template to phone, with the extra JSON members extra ("" for none).
func smsEvent(phone, template, extra string) []byte {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Appendf(nil, `{"phone":%q,"template":%q,"params":{"code":"123456"}%s}`, phone, template, extra)
}

// checkNotSent fails unless key is recorded with its inbox row and a notifications row of status,
// without a send time or a provider id, and the provider got no call for it.
func (e *env) checkNotSent(t *testing.T, key, status string) {
	t.Helper()
	n, inInbox := e.recorded(t, key)
	if n == nil || !inInbox || n.status != status || n.providerMessageID != nil {
		t.Fatalf("key %s: notification %+v, inbox row %v; want %s and the inbox row", key, n, inInbox, status)
	}
	var sentAt *time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT sent_at FROM notifications WHERE idempotency_key = $1`,
		key).Scan(&sentAt); err != nil || sentAt != nil {
		t.Fatalf("key %s: sent_at %v (%v), want NULL", key, sentAt, err)
	}
	if calls := e.provider.Calls(key); calls != 0 {
		t.Fatalf("key %s: %d provider calls, want none", key, calls)
	}
	if e.leased(t, key) {
		t.Fatalf("key %s: a lease is left", key)
	}
}

// TestExpiry: an SMS is not sent once its validity has passed: the event's expires_at when it has
// one, else its production time plus its template's validity. It is recorded EXPIRED with its key,
// so that a redelivery, even after the inbox row has gone, stays a no-op.
func TestExpiry(t *testing.T) {
	t.Parallel()
	now := time.Now()
	rfc := func(t time.Time) string { return `"expires_at":"` + t.Format(time.RFC3339Nano) + `"` }
	for _, tt := range []struct {
		name     string
		value    []byte
		produced time.Time
		want     inbox.Outcome
	}{
		{"ValidityPassed", smsEvent(testPhone, "verify_code", ""), now.Add(-6 * time.Minute), inbox.Expired},
		{"ValidityNotPassed", smsEvent(testPhone, "verify_code", ""), now.Add(-4 * time.Minute), inbox.Applied},
		{"TemplateWithoutValidity", smsEvent(testPhone, "welcome", ""), now.Add(-24 * time.Hour), inbox.Applied},
		{"ProductionUnknown", smsEvent(testPhone, "verify_code", ""), time.Time{}, inbox.Applied},
		{"ExpiresAtPassed", smsEvent(testPhone, "welcome", rfc(now.Add(-time.Second))), now, inbox.Expired},
		{"ExpiresAtWinsOverValidity", smsEvent(testPhone, "verify_code", rfc(now.Add(time.Hour))), now.Add(-time.Hour), inbox.Applied},
		{"ExpiresAtWinsEarlier", smsEvent(testPhone, "verify_code", rfc(now.Add(-time.Millisecond))), now, inbox.Expired},
		{"ExpiresAtProductionUnknown", smsEvent(testPhone, "verify_code", rfc(now.Add(-time.Minute))), time.Time{}, inbox.Expired},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			h := e.limitedHandler(t, notify.Config{Validity: notify.Validity{"verify_code": 5 * time.Minute}})
			d := inbox.Delivery{Key: "k1", Value: tt.value, Attempt: 1, Produced: tt.produced}
			if outcome, err := e.deliver(t, h, d); err != nil || outcome != tt.want {
				t.Fatalf("ProcessCall = %q, %v; want %q", outcome, err, tt.want)
			}
			if tt.want == inbox.Applied {
				if n, _ := e.recorded(t, "k1"); n == nil || n.status != "SENT" || e.provider.Calls("k1") != 1 {
					t.Fatalf("notification %+v, %d calls; want SENT, one call", n, e.provider.Calls("k1"))
				}
				return
			}
			e.checkNotSent(t, "k1", "EXPIRED")
			logs := e.logs.String()
			if strings.Count(logs, "sms expired before it could be sent") != 1 || !strings.Contains(logs, "+86138****8000") {
				t.Fatalf("want one line of the expired sms, with the number masked:\n%s", logs)
			}
			// Delivered again, and again once its inbox row has gone: never sent.
			if outcome, err := e.deliver(t, h, d); err != nil || outcome != inbox.Duplicate {
				t.Fatalf("redelivery: ProcessCall = %q, %v; want duplicate", outcome, err)
			}
			if _, err := e.pool.Exec(context.Background(), `DELETE FROM inbox`); err != nil {
				t.Fatal(err)
			}
			if outcome, err := e.deliver(t, h, d); err != nil || outcome != inbox.Duplicate {
				t.Fatalf("redelivery after the inbox row: ProcessCall = %q, %v; want duplicate", outcome, err)
			}
			e.checkNotSent(t, "k1", "EXPIRED")
		})
	}
}

// TestExpiryAtTheLastMoment: a send that failed while its SMS was valid is not made again once
// the validity has passed: Check, before each call, sees the time the SMS waited.
func TestExpiryAtTheLastMoment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.provider.SetHook(func(notifytest.Request) notifytest.Reply {
		return notifytest.Reply{Status: http.StatusServiceUnavailable}
	})
	h := e.limitedHandler(t, notify.Config{Validity: notify.Validity{"verify_code": time.Second}})
	d := inbox.Delivery{Key: "k1", Value: smsEvent(testPhone, "verify_code", ""), Attempt: 1, Produced: time.Now()}
	if _, err := e.deliver(t, h, d); err == nil {
		t.Fatal("the send succeeded with the provider down")
	}
	e.provider.SetHook(nil)
	d.Attempt, d.Produced = 2, d.Produced.Add(-time.Second) // the retry, a second later
	if outcome, err := e.deliver(t, h, d); err != nil || outcome != inbox.Expired {
		t.Fatalf("retry: ProcessCall = %q, %v; want expired", outcome, err)
	}
	if n, _ := e.recorded(t, "k1"); n == nil || n.status != "EXPIRED" || n.attempts != 2 || e.provider.Calls("k1") != 1 ||
		len(e.provider.Delivered()) != 0 {
		t.Fatalf("notification %+v, %d calls, %d delivered; want EXPIRED on attempt 2, the failed call only",
			n, e.provider.Calls("k1"), len(e.provider.Delivered()))
	}
}

// TestNotificationStatuses: the table refuses a status of its own making and a row whose send
// time says otherwise than its status.
func TestNotificationStatuses(t *testing.T) {
	t.Parallel()
	pool := pgtest.Schema(t).Pool
	for _, tt := range []struct {
		status string
		sentAt string
		ok     bool
	}{
		{"SENT", "now()", true}, {"EXPIRED", "NULL", true}, {"SUPPRESSED", "NULL", true},
		{"SENT", "NULL", false}, {"EXPIRED", "now()", false}, {"FAILED", "NULL", false},
	} {
		err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `INSERT INTO notifications (idempotency_key, recipient, template, status, attempts, sent_at)
				VALUES ('k', $1, 't', $2, 1, `+tt.sentAt+`)`, testPhone, tt.status)
			if err == nil {
				err = errRollback
			}
			return err
		})
		if ok := err == errRollback; ok != tt.ok {
			t.Errorf("status %s, sent_at %s: %v; want accepted %v", tt.status, tt.sentAt, err, tt.ok)
		}
	}
}

var errRollback = fmt.Errorf("roll back")
