package consumer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestDecide is the table of what happens to a message after an attempt (docs/design.md, "What
// happens to a message"), for a route that parks after 5s in place, with a budget of 1m, backoff
// from 1s to 8s, no jitter.
func TestDecide(t *testing.T) {
	t.Parallel()
	p := policy{retry: Retry{InitialInterval: time.Second, MaxInterval: 8 * time.Second, MaxElapsed: time.Minute},
		parkAfter: 5 * time.Second, parks: true}
	byPartition := p
	byPartition.parks = false

	errOops := errors.New("oops")
	retryable := fault.Retryable(errors.New("provider answered 503"))
	unknownOrder := fault.RetryableUntil(reasonUnknownOrder, errors.New("no order A-1"))
	leaseHeld := fmt.Errorf("%w (another worker, for 14s more)", inbox.ErrLeaseHeld)
	leaseHeld = &fault.Error{Kind: fault.KindRetryable, RetryAfter: 14 * time.Second, Err: leaseHeld}
	paced := fault.RetryableAfter(fmt.Errorf("%w: %w", inbox.ErrNotCalled, gate.ErrPaced), 3*time.Second)
	revoked := fmt.Errorf("inbox: claim: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for table inbox"})
	duplicateRow := fmt.Errorf("payment: %w", &pgconn.PgError{Code: "23505"})
	open, paused := routeView{open: true}, routeView{open: false}
	failedAt := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC) // when a message that failed before first did
	ran := func(err error) result { return result{err: err, ran: []int{1}, took: 100 * time.Millisecond} }
	answered := func(o inbox.Outcome) result {
		return result{outcomes: []inbox.Outcome{o}, ran: []int{1}, took: 100 * time.Millisecond}
	}

	for _, c := range []struct {
		name   string
		policy policy
		h      history
		r      result
		route  routeView
		want   decision
	}{
		{name: "Applied", r: answered(inbox.Applied), route: open,
			want: decision{action: finish, outcome: inbox.Applied}},
		{name: "Duplicate", r: answered(inbox.Duplicate), route: open,
			want: decision{action: finish, outcome: inbox.Duplicate}},
		{name: "KeyReused", r: answered(inbox.KeyReused), route: open,
			want: decision{action: deadLetter, reason: inboxtype.IdempotencyKeyReused, err: errKeyReused}},
		{name: "Permanent", r: ran(fault.Permanent(inboxtype.InvalidPayload, errOops)), route: open,
			want: decision{action: deadLetter, reason: inboxtype.InvalidPayload}},
		{name: "Unclassified", r: ran(errOops), route: open,
			want: decision{action: deadLetter, reason: inboxtype.HandlerError}},
		// The first failure: retried in place after the first interval, charged its time and the wait.
		{name: "Retryable", r: ran(retryable), route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: time.Second, charge: 1100 * time.Millisecond}},
		// A first attempt slower than the whole budget is still retried once.
		{name: "SlowFirstAttempt", r: result{err: retryable, ran: []int{1}, took: 2 * time.Minute}, route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: time.Second, charge: 121 * time.Second}},
		{name: "SlowFirstAttemptInABatch", h: history{attempts: 1}, r: result{err: retryable, ran: []int{0}, took: 2 * time.Minute}, route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: 2 * time.Second, charge: 122 * time.Second}},
		{name: "SlowSecondAttempt", h: history{attempts: 1, spent: 121 * time.Second, firstAt: failedAt}, r: ran(retryable), route: open,
			want: decision{action: deadLetter, reason: inboxtype.RetriesExhausted, charge: 2100 * time.Millisecond}},
		// The fourth failure waits the fourth interval, 8s, which would overrun 5s in place: parked.
		{name: "RetryableParks", h: history{attempts: 3, inPlace: 3 * time.Second, spent: 7 * time.Second},
			r: ran(retryable), route: open,
			want: decision{action: park, reason: inboxtype.RetriesExhausted, delay: 8 * time.Second, charge: 8100 * time.Millisecond}},
		{name: "RetryableInPlaceByPartition", policy: byPartition, h: history{attempts: 3, inPlace: 3 * time.Second},
			r: ran(retryable), route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: 8 * time.Second, charge: 8100 * time.Millisecond}},
		{name: "Parked", h: history{attempts: 5, parked: true, spent: 30 * time.Second}, r: ran(unknownOrder), route: open,
			want: decision{action: park, reason: reasonUnknownOrder, delay: 8 * time.Second, charge: 8100 * time.Millisecond}},
		// The budget spent: dead-lettered with the error's reason.
		{name: "BudgetSpent", h: history{attempts: 9, parked: true, spent: 55 * time.Second, firstAt: failedAt}, r: ran(unknownOrder), route: open,
			want: decision{action: deadLetter, reason: reasonUnknownOrder, charge: 8100 * time.Millisecond}},
		{name: "BudgetSpentRetriesExhausted", h: history{attempts: 9, spent: 55 * time.Second, firstAt: failedAt}, r: ran(retryable), route: open,
			want: decision{action: deadLetter, reason: inboxtype.RetriesExhausted, charge: 8100 * time.Millisecond}},
		// A Retry-After makes the wait; the route is throttled for it; only the backoff is charged,
		// so a Retry-After longer than the budget dead-letters nothing.
		{name: "RetryAfter", policy: byPartition, r: ran(fault.RetryableAfter(errOops, 3*time.Second)), route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: 3 * time.Second,
				charge: 1100 * time.Millisecond, throttle: 3 * time.Second}},
		{name: "RetryAfterLongerThanTheBudget", h: history{attempts: 1}, r: ran(fault.RetryableAfter(errOops, 10*time.Minute)), route: open,
			want: decision{action: park, reason: inboxtype.RetriesExhausted, delay: 10 * time.Minute,
				charge: 2100 * time.Millisecond, throttle: 10 * time.Minute}},
		{name: "RetryAfterOfADay", policy: byPartition, r: ran(fault.RetryableAfter(errOops, 24*time.Hour)), route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, delay: 24 * time.Hour,
				charge: 1100 * time.Millisecond, throttle: maxThrottle}},
		// A failure while the circuit has the route paused is the outage's: parked at once, charged
		// nothing; in place with ByPartition, once the route lets it.
		{name: "gate.RoutePaused", h: history{attempts: 2, spent: 3 * time.Second}, r: ran(retryable), route: paused,
			want: decision{action: park, reason: inboxtype.RetriesExhausted, wait: waitRoute}},
		{name: "RoutePausedByPartition", policy: byPartition, r: ran(retryable), route: paused,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, wait: waitRoute}},
		// The kill switch: a refusal that would meet any message (a privilege revoked: 42501), while
		// refusals have the route paused, is held as an outage's failure is, charged nothing; a
		// permanent error about the message's own data (23505), or of its own reason, is still
		// dead-lettered at once.
		{name: "RefusedWhileTripped", r: ran(revoked), route: paused,
			want: decision{action: park, reason: inboxtype.HandlerError, wait: waitRoute}},
		{name: "RefusedWhileTrippedByPartition", policy: byPartition, r: ran(revoked), route: paused,
			want: decision{action: retry, reason: inboxtype.HandlerError, wait: waitRoute}},
		{name: "Refused", r: ran(revoked), route: open,
			want: decision{action: deadLetter, reason: inboxtype.HandlerError}},
		{name: "DataErrorWhileTripped", r: ran(duplicateRow), route: paused,
			want: decision{action: deadLetter, reason: inboxtype.HandlerError}},
		{name: "InvalidPayloadWhileTripped", r: ran(fault.Permanent(inboxtype.InvalidPayload, errOops)), route: paused,
			want: decision{action: deadLetter, reason: inboxtype.InvalidPayload}},
		// A call whose turn under the rate limit would come after its lease: no call, no failure
		// of the message's, charged nothing, as while the route is paused.
		// It waits for its turn in place, even past parkAfter: nothing is failing.
		{name: "Paced", h: history{attempts: 2, inPlace: 4 * time.Second, spent: 59 * time.Second}, r: result{err: paced, ran: []int{1}}, route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, wait: waitRate, delay: 3 * time.Second}},
		{name: "PacedByPartition", policy: byPartition, r: result{err: paced, ran: []int{1}}, route: open,
			want: decision{action: retry, reason: inboxtype.RetriesExhausted, wait: waitRate, delay: 3 * time.Second}},
		{name: "PacedParked", h: history{attempts: 2, parked: true}, r: result{err: paced, ran: []int{1}}, route: open,
			want: decision{action: park, reason: inboxtype.RetriesExhausted, wait: waitRate, delay: 3 * time.Second}},
		// The database down, or the key's lease held by a live call: no failure of the message's.
		// It looks again soon, then less often, charged nothing, whatever its budget.
		{name: "DatabaseDown", h: history{spent: 59 * time.Second}, r: result{err: fault.Unavailable(errOops), ran: []int{0}},
			route: open, want: decision{action: retry, wait: waitDatabase, delay: time.Second}},
		{name: "DatabaseDownAgain", h: history{waits: 3}, r: result{err: fault.Unavailable(errOops), ran: []int{0}},
			route: open, want: decision{action: retry, wait: waitDatabase, delay: 5 * time.Second}},
		{name: "LeaseHeld", h: history{spent: 59 * time.Second}, r: result{err: leaseHeld, ran: []int{0}}, route: open,
			want: decision{action: retry, wait: waitLease, delay: time.Second}},
		{name: "LeaseHeldLong", h: history{waits: 5, inPlace: 4 * time.Second}, r: result{err: leaseHeld, ran: []int{0}},
			route: open, want: decision{action: park, wait: waitLease, delay: 5 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pol := c.policy
			if pol.retry.MaxElapsed == 0 {
				pol = p
			}
			got := pol.decide(c.h, c.r, c.route)
			if got.action != c.want.action || got.outcome != c.want.outcome || got.reason != c.want.reason ||
				got.delay != c.want.delay || got.charge != c.want.charge || got.throttle != c.want.throttle ||
				got.wait != c.want.wait {
				t.Errorf("decide = %+v\nwant       %+v", got, c.want)
			}
			if c.want.err != nil && !errors.Is(got.err, c.want.err) {
				t.Errorf("decide's error %v, want %v", got.err, c.want.err)
			}
			if c.r.err != nil && got.err == nil {
				t.Errorf("decide dropped the attempt's error %v", c.r.err)
			}
		})
	}
}

// TestCrashLooped: a message about to start for the 6th time in a row without finishing — the
// worker died with it in flight 5 times — is dead-lettered as crash_loop without running, whichever
// executor counted its starts; up to the 5th start it runs.
func TestCrashLooped(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		starts int
		dead   bool
	}{{0, false}, {1, false}, {crashLoopStarts, false}, {crashLoopStarts + 1, true}, {40, true}} {
		d, dead := crashLooped(c.starts)
		if dead != c.dead {
			t.Errorf("start %d: dead-lettered %v, want %v", c.starts, dead, c.dead)
			continue
		}
		if !dead {
			continue
		}
		want := fmt.Sprintf("the worker died %d times in a row while handling this message", c.starts-1)
		if d.action != deadLetter || d.reason != inboxtype.CrashLoop || d.err == nil || d.err.Error() != want {
			t.Errorf("start %d: %+v, want a crash_loop dead letter, %q", c.starts, d, want)
		}
	}
}

// TestHistoryNext: an attempt's decision is written into the message's history as the park keeps
// it: its runs, its budget spent, its time in place, its first and last failures.
func TestHistoryNext(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	first, second := errors.New("first"), errors.New("second")
	h := history{}
	h = h.next(result{err: first, ran: []int{1}, took: time.Second},
		decision{action: retry, err: first, reason: reasonUnknownOrder, delay: 2 * time.Second, charge: 3 * time.Second}, now)
	h = h.next(result{err: fault.Unavailable(errors.New("down")), ran: []int{0}},
		decision{action: retry, err: errors.New("down"), wait: waitDatabase, delay: time.Second}, now.Add(time.Minute))
	h = h.next(result{err: second, ran: []int{1}, took: time.Second},
		decision{action: park, err: second, reason: reasonUnknownOrder, delay: 4 * time.Second, charge: 5 * time.Second}, now.Add(2*time.Minute))
	want := history{attempts: 2, spent: 8 * time.Second, inPlace: 3*time.Second + time.Second, reason: reasonUnknownOrder,
		first: first, last: second, firstAt: now}
	if h != want {
		t.Errorf("history %+v\nwant    %+v", h, want)
	}
}

// TestExponential: the one backoff doubles from its first interval up to its maximum, and its
// jitter keeps each wait within its share of the interval.
func TestExponential(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, exponential(100*time.Millisecond, time.Second, 0, n))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, time.Second, time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("intervals %v, want %v", got, want)
	}
	for range 100 {
		if d := exponential(100*time.Millisecond, time.Second, 0.5, 3); d < 200*time.Millisecond || d > 600*time.Millisecond {
			t.Fatalf("the third interval with 50%% jitter is %v, want within [200ms, 600ms]", d)
		}
	}
	if d := exponential(time.Second, time.Second, 0, 10_000); d != time.Second {
		t.Errorf("the 10,000th interval is %v, want the maximum", d)
	}
}

// TestRefusalOf: which errors are refusals that would meet any message of the route, and their
// class, by which the kill switch tells them alike.
func TestRefusalOf(t *testing.T) {
	t.Parallel()
	type plainError struct{ error }
	for _, c := range []struct {
		name  string
		err   error
		class string // "" for no refusal
	}{
		{"None", nil, ""},
		{"PrivilegeRevoked", fmt.Errorf("inbox: claim: %w", &pgconn.PgError{Code: "42501"}), "SQLSTATE 42501"},
		{"TableMissing", fmt.Errorf("payment: %w", &pgconn.PgError{Code: "42P01"}), "SQLSTATE 42P01"},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, ""},
		{"InvalidText", &pgconn.PgError{Code: "22P02"}, ""},
		{"ReadOnly", inbox.Classify(&pgconn.PgError{Code: "25006"}), ""}, // an outage: waited out
		{"InvalidPayload", fault.Permanent(inboxtype.InvalidPayload, errors.New("bad JSON")), ""},
		{"Retryable", fault.Retryable(errors.New("503")), ""},
		{"Handler", fmt.Errorf("outbox: emit: %w", plainError{errors.New("cannot encode")}), "consumer.plainError"},
		{"Joined", errors.Join(fmt.Errorf("a: %w", &pgconn.PgError{Code: "42703"}), errors.New("b")), "SQLSTATE 42703"},
	} {
		t.Run(c.name, func(t *testing.T) {
			class, ok := refusalOf(c.err)
			if ok != (c.class != "") || class != c.class {
				t.Errorf("refusalOf(%v) = %q, %t; want %q", c.err, class, ok, c.class)
			}
		})
	}
}
