package notify_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
)

const otherPhone = "+14155552671"

// count is a row of notification_counts.
type count struct {
	recipient, template string
	held                bool // held_until set: the send not recorded yet
}

// counts returns the rows of notification_counts, by key.
func (e *env) counts(t *testing.T) map[string]count {
	t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT idempotency_key, recipient, template, held_until IS NOT NULL FROM notification_counts`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]count{}
	for rows.Next() {
		var key string
		var c count
		if err := rows.Scan(&key, &c.recipient, &c.template, &c.held); err != nil {
			t.Fatal(err)
		}
		out[key] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// age moves the counts of keys back by d, as if they had been counted d earlier.
func (e *env) age(t *testing.T, d time.Duration, keys ...string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `
		UPDATE notification_counts SET counted_at = counted_at - $1 * interval '1 microsecond',
			forget_at = forget_at - $1 * interval '1 microsecond'
		WHERE idempotency_key = ANY ($2)`, d.Microseconds(), keys); err != nil {
		t.Fatal(err)
	}
}

func limitsOf(t *testing.T, s string) notify.RecipientLimits {
	t.Helper()
	l, err := notify.ParseRecipientLimits(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRecipientLimit: an SMS is sent while every window of its template has room for one more to
// its recipient; over that, it is recorded SUPPRESSED with its key and not sent. Other numbers and
// templates without a limit are not counted.
func TestRecipientLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=2/1m;3/1h")})
	send := func(key, phone, template string, want inbox.Outcome) {
		t.Helper()
		d := inbox.Delivery{Key: key, Value: smsEvent(phone, template, ""), Attempt: 1, Produced: time.Now()}
		if outcome, err := e.deliver(t, h, d); err != nil || outcome != want {
			t.Fatalf("%s: ProcessCall = %q, %v; want %q", key, outcome, err, want)
		}
	}
	send("k1", testPhone, "verify_code", inbox.Applied)
	send("k2", testPhone, "verify_code", inbox.Applied)
	send("k3", testPhone, "verify_code", inbox.Suppressed) // 2 in the last minute
	send("k4", otherPhone, "verify_code", inbox.Applied)
	send("k5", testPhone, "welcome", inbox.Applied) // no limit
	e.checkNotSent(t, "k3", "SUPPRESSED")
	if logs := e.logs.String(); strings.Count(logs, "sms over its recipient's limit") != 1 ||
		!strings.Contains(logs, "limit=2/1m") || !strings.Contains(logs, "+86138****8000") {
		t.Fatalf("want one line of the suppressed sms, its limit and the number masked:\n%s", logs)
	}
	if got := e.counts(t); len(got) != 3 || got["k1"] != (count{testPhone, "verify_code", false}) ||
		got["k2"].held || got["k4"].recipient != otherPhone {
		t.Fatalf("counts %v; want k1, k2 and k4, sent", got)
	}

	// A minute on, the first window has room again; the hour's holds 2 of 3.
	e.age(t, time.Minute, "k1", "k2")
	send("k6", testPhone, "verify_code", inbox.Applied)
	send("k7", testPhone, "verify_code", inbox.Suppressed) // 3 in the last hour
	if n, _ := e.recorded(t, "k7"); n == nil || n.status != "SUPPRESSED" {
		t.Fatalf("k7: %+v, want SUPPRESSED", n)
	}

	// Delivered again, a suppressed SMS stays as it is, even once its inbox row has gone.
	send("k3", testPhone, "verify_code", inbox.Duplicate)
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM inbox`); err != nil {
		t.Fatal(err)
	}
	send("k3", testPhone, "verify_code", inbox.Duplicate)
	e.checkNotSent(t, "k3", "SUPPRESSED")
}

// TestRecipientLimitRetryCountsOnce: a send that fails and is retried counts once, under its key,
// and keeps its place: the retry is sent, another SMS to the number is not.
func TestRecipientLimitRetryCountsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=1/1m")})
	e.provider.SetHook(func(r notifytest.Request) notifytest.Reply {
		if r.Call == 1 {
			return notifytest.Reply{Status: http.StatusServiceUnavailable}
		}
		return notifytest.Reply{}
	})
	d := inbox.Delivery{Key: "k1", Value: smsEvent(testPhone, "verify_code", ""), Attempt: 1, Produced: time.Now()}
	if _, err := e.deliver(t, h, d); err == nil {
		t.Fatal("the first send succeeded; want the provider's 503")
	}
	if got := e.counts(t); len(got) != 1 || !got["k1"].held {
		t.Fatalf("counts %v; want k1 held while its send may be retried", got)
	}
	other := inbox.Delivery{Key: "k2", Value: d.Value, Attempt: 1, Produced: time.Now()}
	if outcome, err := e.deliver(t, h, other); err != nil || outcome != inbox.Suppressed {
		t.Fatalf("k2 while k1 is retried: ProcessCall = %q, %v; want suppressed", outcome, err)
	}
	d.Attempt = 2
	if outcome, err := e.deliver(t, h, d); err != nil || outcome != inbox.Applied {
		t.Fatalf("k1's retry: ProcessCall = %q, %v; want applied", outcome, err)
	}
	if got := e.counts(t); len(got) != 1 || got["k1"].held {
		t.Fatalf("counts %v; want k1 alone, sent", got)
	}
}

// TestRecipientLimitDeadLetterStopsCounting: a send the provider rejects for good (dead-lettered,
// never sent) stops counting once its hold lapses: the next SMS to the number is sent.
func TestRecipientLimitDeadLetterStopsCounting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=1/1m"), Hold: 50 * time.Millisecond})
	testRejectedStopsCounting(t, e, h)
}

// TestRecipientLimitRejectedStopsCounting: with the pool, a send the provider rejects for good
// stops counting at once, however long its hold: the next code to the number goes out.
func TestRecipientLimitRejectedStopsCounting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=1/1m"), Hold: time.Hour, Pool: e.pool})
	testRejectedStopsCounting(t, e, h)
}

// testRejectedStopsCounting: k1, rejected for good by the provider, stops counting against its
// recipient's limit of 1, and k2 to the same number is sent.
func testRejectedStopsCounting(t *testing.T, e *env, h *notify.Handler) {
	e.provider.SetHook(func(r notifytest.Request) notifytest.Reply {
		if r.Key == "k1" {
			return notifytest.Reply{Status: http.StatusBadRequest, Body: `{"error":"unknown number"}`}
		}
		return notifytest.Reply{}
	})
	value := smsEvent(testPhone, "verify_code", "")
	_, err := e.deliver(t, h, inbox.Delivery{Key: "k1", Value: value, Attempt: 1, Produced: time.Now()})
	if kind, reason, _ := fault.Classify(err); kind != fault.KindPermanent || reason != notify.ProviderRejected {
		t.Fatalf("k1: %v (%v %s), want rejected for good", err, kind, reason)
	}
	waitFor(t, "k1's hold lapsed", func() bool {
		var lapsed bool
		err := e.pool.QueryRow(context.Background(),
			`SELECT held_until < now() FROM notification_counts WHERE idempotency_key = 'k1'`).Scan(&lapsed)
		return err == nil && lapsed
	})
	if outcome, err := e.deliver(t, h, inbox.Delivery{Key: "k2", Value: value, Attempt: 1, Produced: time.Now()}); err != nil || outcome != inbox.Applied {
		t.Fatalf("k2: ProcessCall = %q, %v; want applied: k1 was never sent", outcome, err)
	}
}

// TestRecipientLimitConcurrent: SMS to one number checked at the same time by several workers
// (stores of their own, as on two instances) are let through no more than the limit allows: the
// first is in flight, slowly, while the others are checked.
func TestRecipientLimitConcurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.provider.SetHook(func(notifytest.Request) notifytest.Reply { return notifytest.Reply{Delay: 200 * time.Millisecond} })
	const n = 12
	stores := make([]*inbox.Store, 3)
	for i := range stores {
		store, err := inbox.NewStore(e.pool, inbox.Config{Logger: e.logger})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = store
	}
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=2/1m")})
	outcomes := make([]inbox.Outcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			d := inbox.Delivery{Key: fmt.Sprintf("k%d", i), Value: smsEvent(testPhone, "verify_code", ""), Attempt: 1,
				Produced: time.Now()}
			msg := inbox.Message{Handler: "sms", Key: d.Key, Fingerprint: inbox.Fingerprint(d.Value), Topic: "notifications.sms"}
			call := callOf(h, d)
			check := call.Check
			call.Check = func(ctx context.Context, tx pgx.Tx) error {
				err := check(ctx, tx)
				// The lease's transaction goes on a while, as a group's does while the checks of
				// its other SMS run: the checks of the other workers overlap it.
				time.Sleep(50 * time.Millisecond)
				return err
			}
			outcomes[i], errs[i] = stores[i%len(stores)].ProcessCall(context.Background(), msg, call)
		})
	}
	close(start)
	wg.Wait()
	got := map[inbox.Outcome]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("k%d: %v", i, errs[i])
		}
		got[outcomes[i]]++
	}
	if got[inbox.Applied] != 2 || got[inbox.Suppressed] != n-2 || len(e.provider.Delivered()) != 2 {
		t.Fatalf("outcomes %v, %d delivered; want 2 applied and sent, %d suppressed", got, len(e.provider.Delivered()), n-2)
	}
}

// TestRecipientCountsForgotten: the rows of counts whose windows have passed are deleted by the
// next checks; a sent SMS whose row was lost (a crash of Postgres before the lease's commit reached
// the disk) is counted again by its completion.
func TestRecipientCountsForgotten(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.limitedHandler(t, notify.Config{RecipientLimits: limitsOf(t, "verify_code=5/1h")})
	send := func(key, phone string) {
		t.Helper()
		d := inbox.Delivery{Key: key, Value: smsEvent(phone, "verify_code", ""), Attempt: 1, Produced: time.Now()}
		if outcome, err := e.deliver(t, h, d); err != nil || outcome != inbox.Applied {
			t.Fatalf("%s: ProcessCall = %q, %v; want applied", key, outcome, err)
		}
	}
	for i := range 10 {
		send(fmt.Sprintf("old%d", i), fmt.Sprintf("+1415555%04d", i))
	}
	old := make([]string, 10)
	for i := range old {
		old[i] = fmt.Sprintf("old%d", i)
	}
	e.age(t, time.Hour+time.Second, old...)
	send("new1", testPhone)
	send("new2", testPhone)
	if got := e.counts(t); len(got) != 2 || got["new1"].recipient != testPhone || got["new2"].recipient != testPhone {
		t.Fatalf("counts %v; want the 2 new only, the 10 old deleted by their checks (8, then 2)", got)
	}

	e.provider.SetHook(func(r notifytest.Request) notifytest.Reply {
		if _, err := e.pool.Exec(context.Background(), `DELETE FROM notification_counts WHERE idempotency_key = $1`, r.Key); err != nil {
			t.Error(err)
		}
		return notifytest.Reply{}
	})
	send("lost", otherPhone)
	if got := e.counts(t); got["lost"] != (count{otherPhone, "verify_code", false}) {
		t.Fatalf("counts %v; want lost counted again by its completion, sent", got)
	}
}

func TestNewHandlerLimits(t *testing.T) {
	t.Parallel()
	sender := notify.NewLogSender()
	for _, tt := range []struct {
		config notify.Config
		want   string
	}{
		{notify.Config{Sender: sender, Hold: -time.Second}, "Config.Hold"},
		{notify.Config{Sender: sender, Validity: notify.Validity{"t": 0}}, `Config.Validity["t"]`},
		{notify.Config{Sender: sender, RecipientLimits: notify.RecipientLimits{"t": nil}}, `Config.RecipientLimits["t"]`},
		{notify.Config{Sender: sender, RecipientLimits: notify.RecipientLimits{"t": {{Count: 0, Period: time.Minute}}}},
			`Config.RecipientLimits["t"]`},
	} {
		if _, err := notify.NewHandler(tt.config); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewHandler(%+v): %v, want an error naming %s", tt.config, err, tt.want)
		}
	}
}

// waitFor polls cond until it holds. The deadline only keeps a broken test from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.For(t, what, cond)
}
