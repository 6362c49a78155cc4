package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
)

// byKeyModes are the modes that park: Ordering ByKey, in both transaction modes.
var byKeyModes = []testMode{{consumer.PerMessage, consumer.ByKey}, {consumer.PerBatch, consumer.ByKey}}

func forEachParkingMode(t *testing.T, test func(t *testing.T, mode testMode)) {
	t.Helper()
	for _, mode := range byKeyModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

// unknownOrder fails the deliveries whose key match says, as the payment handler fails a callback
// that overtook its order, until exists (when given) is set.
func unknownOrder(match func(key string) bool, exists *atomic.Bool) func(inbox.Delivery) error {
	return func(d inbox.Delivery) error {
		if match(d.Key) && (exists == nil || !exists.Load()) {
			return fault.RetryableUntil(reasonUnknownOrder, fmt.Errorf("no order for %s", d.Key))
		}
		return nil
	}
}

// failUntil is unknownOrder for one key.
func failUntil(key string, exists *atomic.Bool) func(inbox.Delivery) error {
	return unknownOrder(func(k string) bool { return k == key }, exists)
}

func isLate(key string) bool { return strings.HasPrefix(key, "late") }

// parkSoon makes config park a message after 20ms of retries in place, with a lease that lapses
// within seconds of a worker's death (its routes' attempts bounded by 2s).
func parkSoon(config *consumer.Config) {
	config.ParkAfter = 20 * time.Millisecond
	for i := range config.Routes {
		config.Routes[i].Timeout = 2 * time.Second
	}
	config.ParkLease = 3 * time.Second
}

// parkedKeys returns the idempotency keys in the park, in offset order.
func (e *env) parkedKeys() []string {
	e.t.Helper()
	rows, _ := e.db.Pool.Query(context.Background(), `SELECT idempotency_key FROM inbox_parked ORDER BY "partition", "offset"`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return keys
}

// appliedMatching returns the keys applied that match, in the order their effects were written.
func (e *env) appliedMatching(match func(string) bool) []string {
	e.t.Helper()
	return slices.DeleteFunc(e.appliedInOrder(), func(k string) bool { return !match(k) })
}

// TestParkOvertakingCallback: a callback that overtakes its order is parked, and so are the later
// callbacks of its order; the rest of the partition is applied and committed meanwhile; once the
// order exists, the order's callbacks are applied, in order, once.
func TestParkOvertakingCallback(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, testParkOvertakingCallback)
}

func testParkOvertakingCallback(t *testing.T, mode testMode) {
	// One partition: without parking, everything would wait behind the first callback.
	e := setup(t, mode, 1)
	var exists atomic.Bool
	config := e.config(&recorder{fail: unknownOrder(isLate, &exists)})
	parkSoon(&config)
	config.Retry.MaxElapsed = 10 * time.Minute

	e.produceOrdered("order-late", "late-1")
	before := keys("before", 30)
	e.produce(before...)
	e.produceOrdered("order-late", "late-2", "late-3")
	after := keys("after", 30)
	e.produce(after...)
	all := slices.Concat([]string{"late-1", "late-2", "late-3"}, before, after)
	e.start(config)

	e.waitFor("the rest of the partition applied, every offset committed", func() bool {
		return len(e.effects()) == len(before)+len(after) && e.committed() == int64(len(all))
	})
	if got := e.parkedKeys(); !slices.Equal(got, []string{"late-1", "late-2", "late-3"}) {
		t.Fatalf("parked %q, want the order's callbacks in offset order", got)
	}
	if got := e.effects(); got["late-1"]+got["late-2"]+got["late-3"] != 0 {
		t.Fatalf("a callback of the order was applied before the order existed: %v", got)
	}
	e.waitFor("the parked gauge", func() bool {
		return testutil.ToFloat64(config.Metrics.Parked.WithLabelValues(topic)) == 3
	})

	exists.Store(true)
	e.waitFor("the order's callbacks applied", func() bool { return len(e.parkedKeys()) == 0 })
	checkOnce(t, e, all)
	if got := e.appliedMatching(isLate); !slices.Equal(got, []string{"late-1", "late-2", "late-3"}) {
		t.Errorf("the order's callbacks applied in the order %q", got)
	}
	// The outcome is counted after its transaction committed, a moment after the park row is gone.
	e.waitFor("every message counted as applied", func() bool { return outcomes(config, "applied") >= float64(len(all)) })
	if got := outcomes(config, "applied"); got != float64(len(all)) {
		t.Errorf("%v applied, want %d", got, len(all))
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	e.waitFor("the parked gauge back at 0", func() bool {
		return testutil.ToFloat64(config.Metrics.Parked.WithLabelValues(topic)) == 0
	})
}

// TestParkedOriginReused: the park already holds a message at the origin (topic, partition,
// offset) of a message about to be parked — a message of an earlier incarnation of the topic,
// whose offsets started again (a recreated topic, worker dev restarted on a kept database). The new
// message is parked beside it, never acknowledged without a row of its own, and both are applied
// once their orders exist.
func TestParkedOriginReused(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		var exists atomic.Bool
		config := e.config(&recorder{fail: unknownOrder(isLate, &exists)})
		parkSoon(&config)
		config.Retry.MaxElapsed = 10 * time.Minute
		stale := inbox.Parked{Handler: handler, Topic: topic, Partition: 0, Offset: 0,
			OrderingKey: []byte("korder-late-x"), IdempotencyKey: "late-x", MessageKey: []byte("order-late-x"),
			Value: eventValue("late-x", 0)}
		if _, err := config.Store.Park().Add(context.Background(), stale, 0); err != nil {
			t.Fatal(err)
		}

		e.produceOrdered("order-late-z", "late-z") // at offset 0, the stale message's origin
		after := keys("after", 5)
		e.produce(after...)
		e.start(config)
		e.waitFor("every offset committed", func() bool { return e.committed() == int64(1+len(after)) })
		if got := e.parkedKeys(); !slices.Contains(got, "late-z") {
			t.Fatalf("parked %q: late-z was acknowledged without a row in the park", got)
		}

		exists.Store(true)
		e.waitFor("the park emptied", func() bool { return len(e.parkedKeys()) == 0 })
		checkOnce(t, e, append([]string{"late-x", "late-z"}, after...))
	})
}

// TestParkSurvivesKill: a parked message outlives the worker that parked it, killed with SIGKILL
// once the offsets past the message are committed; the next worker applies it once.
func TestParkSurvivesKill(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, testParkSurvivesKill)
}

func testParkSurvivesKill(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	child := e.startChild(dieInHandler, "boom", childParked+"=late-1")
	e.produceOrdered("order-late", "late-1")
	others := keys("x", 5)
	e.produce(others...)
	e.waitFor("late-1 parked, the offsets past it committed", func() bool {
		return slices.Equal(e.parkedKeys(), []string{"late-1"}) && e.committed() == int64(1+len(others))
	})
	e.produce("boom") // the worker dies in its handler
	if !child.killed(t) {
		t.Fatal("the worker was not killed")
	}
	if got := e.parkedKeys(); !slices.Equal(got, []string{"late-1"}) {
		t.Fatalf("parked %q after the kill, want late-1", got)
	}

	var exists atomic.Bool
	exists.Store(true)
	config := e.config(&recorder{fail: failUntil("late-1", &exists)})
	parkSoon(&config)
	e.start(config)
	e.waitFor("everything applied and committed", func() bool {
		return len(e.parkedKeys()) == 0 && e.committed() == int64(2+len(others))
	})
	checkOnce(t, e, slices.Concat([]string{"late-1", "boom"}, others))
}

// TestParkSurvivesRebalance: the partition of a parked key moves to another worker, which takes
// the key over and applies its messages once, in order.
func TestParkSurvivesRebalance(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, testParkSurvivesRebalance)
}

func testParkSurvivesRebalance(t *testing.T, mode testMode) {
	e := setup(t, mode, 4)
	var exists atomic.Bool
	h := &recorder{fail: unknownOrder(isLate, &exists)}
	// Leaving the group can take kafka-go's 30 s rebalance timeout on the test broker (a JoinGroup
	// held while the broker completes a rebalance): the parked key must not run out of budget while
	// the test waits for the first worker to stop.
	longBudget := func(config *consumer.Config) {
		parkSoon(config)
		config.Retry.MaxElapsed = 5 * time.Minute
	}
	first := e.config(h)
	longBudget(&first)
	_, stopFirst := e.start(first)
	e.produceOrdered("order-late", "late-1", "late-2")
	others := keys("x", 40)
	e.produce(others...)
	e.waitFor("the order's callbacks parked, the others applied", func() bool {
		return len(e.parkedKeys()) == 2 && len(e.effects()) == len(others)
	})

	secondConfig := e.config(h)
	longBudget(&secondConfig)
	second, _ := e.start(secondConfig)
	e.waitFor("the second worker to join", second.Ready)
	stopFirst() // the second takes every partition, the parked key's among them

	exists.Store(true)
	e.waitFor("the order's callbacks applied", func() bool { return len(e.parkedKeys()) == 0 })
	checkOnce(t, e, slices.Concat([]string{"late-1", "late-2"}, others))
	if got := e.appliedMatching(isLate); !slices.Equal(got, []string{"late-1", "late-2"}) {
		t.Errorf("the order's callbacks applied in the order %q", got)
	}
}

// TestParkBudgetRunsOut: a parked message whose retry budget runs out is dead-lettered with its
// reason, its original headers and the dlq-* headers; its key's next message is then applied.
func TestParkBudgetRunsOut(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, testParkBudgetRunsOut)
}

func testParkBudgetRunsOut(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	config := e.config(&recorder{fail: failUntil("late-1", nil)})
	parkSoon(&config)
	config.Retry.MaxElapsed = 300 * time.Millisecond
	withKey := func(key string, seq int) kafka.Message {
		return kafka.Message{Key: []byte("order-late"), Value: eventValue(key, seq),
			Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}, {Key: "trace", Value: []byte("t-" + key)}}}
	}
	e.kafka.Produce(t, topic, withKey("late-1", 0), withKey("late-2", 1))
	others := keys("x", 10)
	e.produce(others...)
	e.start(config)

	e.waitFor("late-1 dead-lettered, the rest applied", func() bool {
		return len(e.deadLetters()) == 1 && len(e.effects()) == 1+len(others) && len(e.parkedKeys()) == 0
	})
	checkOnce(t, e, append([]string{"late-2"}, others...))
	m := e.deadLetters()[0]
	if string(m.Key) != "order-late" || string(m.Value) != string(eventValue("late-1", 0)) {
		t.Errorf("dead letter key %q value %q, want the original's", m.Key, m.Value)
	}
	for h, want := range map[string]string{
		"Idempotency-Key": "late-1", "trace": "t-late-1", "dlq-reason": "unknown_order",
		"dlq-original-topic": topic, "dlq-original-partition": "0", "dlq-original-offset": "0",
	} {
		if got := kafkatest.Header(m, h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if got := kafkatest.Header(m, "dlq-error"); !strings.Contains(got, "no order for late-1") {
		t.Errorf("dlq-error %q, want the handler's error", got)
	}
	var attempts int
	if _, err := fmt.Sscan(kafkatest.Header(m, "dlq-attempts"), &attempts); err != nil || attempts < 2 {
		t.Errorf("dlq-attempts %q, want the runs in place and in the park", kafkatest.Header(m, "dlq-attempts"))
	}
	if _, err := time.Parse(time.RFC3339, kafkatest.Header(m, "dlq-failed-at")); err != nil {
		t.Errorf("dlq-failed-at: %v", err)
	}
	e.waitFor("the dead letter counted", func() bool { return outcomes(config, "dead_lettered") >= 1 })
	if got := outcomes(config, "dead_lettered"); got != 1 {
		t.Errorf("%v counted dead-lettered, want 1", got)
	}
}

// provider is a test handler that stands for an SMS gateway: it answers 503 while down, and
// notes how it was called while the route was paused.
type provider struct {
	recorder
	down     atomic.Bool
	paused   func() bool // whether the route is paused
	calls    atomic.Int64
	whenDown atomic.Int64 // calls while down
	onPause  atomic.Int64 // calls while the route was paused: probes
	running  atomic.Int64
	overlaps atomic.Int64 // calls while the route was paused and another call was running
}

func (h *provider) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	h.calls.Add(1)
	paused := h.paused()
	if h.running.Add(1) > 1 && paused {
		h.overlaps.Add(1)
	}
	defer h.running.Add(-1)
	if h.down.Load() {
		h.whenDown.Add(1)
		if paused {
			h.onPause.Add(1)
		}
		return fault.Retryable(errors.New("provider answered 503"))
	}
	return h.recorder.Handle(ctx, tx, d)
}

// TestProviderOutagePausesRoute: a provider down for 4 times the retry budget pauses the route
// after a few failures across keys; while it is paused only probes call it, one at a time; nothing
// is dead-lettered; once it is back every message is applied once, each key in order.
func TestProviderOutagePausesRoute(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 2)
	h := &provider{}
	config := e.config(h)
	h.paused = func() bool { return testutil.ToFloat64(config.Metrics.Paused.WithLabelValues(topic, "outage")) == 1 }
	parkSoon(&config)
	config.ParkAfter = 100 * time.Millisecond
	config.Retry = consumer.Retry{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond,
		MaxElapsed: time.Second}
	config.Circuit = gate.CircuitConfig{ProbeInterval: 20 * time.Millisecond, MaxProbeInterval: 200 * time.Millisecond}
	h.down.Store(true)

	var all []string
	for i := range 20 {
		ks := []string{fmt.Sprintf("p%02d-a", i), fmt.Sprintf("p%02d-b", i), fmt.Sprintf("p%02d-c", i)}
		e.produceOrdered(fmt.Sprintf("phone-%02d", i), ks...)
		all = append(all, ks...)
	}
	c, _ := e.start(config)
	e.waitFor("the route paused", func() bool {
		return testutil.ToFloat64(config.Metrics.Pauses.WithLabelValues(topic, "outage")) >= 1
	})
	time.Sleep(4 * config.Retry.MaxElapsed) // the outage: four retry budgets
	if n := outcomes(config, "dead_lettered"); n != 0 {
		t.Fatalf("%v dead-lettered during the outage, want none", n)
	}
	if !c.Ready() {
		t.Error("the worker left its group while its route was paused")
	}
	down := h.whenDown.Load()
	h.down.Store(false)

	e.waitFor("everything applied", func() bool { return len(e.effects()) == len(all) })
	checkOnce(t, e, all)
	for i := range 20 {
		prefix := fmt.Sprintf("p%02d-", i)
		got := e.appliedMatching(func(k string) bool { return strings.HasPrefix(k, prefix) })
		if want := []string{prefix + "a", prefix + "b", prefix + "c"}; !slices.Equal(got, want) {
			t.Errorf("phone %d's messages applied in the order %q", i, got)
		}
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	t.Logf("provider calls while it was down: %d, %d of them probes of the paused route", down, h.onPause.Load())
	if n := h.overlaps.Load(); n != 0 {
		t.Errorf("%d calls while the route was paused ran beside another: only one probe at a time", n)
	}
	// Without the pause: 60 messages retried every few milliseconds for 3s.
	if down > 60 {
		t.Errorf("%d provider calls while it was down, want a few failures and the probes", down)
	}
	e.waitFor("the route open again", func() bool { return !h.paused() })
}

// TestPoisonKeyDoesNotPause: one key failing retryably forever is that key's problem: the route is
// never paused, the other keys flow, and the key is dead-lettered when its budget runs out.
func TestPoisonKeyDoesNotPause(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			if d.Key == "poison" {
				return fault.Retryable(errors.New("provider answered 503 for this one"))
			}
			return nil
		}})
		parkSoon(&config)
		config.Retry = consumer.Retry{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond,
			MaxElapsed: time.Second}
		e.produce("poison")
		others := keys("x", 100)
		e.produce(others...)
		e.start(config)
		e.waitFor("the poison dead-lettered, the rest applied", func() bool {
			return len(e.deadLetters()) == 1 && len(e.effects()) == len(others)
		})
		if got := kafkatest.Header(e.deadLetters()[0], "dlq-reason"); got != "retries_exhausted" {
			t.Errorf("dlq-reason %q, want retries_exhausted", got)
		}
		if n := testutil.ToFloat64(config.Metrics.Pauses.WithLabelValues(topic, "outage")); n != 0 {
			t.Errorf("the route paused %v times, want never", n)
		}
		checkOnce(t, e, others)
	})
}

// TestParkDatabaseOutage: while Postgres is unreachable a parked message waits, its budget
// untouched, for longer than the budget; it is applied once the database and its order are back.
func TestParkDatabaseOutage(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	proxy, pool, store := e.behindProxy()
	var exists atomic.Bool
	config := testConfig(e.kafka.Addr, pool, store, &recorder{fail: failUntil("late-1", &exists)}, e.mode, e.log)
	parkSoon(&config)
	config.Retry.MaxElapsed = 2 * time.Second
	e.produceOrdered("order-late", "late-1")
	others := keys("x", 10)
	e.produce(others...)
	e.start(config)
	e.waitFor("late-1 parked, the rest applied", func() bool {
		return slices.Equal(e.parkedKeys(), []string{"late-1"}) && len(e.effects()) == len(others)
	})

	proxy.Cut()
	time.Sleep(2 * config.Retry.MaxElapsed) // the outage: twice the budget
	proxy.Restore()
	exists.Store(true)
	e.waitFor("late-1 applied", func() bool { return len(e.parkedKeys()) == 0 })
	checkOnce(t, e, append([]string{"late-1"}, others...))
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}

// TestByPartitionParksNothing: with Ordering ByPartition a stuck message is retried in place, its
// partition waiting behind it, as before parking existed.
func TestByPartitionParksNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByPartition}, 1)
	var exists atomic.Bool
	var tries atomic.Int64
	fail := failUntil("late-1", &exists)
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "late-1" && tries.Add(1) == 20 {
			exists.Store(true)
		}
		return fail(d)
	}})
	parkSoon(&config)
	e.produceOrdered("order-late", "late-1")
	e.produce(keys("x", 5)...)
	e.start(config)
	e.waitFor("everything applied", func() bool { return len(e.effects()) == 6 })
	if got := e.appliedInOrder(); got[0] != "late-1" {
		t.Errorf("applied in the order %q, want late-1 first", got)
	}
	if n := tries.Load(); n < 20 {
		t.Errorf("late-1 tried %d times, want retried in place until it applied", n)
	}
}

// TestParkMetricsAtZero: the park's and the route's gauges are there, at 0, for every route, before
// anything is parked or paused.
func TestParkMetricsAtZero(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	config := e.config(&recorder{})
	if _, err := consumer.New(config); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*prometheus.GaugeVec{config.Metrics.Parked, config.Metrics.Oldest} {
		if n := testutil.CollectAndCount(g); n != 1 {
			t.Errorf("%d series, want one for the route", n)
		}
		if v := testutil.ToFloat64(g.WithLabelValues(topic)); v != 0 {
			t.Errorf("%v at start, want 0", v)
		}
	}
	for _, reason := range []string{"outage", "failing", "retry_after", "database"} {
		if v := testutil.ToFloat64(config.Metrics.Paused.WithLabelValues(topic, reason)); v != 0 {
			t.Errorf("route_paused{%s} %v at start, want 0", reason, v)
		}
	}
	if n := testutil.CollectAndCount(config.Metrics.Paused); n != 4 {
		t.Errorf("route_paused has %d series, want one for the route per reason", n)
	}
	if n := testutil.CollectAndCount(config.Metrics.Pauses); n != 4 {
		t.Errorf("route_pauses_total has %d series, want one for the route per reason", n)
	}
}

// TestPoisonKeysResume: three keys that always fail, on a route that has nothing else, trip the
// circuit; probes of the keys that tripped it do not prove the dependency down, so the keys go on
// spending their budgets, end as dead letters, and the route resumes.
func TestPoisonKeysResume(t *testing.T) {
	t.Parallel()
	forEachParkingMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		config := e.config(&recorder{fail: func(d inbox.Delivery) error {
			return fault.Retryable(errors.New("provider answered 503 for this one"))
		}})
		parkSoon(&config)
		config.Retry = consumer.Retry{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond,
			MaxElapsed: 500 * time.Millisecond}
		config.Circuit = gate.CircuitConfig{ConsecutiveFailures: 5, MinKeys: 3,
			ProbeInterval: 20 * time.Millisecond, MaxProbeInterval: 100 * time.Millisecond}
		e.produce("poison-a", "poison-b", "poison-c")
		e.start(config)
		// Each once at least: a rebalance may deliver a key dead-lettered but not committed again.
		e.waitFor("the three keys dead-lettered", func() bool {
			keys := map[string]bool{}
			for _, m := range e.deadLetters() {
				keys[string(m.Key)] = true
			}
			return len(keys) == 3
		})
		e.waitFor("the route open", func() bool { return routePaused(config, "outage") == 0 })
	})
}

// TestParkDrainsConcurrently: parked messages of different keys are retried at once, within the
// route's concurrency, not one after another per partition: after an outage, the park drains at
// the route's pace.
func TestParkDrainsConcurrently(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	var exists atomic.Bool
	var running, peak atomic.Int64
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if !exists.Load() {
			return fault.RetryableUntil(reasonUnknownOrder, fmt.Errorf("no order for %s", d.Key))
		}
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	}})
	parkSoon(&config)
	config.Retry.MaxElapsed = 10 * time.Minute
	late := keys("late", 16)
	e.produce(late...)
	e.start(config)
	e.waitFor("every message parked", func() bool { return len(e.parkedKeys()) == len(late) })
	exists.Store(true)
	e.waitFor("every message applied", func() bool { return len(e.effects()) == len(late) })
	if n := peak.Load(); n < 3 {
		t.Errorf("at most %d parked messages retried at once, want up to the route's concurrency (%d)",
			n, routeConcurrency)
	}
	checkOnce(t, e, late)
}

// TestParkedRetryFinishesOnStop: a stop lets a parked message's retry in flight finish within the
// shutdown timeout and records it, as it does for a message retried in place: a deploy does not
// make the call again after the restart.
func TestParkedRetryFinishesOnStop(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	var exists atomic.Bool
	out := make(chan struct{}, 1)
	h := newCaller(func(ctx context.Context, d inbox.Delivery) error {
		if !exists.Load() {
			return fault.Retryable(errors.New("provider answered 503"))
		}
		out <- struct{}{}
		select {
		case <-time.After(500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	config := e.callConfig(h)
	parkSoon(&config)
	config.Retry.MaxElapsed = 10 * time.Minute
	e.produce("late-1")
	_, stop := e.start(config)
	e.waitFor("the message parked", func() bool { return slices.Equal(e.parkedKeys(), []string{"late-1"}) })
	exists.Store(true)
	<-out
	stop()
	if got := e.effects(); got["late-1"] != 1 {
		t.Fatalf("effects %v: the stop cancelled the retry in flight instead of letting it finish", got)
	}
	if got := e.parkedKeys(); len(got) != 0 {
		t.Errorf("still parked: %q", got)
	}
}
