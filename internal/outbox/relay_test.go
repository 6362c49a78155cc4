package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
// the order their transactions committed, with seq 1, 2, 3… and none of a rolled-back transaction.
func TestCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startRelay(e.relayConfig(e.db.Pool))
	const orders, perOrder = 4, 25
	var mu sync.Mutex
	committed := map[string][]string{} // by order: the ids in commit order, as the counter saw it
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
				var seq int64
				err := inbox.WithTx(context.Background(), e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					if err := outbox.Emit(ctx, tx, ev); err != nil {
						return err
					}
					if err := tx.QueryRow(ctx, `SELECT seq FROM outbox WHERE id = $1`, ev.ID()).Scan(&seq); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					if rollback {
						return errRolledBack
					}
					// The counter's lock is held until the commit: no other transaction of the
					// order can take the next number before this one is recorded here.
					mu.Lock()
					committed[orderNo] = append(committed[orderNo], ev.ID())
					if int64(len(committed[orderNo])) != seq {
						t.Errorf("order %s: commit %d got seq %d", orderNo, len(committed[orderNo]), seq)
					}
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
	proxy := startProxy(t, e.db.URL)
	first, err := pgxpool.New(context.Background(), proxy.url)
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
	proxy.cut()
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
		if w, s := gauge(t, reg, "inboxworker_outbox_waiting"), gauge(t, reg, "inboxworker_outbox_stalled_seconds"); w != 30 || s < 0.5 {
			return fmt.Sprintf("waiting %v, stalled %vs while Kafka refuses; want 30 and over 0.5s", w, s)
		}
		return ""
	})
	mu.Lock()
	down = false
	mu.Unlock()
	e.waitPublished(30)
	checkOrder(t, e.readTopic(), want, false)
}

// TestPurge: events published longer than the retention ago are deleted, with the counters of
// aggregates idle that long; the others stay.
func TestPurge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	config := e.relayConfig(e.db.Pool)
	config.Retention = time.Hour
	r, stop := e.startRelay(config)
	e.emit(e.db.Pool, orderEvent("P-1", 1), orderEvent("P-2", 1), orderEvent("P-3", 1))
	e.waitPublished(3)
	stop()
	if _, err := e.db.Pool.Exec(ctx, `
		UPDATE outbox SET published_at = now() - interval '2 hours' WHERE aggregateid IN ('P-1', 'P-2');
		UPDATE outbox_sequences SET updated_at = now() - interval '2 hours' WHERE aggregateid = 'P-1'`); err != nil {
		t.Fatal(err)
	}
	e.emit(e.db.Pool, orderEvent("P-4", 1)) // waiting: never purged
	deleted, err := r.Purge(ctx)
	if err != nil || deleted != 2 {
		t.Fatalf("Purge deleted %d events (%v), want 2", deleted, err)
	}
	var events, counters []string
	for q, dst := range map[string]*[]string{
		`SELECT aggregateid FROM outbox ORDER BY 1`:           &events,
		`SELECT aggregateid FROM outbox_sequences ORDER BY 1`: &counters,
	} {
		rows, _ := e.db.Pool.Query(ctx, q)
		if *dst, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(events) != "[P-3 P-4]" || fmt.Sprint(counters) != "[P-2 P-3 P-4]" {
		t.Errorf("left events of %v and counters of %v, want [P-3 P-4] and [P-2 P-3 P-4]", events, counters)
	}
}
