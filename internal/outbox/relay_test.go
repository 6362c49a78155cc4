package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestRelay: events of many orders, emitted in batches, are published with the order number as key,
// the id as Idempotency-Key, the payload as value, each order's in order, once; they are marked
// published, and the gauges come back to 0.
func TestRelay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	config := e.relayConfig(e.db.Pool)
	config.Metrics = outbox.NewMetrics(reg)
	idle, err := outbox.NewRelay(config) // creates the series of config.Topics; not run
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"inboxworker_outbox_published_total", "inboxworker_outbox_waiting",
		"inboxworker_outbox_oldest_seconds", "inboxworker_outbox_stalled_seconds", "inboxworker_outbox_relay_active"} {
		if gauge(t, reg, name) != 0 {
			t.Errorf("%s does not start at 0", name)
		}
	}
	want := map[string]int{}
	for round := 1; round <= 5; round++ {
		var events []outbox.Event
		for o := range 40 {
			orderNo := fmt.Sprintf("A-%d", o)
			want[orderNo] = round
			events = append(events, orderEvent(orderNo, round))
		}
		e.emit(e.db.Pool, events...)
	}
	time.Sleep(10 * time.Millisecond)
	// Before any relay runs: nothing is published, and the relay has stalled since the first.
	stats, err := idle.ReadStats(context.Background())
	if err != nil || stats.Waiting != 200 || stats.Oldest < 10*time.Millisecond || stats.Stalled != stats.Oldest {
		t.Errorf("stats %+v (%v) before any relay ran, want 200 waiting for 10ms or more, stalled as long", stats, err)
	}
	e.startRelay(config)
	e.waitPublished(200)
	got := e.readTopic()
	checkOrder(t, got, want, false)
	for _, r := range got {
		if want := fmt.Sprintf(`{"n":%d,"order_no":%q}`, r.n, r.key); string(r.value) != want {
			t.Errorf("value %s, want %s", r.value, want)
		}
	}
	if n := gauge(t, reg, "inboxworker_outbox_published_total"); n != 200 {
		t.Errorf("published counter %v, want 200", n)
	}
	if n := gauge(t, reg, "inboxworker_outbox_relay_active"); n != 1 {
		t.Errorf("active gauge %v, want 1", n)
	}
	eventually(t, func() string {
		if w, o := gauge(t, reg, "inboxworker_outbox_waiting"), gauge(t, reg, "inboxworker_outbox_oldest_seconds"); w != 0 || o != 0 {
			return fmt.Sprintf("waiting %v, oldest %v after publishing, want 0 and 0", w, o)
		}
		return ""
	})
}

// TestCommitOrder: transactions emitting for the same orders at once, holding their transaction
// open a random while after emitting, some rolling back: each order's events reach the topic in
// the order their transactions committed, their positions rising in that order, and none of a
// rolled-back transaction.
func TestCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startRelay(e.relayConfig(e.db.Pool))
	const orders, perOrder = 4, 25
	var mu sync.Mutex
	committed := map[string][]string{} // by order: the ids in commit order, as the order's lock saw it
	last := map[string]int64{}         // by order: the position of its last commit
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range orders * perOrder / 8 * 2 {
				orderNo := fmt.Sprintf("C-%d", rng.IntN(orders))
				ev := orderEvent(orderNo, 0)
				ev.Cause = fmt.Sprintf("worker %d try %d", w, i)
				ev.Type = "order.race"
				rollback := rng.IntN(4) == 0
				var position int64
				err := inbox.WithTx(context.Background(), e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					if err := outbox.Emit(ctx, tx, ev); err != nil {
						return err
					}
					if err := tx.QueryRow(ctx, `SELECT position FROM outbox_events WHERE id = $1`, eventID(ev)).Scan(&position); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					if rollback {
						return errRolledBack
					}
					// The order's lock is held until the commit: no other transaction of the
					// order can draw a position before this one is recorded here.
					mu.Lock()
					committed[orderNo] = append(committed[orderNo], eventID(ev))
					if position <= last[orderNo] {
						t.Errorf("order %s: commit %d at position %d, after one at %d", orderNo,
							len(committed[orderNo]), position, last[orderNo])
					}
					last[orderNo] = position
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, errRolledBack) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, ids := range committed {
		total += len(ids)
	}
	e.waitPublished(total)
	got := map[string][]string{}
	for _, r := range e.readTopic() {
		got[r.key] = append(got[r.key], r.id)
	}
	for orderNo, ids := range committed {
		if fmt.Sprint(got[orderNo]) != fmt.Sprint(ids) {
			t.Errorf("order %s: published %v, committed %v", orderNo, got[orderNo], ids)
		}
	}
	if len(got) != len(committed) {
		t.Errorf("%d orders published, %d committed", len(got), len(committed))
	}
}

var errRolledBack = errors.New("rolled back on purpose")

// TestRelaysOneAtATime: three relays on one outbox while events keep coming: one publishes at a time
// (no write of one overlaps another's), and each event is published once, in order.
func TestRelaysOneAtATime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &recorder{}
	var stops []func()
	for range 3 {
		config := e.relayConfig(e.db.Pool)
		config.Observer = rec
		_, stop := e.startRelay(config)
		stops = append(stops, stop)
	}
	want := map[string]int{}
	for round := 1; round <= 30; round++ {
		var events []outbox.Event
		for o := range 10 {
			orderNo := fmt.Sprintf("R-%d", o)
			want[orderNo] = round
			events = append(events, orderEvent(orderNo, round))
		}
		e.emit(e.db.Pool, events...)
		if round == 15 {
			stops[0]() // the holder, if it is it, gives the lease up: another takes over at once
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.waitPublished(300)
	checkOrder(t, e.readTopic(), want, false)
	checkNoOverlap(t, rec.all())
}

// checkNoOverlap checks that no two relays' writes overlapped, and that epochs only grew.
func checkNoOverlap(t *testing.T, writes []write) {
	t.Helper()
	for i, w := range writes {
		if w.end.IsZero() {
			t.Errorf("write %d of epoch %d never ended", i, w.epoch)
			continue
		}
		if i > 0 {
			prev := writes[i-1]
			if w.epoch < prev.epoch {
				t.Errorf("write %d of epoch %d after one of epoch %d", i, w.epoch, prev.epoch)
			}
			if w.epoch != prev.epoch && w.start.Before(prev.end) {
				t.Errorf("write %d of epoch %d started %v before the write of epoch %d ended", i, w.epoch,
					prev.end.Sub(w.start), prev.epoch)
			}
		}
	}
}

// TestRelayFailover: the relay holding the lease loses Postgres for good (as if its instance died);
// another takes over once its lease has expired, and publishes everything, in order. The time from
// the cut to the first write of the new holder is logged.
func TestRelayFailover(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &recorder{}
	proxy := pgtest.StartProxy(t, e.db.URL)
	first, err := pgxpool.New(context.Background(), proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Close)
	config := e.relayConfig(first)
	config.Observer = rec
	e.startRelay(config)
	e.emit(e.db.Pool, orderEvent("F-1", 1))
	e.waitPublished(1)

	config = e.relayConfig(e.db.Pool)
	config.Observer = rec
	e.startRelay(config) // stands by
	cut := time.Now()
	proxy.Cut()
	want := map[string]int{"F-1": 1}
	for n := 2; n <= 20; n++ {
		e.emit(e.db.Pool, orderEvent("F-1", n), orderEvent("F-2", n-1))
		want["F-1"], want["F-2"] = n, n-1
	}
	e.waitPublished(39)
	var took time.Duration
	for _, w := range rec.all() {
		if w.epoch == 2 {
			took = w.start.Sub(cut)
			break
		}
	}
	t.Logf("failover: the standby published %v after the holder lost Postgres (lease 2s)", took)
	checkOrder(t, e.readTopic(), want, false)
	checkNoOverlap(t, rec.all())
}

// TestRelayFenced: a relay that stalls between reading a batch and writing it, for longer than its
// lease, writes nothing once it resumes, since another relay may hold the lease by then; that one
// publishes the batch, once.
func TestRelayFenced(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stalled := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	rec := &recorder{stall: func(epoch int64) {
		if epoch == 1 {
			once.Do(func() { close(stalled); <-resume })
		}
	}}
	config := e.relayConfig(e.db.Pool)
	config.Observer = rec
	e.startRelay(config)
	e.emit(e.db.Pool, orderEvent("S-1", 1), orderEvent("S-1", 2))
	<-stalled

	config.Observer = rec
	e.startRelay(config) // takes over once the stalled relay's lease has expired
	e.waitPublished(2)
	close(resume)
	eventually(t, func() string {
		for _, w := range rec.all() {
			if w.epoch == 1 && !w.end.IsZero() {
				return ""
			}
		}
		return "the stalled relay has not finished its write"
	})
	for _, w := range rec.all() {
		if w.epoch == 1 && w.published != 0 {
			t.Errorf("the stalled relay published %d events after its lease ran out (%v)", w.published, w.err)
		}
	}
	e.emit(e.db.Pool, orderEvent("S-1", 3))
	e.waitPublished(3)
	checkOrder(t, e.readTopic(), map[string]int{"S-1": 3}, false)
}

// TestRelayKafkaDown: while the broker refuses every write, events committed meanwhile wait; once
// it accepts again they are published, none lost, each order's in order.
func TestRelayKafkaDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	config := e.relayConfig(e.db.Pool)
	config.Metrics = outbox.NewMetrics(reg)
	var logs *testlog.Records
	config.Logger, logs = testlog.Capture(t)
	var mu sync.Mutex
	down := true
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if !down {
			return nil, nil, false
		}
		r := req.(*kmsg.ProduceRequest)
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	e.startRelay(config)
	want := map[string]int{}
	for n := 1; n <= 10; n++ {
		e.emit(e.db.Pool, orderEvent("K-1", n), orderEvent("K-2", n), orderEvent("K-3", n))
		want["K-1"], want["K-2"], want["K-3"] = n, n, n
	}
	eventually(t, func() string {
		// Stalled for longer than the backoff takes to outgrow the lease: the relay, alone, must
		// keep its lease through the outage rather than lose it to itself.
		stall := 4 * config.LeaseTTL.Seconds()
		if w, s := gauge(t, reg, "inboxworker_outbox_waiting"), gauge(t, reg, "inboxworker_outbox_stalled_seconds"); w != 30 || s < stall {
			return fmt.Sprintf("waiting %v, stalled %vs while Kafka refuses; want 30 and over %vs", w, s, stall)
		}
		return ""
	})
	for _, r := range logs.All() {
		if r.Message == "outbox relay: lost the lease; standing by" {
			t.Errorf("the only relay logged %q during a Kafka outage", r.Message)
		}
	}
	mu.Lock()
	down = false
	mu.Unlock()
	e.waitPublished(30)
	checkOrder(t, e.readTopic(), want, false)
}

// TestPurge: events published and written longer than the retention ago are deleted, those of
// outbox_batches and those a relay published a row each before migration 00018; a younger one
// stays, and so do an old one still waiting to be published and one written a row of its own, for
// Debezium, since.
func TestPurge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	config := e.relayConfig(e.db.Pool)
	config.Retention = time.Hour
	r, stop := e.startRelay(config)
	for _, order := range []string{"P-1", "P-2", "P-3"} { // an emission each: the purge deletes whole emissions
		e.emit(e.db.Pool, orderEvent(order, 1))
	}
	e.waitPublished(3)
	stop()
	e.emit(e.db.Pool, orderEvent("P-4", 1)) // waiting: never purged
	age := func(orders ...string) {
		t.Helper()
		for _, sql := range []string{
			`UPDATE outbox_batches SET created_at = now() - interval '2 hours' WHERE aggregateids && $1`,
			`UPDATE outbox SET created_at = now() - interval '2 hours' WHERE aggregateid = ANY ($1)`,
		} {
			if _, err := e.db.Pool.Exec(ctx, sql, orders); err != nil {
				t.Fatal(err)
			}
		}
	}
	left := func() string {
		t.Helper()
		rows, _ := e.db.Pool.Query(ctx, `SELECT aggregateid FROM outbox_events ORDER BY 1`)
		events, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(events)
	}
	// An event published a row of its own before migration 00018 (at a position under the cursor),
	// and one written a row of its own since, by a worker without a relay, for Debezium (after the
	// cursor): the first is purged, the second never.
	if _, err := e.db.Pool.Exec(ctx, `
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, topic, position) OVERRIDING SYSTEM VALUE
		VALUES (gen_random_uuid(), 'order', 'P-0', 'order.test', '{}', $1, 1)`, topic); err != nil {
		t.Fatal(err)
	}
	if err := inbox.WithTx(outbox.WithEventRows(ctx), e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Emit(ctx, tx, orderEvent("P-5", 1))
	}); err != nil {
		t.Fatal(err)
	}
	age("P-0", "P-1", "P-2", "P-4", "P-5")
	if deleted, err := r.Purge(ctx); err != nil || deleted != 3 || left() != "[P-3 P-4 P-5]" {
		t.Fatalf("Purge deleted %d events (%v), left %s; want 3, and [P-3 P-4 P-5]", deleted, err, left())
	}
	age("P-3")
	if deleted, err := r.Purge(ctx); err != nil || deleted != 1 || left() != "[P-4 P-5]" {
		t.Fatalf("Purge deleted %d events (%v), left %s; want 1, and the waiting [P-4 P-5]", deleted, err, left())
	}
}

// TestRelayPartitionDown: while the broker refuses the writes of one partition, the events of the
// others are published, once; the refused partition's wait, and are published in order once it
// accepts again, none twice.
func TestRelayPartitionDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	down, refused := true, 0
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		mu.Lock()
		defer mu.Unlock()
		if !down || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 || r.Topics[0].Partitions[0].Partition != 0 {
			return nil, nil, false
		}
		refused++
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		st := kmsg.NewProduceResponseTopic()
		st.Topic = r.Topics[0].Topic
		sp := kmsg.NewProduceResponseTopicPartition()
		sp.ErrorCode = kerr.NotEnoughReplicas.Code
		st.Partitions = append(st.Partitions, sp)
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	e.startRelay(e.relayConfig(e.db.Pool))
	want := map[string]int{}
	for n := 1; n <= 10; n++ {
		var events []outbox.Event
		for o := range 12 {
			orderNo := fmt.Sprintf("D-%d", o)
			events = append(events, orderEvent(orderNo, n))
			want[orderNo] = n
		}
		e.emit(e.db.Pool, events...)
	}
	// Every partition but 0 gets its events while 0 refuses them.
	eventually(t, func() string {
		mu.Lock()
		r := refused
		mu.Unlock()
		got := 0
		for p := 1; p < partitions; p++ {
			got += len(e.cluster.ReadAll(t, topic, p))
		}
		if r < 3 || got == 0 {
			return fmt.Sprintf("%d writes to partition 0 refused, %d events on the others", r, got)
		}
		return ""
	})
	mu.Lock()
	down = false
	mu.Unlock()
	e.waitPublished(120)
	got := e.readTopic()
	checkOrder(t, got, want, false)
	if len(got) != 120 {
		t.Errorf("%d events on the topic, want 120", len(got))
	}
}

// TestRelayHorizon: an emitter that drew the lower position and commits last is not overtaken: the
// relay publishes nothing drawn after it while it runs, and everything, its event first, once it
// commits. Meanwhile the waiting gauge counts the event committed behind it.
func TestRelayHorizon(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	config := e.relayConfig(e.db.Pool)
	config.Metrics = outbox.NewMetrics(reg)
	e.startRelay(config)
	e.emit(e.db.Pool, orderEvent("H-0", 1))
	e.waitPublished(1)

	slow, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if err := outbox.Emit(ctx, slow, orderEvent("H-1", 1)); err != nil {
		t.Fatal(err)
	}
	e.emit(e.db.Pool, orderEvent("H-2", 1)) // a higher position, committed first
	eventually(t, func() string {
		if w := gauge(t, reg, "inboxworker_outbox_waiting"); w != 1 {
			return fmt.Sprintf("waiting gauge %v, want the 1 event behind the open emitter", w)
		}
		return ""
	})
	time.Sleep(10 * config.PollInterval) // rounds of the relay, which must publish nothing
	if got := e.readTopic(); len(got) != 1 {
		t.Fatalf("published %d events while the emitter of the lower position runs, want only the first", len(got))
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitPublished(3)
	var keys []string
	for p := range partitions {
		for _, m := range e.cluster.ReadAll(t, topic, p) {
			keys = append(keys, string(m.Key))
		}
	}
	slices.Sort(keys)
	if fmt.Sprint(keys) != "[H-0 H-1 H-2]" {
		t.Errorf("published %v, want H-0, H-1 and H-2 once each", keys)
	}
}

// TestEmitManyAggregates: a batch of more aggregates than MaxAggregateLocks takes the emitter lock
// alone, exclusively: another emitter waits for its commit; a smaller batch takes the shared
// emitter lock and one lock per aggregate. Both are published, each order's in order.
func TestEmitManyAggregates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	advisoryLocks := func(tx pgx.Tx) int {
		t.Helper()
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).
			Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := map[string]int{}
	var many []outbox.Event
	for o := range outbox.MaxAggregateLocks + 1 {
		many = append(many, orderEvent(fmt.Sprintf("M-%d", o), 1))
		want[fmt.Sprintf("M-%d", o)] = 1
	}
	big, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Rollback(ctx)
	if err := outbox.EmitBatch(ctx, big, many); err != nil {
		t.Fatal(err)
	}
	if n := advisoryLocks(big); n != 1 {
		t.Errorf("a batch of %d aggregates holds %d advisory locks, want 1", len(many), n)
	}
	other := make(chan error, 1)
	go func() {
		other <- inbox.WithTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := outbox.EmitBatch(ctx, tx, []outbox.Event{orderEvent("M-0", 2), orderEvent("N-1", 1)}); err != nil {
				return err
			}
			if n := advisoryLocks(tx); n != 3 {
				t.Errorf("a batch of 2 aggregates holds %d advisory locks, want 3", n)
			}
			return nil
		})
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-other:
		t.Fatalf("another emitter emitted (%v) while the batch of many aggregates held the emitter lock", err)
	default:
	}
	if err := big.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	want["M-0"], want["N-1"] = 2, 1
	e.startRelay(e.relayConfig(e.db.Pool))
	e.waitPublished(len(many) + 2)
	checkOrder(t, e.readTopic(), want, false)
}

// TestRelayLargeEmission: an emission whose events are more than a round's bytes is published over
// several rounds, each event once and in order, the cursor moving past the emission only once all
// of it is published; the emission after it follows.
func TestRelayLargeEmission(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &recorder{}
	config := e.relayConfig(e.db.Pool)
	config.Observer = rec
	e.startRelay(config)
	large := func(n int) outbox.Event {
		ev := orderEvent("L-1", n)
		ev.Payload = map[string]any{"order_no": "L-1", "n": n, "pad": strings.Repeat("x", 300<<10)}
		return ev
	}
	e.emit(e.db.Pool, large(1), large(2), large(3), large(4), large(5)) // 1.5 MiB: two rounds at least
	e.emit(e.db.Pool, orderEvent("L-1", 6))
	e.waitPublished(6)
	checkOrder(t, e.readTopic(), map[string]int{"L-1": 6}, false)
	writes := rec.all()
	if len(writes) < 2 {
		t.Errorf("%d writes, want the large emission in two at least", len(writes))
	}
	for _, w := range writes {
		if w.msgs > 3 {
			t.Errorf("a write of %d events of 300 KiB, more than a round's bytes", w.msgs)
		}
	}
}

// TestRelayEmissionOverBatchSize: an emission of more events than a round's BatchSize is published
// over several rounds of at most BatchSize events each — so that a partition's events of a round
// still go in one produce request, acknowledged whole or not at all — each event once, in order.
func TestRelayEmissionOverBatchSize(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &recorder{}
	config := e.relayConfig(e.db.Pool)
	config.BatchSize, config.Observer = 10, rec
	var events []outbox.Event
	for n := 1; n <= 25; n++ {
		events = append(events, orderEvent("B-1", n))
	}
	e.emit(e.db.Pool, events...)
	e.startRelay(config)
	e.waitPublished(25)
	checkOrder(t, e.readTopic(), map[string]int{"B-1": 25}, false)
	for _, w := range rec.all() {
		if w.msgs > config.BatchSize {
			t.Errorf("a write of %d events, more than BatchSize %d", w.msgs, config.BatchSize)
		}
	}
}
