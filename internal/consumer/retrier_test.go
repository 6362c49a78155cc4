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

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
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
	m kafka.Message
	deadletter.Letter
}

// retrierEnv is a partition's park in a fresh schema, a broker for its dead letters, and what its
// retriers did.
type retrierEnv struct {
	t       *testing.T
	db      *pgtest.DB
	kafka   *kafkatest.Cluster
	store   *inbox.Store
	keys    *parkedKeys
	handler *scriptHandler
	metrics *Metrics
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
	e := &retrierEnv{t: t, db: db, store: store, handler: &scriptHandler{},
		kafka:   kafkatest.Start(t, parkPartition+1, parkTopic, parkTopic+".dlq"),
		metrics: NewMetrics(prometheus.NewRegistry())}
	e.keys, err = loadParkedKeys(context.Background(), store, parkTopic, parkPartition)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// retrierOf is the retrier of the test partition for a consumer of e's park whose route has
// handler h (e.handler when nil), as the owner named owner, with retry and the route's circuit
// configured by cc.
func (e *retrierEnv) retrierOf(owner string, retry Retry, cc gate.CircuitConfig, h any) *retrier {
	e.t.Helper()
	route := Route{Topic: parkTopic, Name: "payments", Handler: e.handler}
	switch h := h.(type) {
	case inboxtype.CallHandler:
		route.Handler, route.Call = nil, h
	case inboxtype.Handler:
		route.Handler = h
	}
	log := testlog.New(e.t).With("retrier", owner)
	c, err := New(Config{
		Brokers: []string{e.kafka.Addr}, Routes: []Route{route},
		Retry: retry, ParkLease: time.Minute, Circuit: cc, Store: e.store,
		DeadLetters: deadletter.NewStore(e.db.Pool), Metrics: e.metrics, Logger: log,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.closeConnections)
	p := &partition{c: c, route: c.routes[parkTopic], topic: parkTopic, id: parkPartition, log: log,
		parked: e.keys, stopping: make(chan struct{})}
	p.retrier = newRetrier(p, owner)
	p.retrier.poll = 20 * time.Millisecond
	return p.retrier
}

// start runs a retrier of the park until the test ends, and returns it.
func (e *retrierEnv) start(owner string, retry Retry, cc gate.CircuitConfig) *retrier {
	e.t.Helper()
	r := e.retrierOf(owner, retry, cc, nil)
	e.run(r)
	return r
}

// run runs r until the test ends.
func (e *retrierEnv) run(r *retrier) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx, ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
}

// fastRetry retries within milliseconds, with a budget no test spends, however slow the machine;
// spentRetry spends its budget within a second, in two attempts at least (the policy retries a
// first failure, however long it took).
var (
	fastRetry  = Retry{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxElapsed: time.Minute}
	spentRetry = Retry{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxElapsed: time.Second}
)

// park parks the message of orderKey at offset as the consumer does: behind its key if the key is
// parked, else as its head, due now.
func (e *retrierEnv) park(orderKey string, offset int64) {
	e.t.Helper()
	key := fmt.Sprintf("%s@%d", orderKey, offset)
	m := kafka.Message{Offset: offset, Key: []byte(orderKey), Value: []byte(`{"event_id":"` + key + `"}`),
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}
	p := toParked(Route{Topic: parkTopic, Name: "payments"}, parkPartition, &entry{msg: m, key: key, order: orderKey})
	ctx := context.Background()
	behind, err := e.keys.parkBehind(ctx, p)
	if err == nil && !behind {
		p.Attempts, p.Reason, p.LastError, p.FirstFailedAt = 1, reasonUnknownOrder, "no order", time.Now()
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
	e.t.Helper()
	var out []letter
	for p := range parkPartition + 1 {
		for _, m := range e.kafka.ReadAll(e.t, parkTopic+".dlq", p) {
			l, original := deadletter.Read(m.Headers)
			m.Headers = original
			out = append(out, letter{m: m, Letter: l})
		}
	}
	return out
}

// eventually polls cond until it returns "", failing the test with its last answer after a minute.
func eventually(t *testing.T, cond func() string) {
	t.Helper()
	poll.Until(t, cond)
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

// waitOutcomes waits until n messages are finished and returns how many finished with each
// outcome: an outcome is counted after its transaction committed, a moment after the park row is
// gone.
func (e *retrierEnv) waitOutcomes(n int) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	eventually(e.t, func() string {
		total := 0
		for _, o := range outcomes {
			got[o] = int(testutil.ToFloat64(e.metrics.Messages.WithLabelValues(parkTopic, o)))
			total += got[o]
		}
		if total < n {
			return fmt.Sprintf("%d of %d outcomes counted", total, n)
		}
		return ""
	})
	var handled dto.Metric
	if err := e.metrics.Handle.WithLabelValues(parkTopic).(prometheus.Metric).Write(&handled); err != nil {
		e.t.Fatal(err)
	}
	total := 0
	for _, o := range outcomes {
		total += int(testutil.ToFloat64(e.metrics.Messages.WithLabelValues(parkTopic, o)))
	}
	if n := handled.GetHistogram().GetSampleCount(); n != uint64(total) {
		e.t.Errorf("inboxworker_handle_seconds observed %d messages; %d finished", n, total)
	}
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
	e.start("o1", fastRetry, gate.CircuitConfig{})
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
	if got := e.waitOutcomes(6); got["applied"] != 6 {
		t.Errorf("outcomes %v, want 6 applied", got)
	}
}

// The head's budget runs out: it is dead-lettered with its reason, and its key's next message is
// applied.
func TestRetrierBudgetRunsOut(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	e.handler.fail = func(d inbox.Delivery) error {
		if d.Key == "A@1" {
			return fault.RetryableUntil(reasonUnknownOrder, errors.New("no order A"))
		}
		return nil
	}
	e.park("A", 1)
	e.park("A", 2)
	e.park("B", 3)
	e.start("o1", spentRetry, gate.CircuitConfig{})
	e.waitEmpty()

	letters := e.deadLetters()
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := letters[0]
	if l.Reason != reasonUnknownOrder || l.Error != "no order A" || l.Attempts < 2 {
		t.Errorf("dead letter: reason %s, error %q, attempts %d; want unknown_order, its error, several attempts", l.Reason, l.Error, l.Attempts)
	}
	if l.Topic != parkTopic || l.Partition != parkPartition || l.Offset != 1 || string(l.m.Key) != "A" ||
		len(l.m.Headers) != 1 || string(l.m.Headers[0].Value) != "A@1" {
		t.Errorf("dead letter of %s/%d@%d key %q headers %v, want the parked message as read", l.Topic, l.Partition,
			l.Offset, l.m.Key, l.m.Headers)
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
		reason inboxtype.Reason
	}{
		{"Permanent", nil, fault.Permanent(inboxtype.InvalidPayload, errors.New("amount: not a decimal")), inboxtype.InvalidPayload},
		{"Panic", nil, nil, inboxtype.HandlerError},
		// The claim catches the reuse before the handler runs: the run before parking is the only one.
		{"KeyReused", func(e *retrierEnv) {
			msg := inbox.Message{Handler: "payments", Key: "A@1", Fingerprint: inbox.Fingerprint([]byte("other")), Topic: parkTopic}
			if _, err := e.store.Process(context.Background(), msg, func(context.Context, pgx.Tx) error { return nil }); err != nil {
				e.t.Fatal(err)
			}
		}, nil, inboxtype.IdempotencyKeyReused},
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
			e.start("o1", fastRetry, gate.CircuitConfig{})
			e.waitEmpty()
			letters := e.deadLetters()
			attempts := 2 // one before parking, one in the park
			if c.reason == inboxtype.IdempotencyKeyReused {
				attempts = 1
			}
			if len(letters) != 1 || letters[0].Reason != c.reason || letters[0].Attempts != attempts {
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
	e.start("o1", fastRetry, gate.CircuitConfig{})
	e.waitEmpty()
	if n := e.handler.calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times, want 0", n)
	}
	if got := e.waitOutcomes(1); got["duplicate"] != 1 {
		t.Errorf("outcomes %v, want a duplicate", got)
	}
}

// While the route is paused, parked messages are retried by probes only, one at a time, and no
// budget is spent however long it lasts; once a probe gets an answer, all are applied.
func TestRetrierPausedRouteChargesNothing(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	budget := Retry{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond, MaxElapsed: 5 * time.Millisecond}
	r := e.retrierOf("o1", budget, gate.CircuitConfig{ProbeInterval: 2 * time.Millisecond, MaxProbeInterval: 10 * time.Millisecond}, nil)
	g := r.p.route.gate
	// allow is the gate's permit now, if it gives one.
	allow := func() (gate.Permit, bool) {
		p, ok, _ := g.PermitFor(t.Context(), nil, func() bool { return true })
		return p, ok
	}
	var down atomic.Bool
	down.Store(true)
	var nonProbes, running, overlaps atomic.Int64
	e.handler.fail = func(inbox.Delivery) error {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		if g.State() != gate.RouteProbing {
			nonProbes.Add(1)
		}
		if down.Load() {
			return fault.Retryable(errors.New("provider answered 503"))
		}
		return nil
	}
	// Trip the route, as messages of other keys failing together would, and confirm the outage
	// with a probe of another key.
	for i := range 10 {
		p, _ := allow()
		g.Record(p, strconv.Itoa(i), gate.SignalFailed)
	}
	var probe gate.Permit
	poll.For(t, "the circuit's first probe", func() bool {
		var ok bool
		probe, ok = allow()
		return ok
	})
	g.Record(probe, "another", gate.SignalFailed)
	for i, k := range []string{"A", "B", "C", "A"} {
		e.park(k, int64(i))
	}
	e.run(r)

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
	if state := g.State(); state != gate.RouteOpen {
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
	e.start("o1", spentRetry, gate.CircuitConfig{})
	e.waitEmpty()
	if n := testutil.ToFloat64(e.metrics.Pauses.WithLabelValues(parkTopic, gate.PausedOutage)); n != 0 {
		t.Errorf("the route paused %v times, want never", n)
	}
	if letters := e.deadLetters(); len(letters) != 1 || letters[0].Reason != inboxtype.RetriesExhausted {
		t.Errorf("dead letters %+v, want P@0's, retries_exhausted", letters)
	}
	if n := len(e.effects()); n != 20 {
		t.Errorf("%d applied, want 20", n)
	}
}

// blocker is a handler whose every run waits until its attempt is cancelled, as a slow attempt
// would; started is closed at its first run.
type blocker struct {
	once    sync.Once
	started chan struct{}
}

func (h *blocker) Handle(ctx context.Context, _ pgx.Tx, _ inbox.Delivery) error {
	h.once.Do(func() { close(h.started) })
	<-ctx.Done()
	return ctx.Err()
}

// A retrier that stops gives its holds up: the partition's next owner takes them at once, with no
// attempt counted for the one its stop cut short.
func TestRetrierStopReleasesHolds(t *testing.T) {
	t.Parallel()
	e := setupRetrier(t)
	h := &blocker{started: make(chan struct{})}
	e.park("A", 1)
	r := e.retrierOf("old", Retry{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxElapsed: 10 * time.Hour},
		gate.CircuitConfig{}, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx, ctx)
	}()
	<-h.started
	taken, err := e.store.Park().TakeDue(context.Background(), parkTopic, parkPartition, "new", time.Minute, 10)
	if err != nil || len(taken) != 0 {
		t.Fatalf("the new owner took %d while the old one held it (%v)", len(taken), err)
	}
	cancel()
	<-done
	taken, err = e.store.Park().TakeDue(context.Background(), parkTopic, parkPartition, "new", time.Minute, 10)
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
	e.start("o1", fastRetry, gate.CircuitConfig{})
	e.start("o2", fastRetry, gate.CircuitConfig{})
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
	e.start("o1", fastRetry, gate.CircuitConfig{})
	e.waitEmpty()
	letters := e.deadLetters()
	if len(letters) != 1 || letters[0].Reason != inboxtype.CrashLoop || letters[0].Offset != 1 {
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

func (h *callRecorder) Call(_ context.Context, d inbox.Delivery) (inbox.Effect, error) {
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

	e.run(e.retrierOf("o", fastRetry, gate.CircuitConfig{}, h))
	e.waitEmpty()
	if letters := e.deadLetters(); len(letters) != 0 {
		t.Errorf("dead letters %+v, want none", letters)
	}
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
