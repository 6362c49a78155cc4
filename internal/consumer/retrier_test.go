package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/effect"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// scriptHandler records each message it applies in the effects table, in the transaction, unless
// fail returns an error for it.
type scriptHandler struct {
	calls atomic.Int64
	fail  func(d inbox.Delivery) error
}

func (h *scriptHandler) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	h.calls.Add(1)
	if h.fail != nil {
		if err := h.fail(d); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, d.Key)
	return err
}

// letter is a dead letter a retrier wrote.
type letter struct {
	m        kafka.Message
	reason   fault.Reason
	err      error
	attempts int
}

// retrierEnv is a partition's park in a fresh schema and what its retriers did.
type retrierEnv struct {
	t       *testing.T
	db      *pgtest.DB
	store   *inbox.Store
	keys    *parkedKeys
	handler *scriptHandler

	mu       sync.Mutex
	letters  []letter
	outcomes []string
}

const (
	parkTopic     = "payments.callbacks"
	parkPartition = 2
)

func setupRetrier(t *testing.T) *retrierEnv {
	t.Helper()
	db := pgtest.Schema(t)
	store, err := inbox.NewStore(db.Pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e := &retrierEnv{t: t, db: db, store: store, handler: &scriptHandler{}}
	e.keys, err = loadParkedKeys(context.Background(), store, parkTopic, parkPartition)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs a retrier of the park until the test ends, and returns it.
func (e *retrierEnv) start(owner string, retry Retry, c *circuit) *retrier {
	e.t.Helper()
	route := Route{Topic: parkTopic, Name: "payments", Handler: e.handler}
	log := testlog.New(e.t).With("retrier", owner)
	r := newRetrier(retrierConfig{
		store: e.store, route: route, partition: parkPartition, owner: owner, lease: time.Minute,
		retry: retry, circuit: c, keys: e.keys,
		apply: parkedEffect(e.store, route, 10*time.Second, log),
		classify: func(_ context.Context, err error) (fault.Kind, fault.Reason, time.Duration) {
			return fault.Classify(err)
		},
		deadLetter: func(_ context.Context, m kafka.Message, reason fault.Reason, err error, attempts int) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.letters = append(e.letters, letter{m, reason, err, attempts})
			return nil
		},
		finished: func(outcome string) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.outcomes = append(e.outcomes, outcome)
		},
		poll: 20 * time.Millisecond,
		log:  log,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// fastRetry retries within milliseconds, and gives a message 200ms of budget.
var fastRetry = Retry{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxElapsed: 200 * time.Millisecond}

// park parks the message of orderKey at offset as the consumer does: behind its key if the key is
// parked, else as its head, due now.
func (e *retrierEnv) park(orderKey string, offset int64) {
	e.t.Helper()
	key := fmt.Sprintf("%s@%d", orderKey, offset)
	m := kafka.Message{Offset: offset, Key: []byte(orderKey), Value: []byte(`{"event_id":"` + key + `"}`),
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}
	p := toParked(Route{Topic: parkTopic, Name: "payments"}, parkPartition, m, key, []byte(orderKey))
	ctx := context.Background()
	behind, err := e.keys.parkBehind(ctx, p)
	if err == nil && !behind {
		p.Attempts, p.Reason, p.LastError, p.FirstFailedAt = 1, fault.UnknownOrder, "no order", time.Now()
		err = e.keys.park(ctx, p, 0)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *retrierEnv) effects() []string {
	e.t.Helper()
	rows, _ := e.db.Pool.Query(context.Background(), `SELECT key FROM effects ORDER BY id`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return keys
}

func (e *retrierEnv) parkedCount() int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox_parked`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *retrierEnv) deadLetters() []letter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.letters)
}

// eventually polls cond until it returns "", failing the test with its last answer after a minute.
func eventually(t *testing.T, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *retrierEnv) waitEmpty() {
	e.t.Helper()
	eventually(e.t, func() string {
		if n := e.parkedCount(); n != 0 {
			return fmt.Sprintf("%d messages still parked", n)
		}
		return ""
	})
}

// waitOutcomes waits until n messages are finished and returns their outcomes: an outcome is
// reported after its transaction committed, a moment after the park row is gone.
func (e *retrierEnv) waitOutcomes(n int) []string {
	e.t.Helper()
	var got []string
	eventually(e.t, func() string {
		e.mu.Lock()
		defer e.mu.Unlock()
		got = slices.Clone(e.outcomes)
		if len(got) < n {
			return fmt.Sprintf("%d of %d outcomes reported", len(got), n)
		}
		return ""
	})
	return got
}

// ofKey returns the effects of orderKey's messages, in order.
func ofKey(effects []string, orderKey string) []string {
	var out []string
	for _, k := range effects {
		if len(k) > len(orderKey) && k[:len(orderKey)+1] == orderKey+"@" {
			out = append(out, k)
		}
	}
	return out
}

func TestRetrierAppliesEachKeyInOrder(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	for i, k := range []string{"A", "B", "A", "C", "A", "B"} {
		e.park(k, int64(10+i))
	}
	if n := e.keys.len(); n != 3 {
		t.Fatalf("%d keys parked, want 3", n)
	}
	e.start("o1", fastRetry, nil)
	e.waitEmpty()
	effects := e.effects()
	for k, want := range map[string][]string{"A": {"A@10", "A@12", "A@14"}, "B": {"B@11", "B@15"}, "C": {"C@13"}} {
		if got := ofKey(effects, k); !slices.Equal(got, want) {
			t.Errorf("effects of %s: %q, want %q", k, got, want)
		}
	}
	eventually(t, func() string {
		if n := e.keys.len(); n != 0 {
			return fmt.Sprintf("%d keys still marked parked", n)
		}
		return ""
	})
	if got := e.waitOutcomes(6); len(got) != 6 || slices.ContainsFunc(got, func(o string) bool { return o != "applied" }) {
		t.Errorf("outcomes %q, want 6 applied", got)
	}
}

// The head's budget runs out: it is dead-lettered with its reason, and its key's next message is
// applied.
func TestRetrierBudgetRunsOut(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	e.handler.fail = func(d inbox.Delivery) error {
		if d.Key == "A@1" {
			return fault.RetryableUntil(fault.UnknownOrder, errors.New("no order A"))
		}
		return nil
	}
	e.park("A", 1)
	e.park("A", 2)
	e.park("B", 3)
	e.start("o1", fastRetry, nil)
	e.waitEmpty()

	letters := e.deadLetters()
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := letters[0]
	if l.reason != fault.UnknownOrder || l.err == nil || l.err.Error() != "no order A" || l.attempts < 3 {
		t.Errorf("dead letter: reason %s, error %v, attempts %d; want unknown_order, its error, several attempts", l.reason, l.err, l.attempts)
	}
	if l.m.Topic != parkTopic || l.m.Partition != parkPartition || l.m.Offset != 1 || string(l.m.Key) != "A" ||
		len(l.m.Headers) != 1 || string(l.m.Headers[0].Value) != "A@1" {
		t.Errorf("dead letter of %s/%d@%d key %q headers %v, want the parked message as read", l.m.Topic, l.m.Partition,
			l.m.Offset, l.m.Key, l.m.Headers)
	}
	if got := e.effects(); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"A@2", "B@3"}) {
		t.Errorf("effects %q, want A@2 and B@3", got)
	}
}

func TestRetrierDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		before func(e *retrierEnv) // what happened before the retry
		fail   error
		reason fault.Reason
	}{
		{"Permanent", nil, fault.Permanentf(fault.InvalidPayload, "amount: not a decimal"), fault.InvalidPayload},
		{"Panic", nil, nil, fault.HandlerError},
		// The claim catches the reuse before the handler runs: the run before parking is the only one.
		{"KeyReused", func(e *retrierEnv) {
			msg := inbox.Message{Handler: "payments", Key: "A@1", Fingerprint: inbox.Fingerprint([]byte("other")), Topic: parkTopic}
			if _, err := e.store.Process(context.Background(), msg, func(context.Context, pgx.Tx) error { return nil }); err != nil {
				e.t.Fatal(err)
			}
		}, nil, fault.IdempotencyKeyReused},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setupRetrier(t)
			e.handler.fail = func(d inbox.Delivery) error {
				if d.Key != "A@1" {
					return nil
				}
				if c.name == "Panic" {
					panic("boom")
				}
				return c.fail
			}
			if c.before != nil {
				c.before(e)
			}
			e.park("A", 1)
			e.park("A", 2)
			e.start("o1", fastRetry, nil)
			e.waitEmpty()
			letters := e.deadLetters()
			attempts := 2 // one before parking, one in the park
			if c.reason == fault.IdempotencyKeyReused {
				attempts = 1
			}
			if len(letters) != 1 || letters[0].reason != c.reason || letters[0].attempts != attempts {
				t.Fatalf("dead letters %+v, want one with reason %s after %d attempts", letters, c.reason, attempts)
			}
			if got := e.effects(); !slices.Equal(got, []string{"A@2"}) {
				t.Errorf("effects %q, want A@2", got)
			}
		})
	}
}

// A key applied while its message was parked resolves as a duplicate.
func TestRetrierAppliedMeanwhile(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	e.park("A", 1)
	value := []byte(`{"event_id":"A@1"}`)
	msg := inbox.Message{Handler: "payments", Key: "A@1", Fingerprint: inbox.Fingerprint(value), Topic: parkTopic}
	if _, err := e.store.Process(context.Background(), msg, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	e.start("o1", fastRetry, nil)
	e.waitEmpty()
	if n := e.handler.calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times, want 0", n)
	}
	if got := e.waitOutcomes(1); !slices.Equal(got, []string{"duplicate"}) {
		t.Errorf("outcomes %q, want duplicate", got)
	}
}

// While the route is paused, parked messages are retried by probes only, one at a time, and no
// budget is spent however long it lasts; once a probe gets an answer, all are applied.
func TestRetrierPausedRouteChargesNothing(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	c, err := newCircuit(CircuitConfig{ProbeInterval: 2 * time.Millisecond, MaxProbeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var nonProbes, running, overlaps atomic.Int64
	e.handler.fail = func(inbox.Delivery) error {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		if state, _ := c.State(); state != RouteProbing {
			nonProbes.Add(1)
		}
		if down.Load() {
			return fault.Retryable(errors.New("provider answered 503"))
		}
		return nil
	}
	// Trip the route, as messages of other keys failing together would.
	for i := range 10 {
		p, _ := c.Allow()
		c.Record(p, strconv.Itoa(i), resultFailed)
	}
	for i, k := range []string{"A", "B", "C", "A"} {
		e.park(k, int64(i))
	}
	budget := Retry{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond, MaxElapsed: 5 * time.Millisecond}
	e.start("o1", budget, c)

	// Far more probes than the budget would allow a message.
	eventually(t, func() string {
		if n := len(e.deadLetters()); n != 0 {
			t.Fatalf("%d dead letters while the route was paused, want 0", n)
		}
		if n := e.handler.calls.Load(); n < 30 {
			return fmt.Sprintf("%d probes so far", n)
		}
		return ""
	})
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters while the route was paused, want 0", n)
	}
	var spent time.Duration
	if err := e.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(extract(epoch FROM budget_spent)), 0) * interval '1 second' FROM inbox_parked`).Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if spent != 0 {
		t.Errorf("budget spent while paused: %s, want 0", spent)
	}
	if n := nonProbes.Load(); n != 0 {
		t.Errorf("%d runs while the route was paused were not the probe", n)
	}

	down.Store(false)
	e.waitEmpty()
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
	if got := ofKey(e.effects(), "A"); !slices.Equal(got, []string{"A@0", "A@3"}) {
		t.Errorf("effects of A %q, want in order", got)
	}
	if state, _ := c.State(); state != RouteOpen {
		t.Errorf("route %v after recovery, want open", state)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d runs overlapped another", n)
	}
}

// A key that always fails retryably is dead-lettered when its budget runs out; it never pauses the
// route, and the other keys are applied meanwhile.
func TestRetrierPoisonKeyDoesNotPause(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	var changes atomic.Int64
	c, err := newCircuit(CircuitConfig{OnChange: func(RouteState, RouteState, string) { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	e.handler.fail = func(d inbox.Delivery) error {
		if d.Key == "P@0" {
			return fault.Retryable(errors.New("provider answered 503 for this one"))
		}
		return nil
	}
	e.park("P", 0)
	for i := range 20 {
		e.park(fmt.Sprint("K", i), int64(1+i))
	}
	e.start("o1", fastRetry, c)
	e.waitEmpty()
	if n := changes.Load(); n != 0 {
		t.Errorf("the route changed state %d times, want never", n)
	}
	if letters := e.deadLetters(); len(letters) != 1 || letters[0].reason != fault.RetriesExhausted {
		t.Errorf("dead letters %+v, want P@0's, retries_exhausted", letters)
	}
	if n := len(e.effects()); n != 20 {
		t.Errorf("%d applied, want 20", n)
	}
}

// A retrier that stops gives its claims up: the partition's next owner takes them at once.
func TestRetrierStopReleasesClaims(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	started := make(chan struct{})
	var once sync.Once
	e.handler.fail = func(d inbox.Delivery) error {
		once.Do(func() { close(started) })
		return fault.Retryable(errors.New("slow"))
	}
	e.park("A", 1)
	route := Route{Topic: parkTopic, Name: "payments", Handler: e.handler}
	log := testlog.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	r := newRetrier(retrierConfig{
		store: e.store, route: route, partition: parkPartition, owner: "old", lease: time.Hour,
		retry: Retry{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxElapsed: 10 * time.Hour}, keys: e.keys,
		apply: func(ctx context.Context, p inbox.Parked) (inbox.Outcome, error) {
			// Hold the claim until stopped, as a slow attempt would.
			_ = e.handler.fail(inbox.Delivery{Key: p.IdempotencyKey})
			<-ctx.Done()
			return "", ctx.Err()
		},
		classify: func(_ context.Context, err error) (fault.Kind, fault.Reason, time.Duration) {
			return fault.Classify(err)
		},
		deadLetter: func(context.Context, kafka.Message, fault.Reason, error, int) error { return nil },
		poll:       10 * time.Millisecond, log: log,
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	<-started
	taken, err := e.store.TakeDue(context.Background(), parkTopic, parkPartition, "new", time.Minute, 10)
	if err != nil || len(taken) != 0 {
		t.Fatalf("the new owner took %d while the old one held it (%v)", len(taken), err)
	}
	cancel()
	<-done
	taken, err = e.store.TakeDue(context.Background(), parkTopic, parkPartition, "new", time.Minute, 10)
	if err != nil || len(taken) != 1 || taken[0].Attempts != 1 {
		t.Errorf("after the stop the new owner took %+v, %v; want the message, no attempt counted", taken, err)
	}
}

// Two owners at once (a rebalance in progress): each message applied once, each key in order.
func TestRetrierTwoOwners(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	for i := range 30 {
		for j := range 3 {
			e.park(fmt.Sprint("K", i), int64(100*j+i))
		}
	}
	e.start("o1", fastRetry, nil)
	e.start("o2", fastRetry, nil)
	e.waitEmpty()
	effects := e.effects()
	if len(effects) != 90 || len(slices.Compact(slices.Sorted(slices.Values(effects)))) != 90 {
		t.Fatalf("%d effects, want 90 distinct", len(effects))
	}
	for i := range 30 {
		k := fmt.Sprint("K", i)
		want := []string{fmt.Sprintf("%s@%d", k, i), fmt.Sprintf("%s@%d", k, 100+i), fmt.Sprintf("%s@%d", k, 200+i)}
		if got := ofKey(effects, k); !slices.Equal(got, want) {
			t.Errorf("effects of %s: %q, want %q", k, got, want)
		}
	}
}

// A parked message whose retries killed its retrier crashLoopStarts times in a row is dead-lettered
// as a crash loop without running again; its key's next message goes on.
func TestRetrierCrashLoop(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	e.park("A", 1)
	e.park("A", 2)
	if _, err := e.db.Pool.Exec(context.Background(),
		`UPDATE inbox_parked SET starts = $1 WHERE "offset" = 1`, crashLoopStarts); err != nil {
		t.Fatal(err)
	}
	e.start("o1", fastRetry, nil)
	e.waitEmpty()
	letters := e.deadLetters()
	if len(letters) != 1 || letters[0].reason != fault.CrashLoop || letters[0].m.Offset != 1 {
		t.Fatalf("dead letters %+v, want A@1's, crash_loop", letters)
	}
	if got := e.effects(); !slices.Equal(got, []string{"A@2"}) {
		t.Errorf("effects %q, want A@2 only: A@1 is not run again", got)
	}
	if n := e.handler.calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (A@2)", n)
	}
}

// callRecorder is a CallHandler: its call records the key it was made for, and its completion
// writes the effect, in the inbox transaction.
type callRecorder struct {
	mu    sync.Mutex
	calls []string
	fail  func(d inbox.Delivery) error
}

func (h *callRecorder) Check(context.Context, pgx.Tx, inbox.Delivery) error { return nil }

func (h *callRecorder) Call(_ context.Context, d inbox.Delivery) (effect.Completion, error) {
	h.mu.Lock()
	h.calls = append(h.calls, d.Key)
	h.mu.Unlock()
	if h.fail != nil {
		if err := h.fail(d); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, d.Key)
		return err
	}, nil
}

// A route whose effect is a call goes through the call's three steps from the park too: the parked
// message leaves the park in the completion's transaction, and a key applied already is not called.
func TestRetrierCallHandler(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	var failures atomic.Int64
	h := &callRecorder{fail: func(d inbox.Delivery) error {
		if d.Key == "A@1" && failures.Add(1) <= 2 {
			return fault.Retryable(errors.New("provider answered 503"))
		}
		return nil
	}}
	// B@3 was applied by another delivery while it was parked.
	value := []byte(`{"event_id":"B@3"}`)
	if _, err := e.store.Process(context.Background(), inbox.Message{Handler: "payments", Key: "B@3",
		Fingerprint: inbox.Fingerprint(value), Topic: parkTopic}, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	e.park("A", 1)
	e.park("A", 2)
	e.park("B", 3)

	route := Route{Topic: parkTopic, Name: "payments", Handler: h}
	log := testlog.New(t)
	r := newRetrier(retrierConfig{
		store: e.store, route: route, partition: parkPartition, owner: "o", lease: time.Minute,
		retry: fastRetry, keys: e.keys,
		apply: parkedEffect(e.store, route, 10*time.Second, log),
		classify: func(_ context.Context, err error) (fault.Kind, fault.Reason, time.Duration) {
			return fault.Classify(err)
		},
		deadLetter: func(context.Context, kafka.Message, fault.Reason, error, int) error {
			t.Error("dead-lettered")
			return nil
		},
		poll: 10 * time.Millisecond, log: log,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	e.waitEmpty()
	cancel()
	<-done
	if got := e.effects(); !slices.Equal(got, []string{"A@1", "A@2"}) {
		t.Errorf("effects %q, want A@1 then A@2", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if slices.Contains(h.calls, "B@3") {
		t.Errorf("calls %q: B@3, applied already, was called", h.calls)
	}
	if n := len(ofKey(h.calls, "A")); n != 4 {
		t.Errorf("calls %q, want A@1 three times and A@2 once", h.calls)
	}
}
