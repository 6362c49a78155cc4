package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/promtest"
	"github.com/inboxworker/inboxworker/internal/reconcile"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// provider is a payment provider's status endpoint: for each order number, what it answers, and
// how many times it was asked.
type provider struct {
	mu      sync.Mutex
	answers map[string]func(w http.ResponseWriter)
	asked   map[string]int
	tokens  map[string]bool // the Authorization headers seen
}

func newProvider(t *testing.T) (*provider, *httptest.Server) {
	p := &provider{answers: map[string]func(http.ResponseWriter){}, asked: map[string]int{}, tokens: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orderNo := r.URL.Query().Get("order_no")
		p.mu.Lock()
		p.asked[orderNo]++
		p.tokens[r.Header.Get("Authorization")] = true
		answer := p.answers[orderNo]
		p.mu.Unlock()
		if answer == nil {
			http.NotFound(w, r)
			return
		}
		answer(w)
	}))
	t.Cleanup(srv.Close)
	return p, srv
}

// payment answers with a payment of orderNo, as its callback would carry it.
func answerPayment(orderNo, txn, result string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		_ = json.NewEncoder(w).Encode(map[string]string{"order_no": orderNo, "provider": "alipay",
			"provider_txn_id": txn, "amount": "99.90", "currency": "CNY", "result": result,
			"paid_at": "2026-12-01T10:00:00Z"})
	}
}

func (p *provider) answer(orderNo string, answer func(http.ResponseWriter)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers[orderNo] = answer
}

func (p *provider) askedAbout(orderNo string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked[orderNo]
}

// env is a schema with its orders, and what a reconciler needs.
type env struct {
	pool     *pgxpool.Pool
	store    *inbox.Store
	payments *payment.Handler
}

func setup(t *testing.T) *env {
	t.Helper()
	pool := pgtest.Schema(t).Pool
	store, err := inbox.NewStore(pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := payment.NewHandler(payment.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, store: store, payments: h}
}

// order inserts an order created age ago, with status.
func (e *env) order(t *testing.T, orderNo, status string, age time.Duration) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO orders (order_no, user_id, amount, currency, status, created_at)
		VALUES ($1, 'u', 99.90, 'CNY', $2, now() - $3 * interval '1 microsecond')`,
		orderNo, status, age.Microseconds()); err != nil {
		t.Fatal(err)
	}
}

// start runs a reconciler of the group asking srv, until the test ends; it returns its metrics.
func (e *env) start(t *testing.T, url string, after, maxAge time.Duration) *prometheus.Registry {
	t.Helper()
	reg, _, _ := e.run(t, url, after, maxAge)
	return reg
}

// run is start, returning also the reconciler's log records, and stop, which ends it and waits for
// its Run to return (at the latest when the test ends).
func (e *env) run(t *testing.T, url string, after, maxAge time.Duration) (
	reg *prometheus.Registry, logs *testlog.Records, stop func()) {
	t.Helper()
	status, err := reconcile.NewStatus(url, "s3cret", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	metrics := reconcile.NewMetrics(reg)
	log, logs := testlog.Capture(t)
	r, err := reconcile.New(reconcile.Config{Pool: e.pool, Payments: e.payments, Store: e.store, Group: "g",
		Status: status, RateLimit: 1000, After: after, MaxAge: maxAge, Metrics: metrics, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(stop)
	return reg, logs, stop
}

func (e *env) scalar(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLostCallbacksFound: orders PENDING past RECONCILE_AFTER are asked about once each, and the
// provider's answers applied as their callbacks would be: paid, a failed payment recorded; 404 and
// PENDING leave the order as it is, to ask again an interval later. Younger orders, orders past
// RECONCILE_MAX_AGE and orders no longer PENDING are not asked about.
func TestLostCallbacksFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p, srv := newProvider(t)
	for orderNo, status := range map[string]string{"ORD-PAID": "PENDING", "ORD-FAILED": "PENDING",
		"ORD-UNKNOWN": "PENDING", "ORD-WAIT": "PENDING", "ORD-CANCELLED": "CANCELLED"} {
		e.order(t, orderNo, status, 2*time.Hour)
	}
	e.order(t, "ORD-YOUNG", "PENDING", 0)
	e.order(t, "ORD-OLD", "PENDING", 100*time.Hour)
	p.answer("ORD-PAID", answerPayment("ORD-PAID", "T-1", "SUCCESS"))
	p.answer("ORD-FAILED", answerPayment("ORD-FAILED", "T-2", "FAILED"))
	p.answer("ORD-WAIT", func(w http.ResponseWriter) { fmt.Fprint(w, `{"order_no":"ORD-WAIT","result":"PENDING"}`) })
	p.answer("ORD-YOUNG", answerPayment("ORD-YOUNG", "T-3", "SUCCESS"))
	p.answer("ORD-OLD", answerPayment("ORD-OLD", "T-4", "SUCCESS"))
	p.answer("ORD-CANCELLED", answerPayment("ORD-CANCELLED", "T-5", "SUCCESS"))

	reg := e.start(t, srv.URL+"/status?merchant=m1", time.Hour, 72*time.Hour)
	// Answered: recorded, and counted once the record committed.
	poll.For(t, "four orders answered", func() bool {
		answered := 0.0
		for _, n := range promtest.Counters(t, reg, "inboxworker_reconciliations_total", "result") {
			answered += n
		}
		return answered == 4 && e.scalar(t, `SELECT count(*)::text FROM payment_reconciliations WHERE asks = 1`) == "4"
	})

	for orderNo, want := range map[string]string{
		"ORD-PAID":      "PAID; SUCCESS from reconciliation",
		"ORD-FAILED":    "PENDING; FAILED from reconciliation",
		"ORD-UNKNOWN":   "PENDING;",
		"ORD-WAIT":      "PENDING;",
		"ORD-CANCELLED": "CANCELLED;",
		"ORD-YOUNG":     "PENDING;",
		"ORD-OLD":       "PENDING;",
	} {
		got := e.scalar(t, `
			SELECT o.status || ';' || coalesce(string_agg(' ' || p.result || ' from ' || p.source, ','), '')
			FROM orders o LEFT JOIN payments p USING (order_no) WHERE o.order_no = $1 GROUP BY o.status`, orderNo)
		if got != want {
			t.Errorf("%s: %q, want %q", orderNo, got, want)
		}
	}
	for orderNo, want := range map[string]int{"ORD-PAID": 1, "ORD-FAILED": 1, "ORD-UNKNOWN": 1, "ORD-WAIT": 1,
		"ORD-CANCELLED": 0, "ORD-YOUNG": 0, "ORD-OLD": 0} {
		if got := p.askedAbout(orderNo); got != want {
			t.Errorf("%s asked about %d times, want %d", orderNo, got, want)
		}
	}
	if !p.tokens["Bearer s3cret"] || len(p.tokens) != 1 {
		t.Errorf("Authorization headers %v, want Bearer s3cret alone", p.tokens)
	}
	// Asked again an interval (RECONCILE_AFTER) after its answer, no sooner.
	if next := e.scalar(t, `SELECT (next_ask_at - last_asked_at >= interval '59 minutes')::text
		FROM payment_reconciliations WHERE order_no = 'ORD-UNKNOWN'`); next != "true" {
		t.Errorf("ORD-UNKNOWN is due again within the hour")
	}
	want := map[string]float64{"paid": 1, "failed": 1, "unknown": 1, "pending": 1, "error": 0}
	if got := promtest.Counters(t, reg, "inboxworker_reconciliations_total", "result"); !maps.Equal(got, want) {
		t.Errorf("reconciliations %v, want %v", got, want)
	}
}

// TestAnswerRacesCallback: for each of 100 orders, the provider's callback and the reconciliation
// answer about the same payment are applied at once, by the payment route and by two reconcilers:
// each order is paid once, each payment recorded once, whichever came first.
func TestAnswerRacesCallback(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p, srv := newProvider(t)
	const n = 100
	for i := range n {
		orderNo := fmt.Sprintf("ORD-%03d", i)
		e.order(t, orderNo, "PENDING", time.Minute)
		p.answer(orderNo, answerPayment(orderNo, fmt.Sprintf("T-%03d", i), "SUCCESS"))
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			orderNo, txn := fmt.Sprintf("ORD-%03d", i), fmt.Sprintf("T-%03d", i)
			value, _ := json.Marshal(map[string]string{"order_no": orderNo, "provider": "alipay",
				"provider_txn_id": txn, "amount": "99.90", "currency": "CNY", "result": "SUCCESS",
				"paid_at": "2026-12-01T10:00:00Z"})
			msg := inbox.Message{Handler: "payments", Key: "cb-" + orderNo, Fingerprint: inbox.Fingerprint(value),
				Topic: "payments.callbacks"}
			if _, err := e.store.Process(context.Background(), msg, func(ctx context.Context, tx pgx.Tx) error {
				return e.payments.Handle(ctx, tx, inbox.Delivery{Key: msg.Key, Value: value, Attempt: 1})
			}); err != nil {
				t.Errorf("callback of %s: %v", orderNo, err)
			}
		}
	})
	e.start(t, srv.URL, time.Second, time.Hour)
	e.start(t, srv.URL, time.Second, time.Hour)
	wg.Wait()
	poll.For(t, "every order paid", func() bool {
		return e.scalar(t, `SELECT count(*)::text FROM orders WHERE status = 'PAID'`) == fmt.Sprint(n)
	})
	if got := e.scalar(t, `SELECT count(*)::text FROM payments`); got != fmt.Sprint(n) {
		t.Errorf("%s payments rows, want %d", got, n)
	}
	if got := e.scalar(t, `SELECT count(*)::text FROM payment_anomalies`); got != "0" {
		t.Errorf("%s anomalies, want none", got)
	}
	t.Logf("paid by: %s", e.scalar(t, `SELECT string_agg(source || '=' || n, ', ') FROM
		(SELECT source, count(*) AS n FROM payments GROUP BY source) s`))
}

// TestMeasureTenThousand measures how long reconciling 10,000 pending orders takes, each paid by the
// provider's answer, at RECONCILE_MEASURE_RATE requests a second (default 1000), against a local
// endpoint: `RECONCILE_MEASURE=1 go test -run TestMeasureTenThousand -v ./internal/reconcile`. It
// is a measure, not a check of speed: it only checks that every order was paid, once.
func TestMeasureTenThousand(t *testing.T) {
	if os.Getenv("RECONCILE_MEASURE") == "" {
		t.Skip("a measure: set RECONCILE_MEASURE=1 to run it")
	}
	rate := 1000.0
	if v := os.Getenv("RECONCILE_MEASURE_RATE"); v != "" {
		var err error
		if rate, err = strconv.ParseFloat(v, 64); err != nil {
			t.Fatal(err)
		}
	}
	const n = 10_000
	e := setup(t)
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO orders (order_no, user_id, amount, currency, created_at)
		SELECT 'ORD-' || i, 'u', 99.90, 'CNY', now() - interval '1 hour' FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orderNo := r.URL.Query().Get("order_no")
		answerPayment(orderNo, "T-"+orderNo, "SUCCESS")(w)
	}))
	defer srv.Close()
	status, err := reconcile.NewStatus(srv.URL, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reconcile.New(reconcile.Config{Pool: e.pool, Payments: e.payments, Store: e.store, Group: "g",
		Status: status, RateLimit: rate, After: time.Minute, MaxAge: 24 * time.Hour, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(ctx) }()
	poll.Until(t, func() string {
		if left := e.scalar(t, `SELECT count(*)::text FROM orders WHERE status = 'PENDING'`); left != "0" {
			return left + " orders left"
		}
		return ""
	})
	elapsed := time.Since(start)
	cancel()
	<-done
	t.Logf("%d orders reconciled in %s at a rate limit of %v/s: %.0f/s", n, elapsed.Round(time.Millisecond), rate,
		n/elapsed.Seconds())
	if got := e.scalar(t, `SELECT count(*)::text FROM payments WHERE source = 'reconciliation'`); got != fmt.Sprint(n) {
		t.Errorf("%s payments, want %d", got, n)
	}
}

// TestStatusDown: a status endpoint that fails every request for its first 2.5 seconds is asked
// until 10 failures in a row trip the circuit (16 workers may have one more out each), then by one
// probe at a time (at about 1s and 3s): no more than 10 + 16 + 2 requests while it is down, however
// slow the machine, and every order is asked about once it answers again.
func TestStatusDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 50
	for i := range n {
		e.order(t, fmt.Sprintf("ORD-%02d", i), "PENDING", 2*time.Hour)
	}
	var mu sync.Mutex
	var first time.Time
	down, asked := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		asked++
		if time.Since(first) < 2500*time.Millisecond {
			down++
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	reg := e.start(t, srv.URL, time.Second, 72*time.Hour) // RateLimit 1000: 16 workers
	poll.For(t, "every order answered", func() bool {
		return e.scalar(t, `SELECT count(*)::text FROM payment_reconciliations WHERE last_result = 'unknown'`) ==
			fmt.Sprint(n)
	})
	mu.Lock()
	defer mu.Unlock()
	if down > 10+16+2 {
		t.Errorf("%d requests while the endpoint was down, want at most 28 (until the circuit trips, then a probe at a time)", down)
	}
	if got := promtest.Counters(t, reg, "inboxworker_reconciliations_total", "result")["error"]; got != float64(down) {
		t.Errorf("%v errors counted, for %d failed requests", got, down)
	}
	t.Logf("%d requests, %d while the endpoint was down", asked, down)
}

// TestPoisonOrder: a status endpoint that fails on one order only (a 500 for it, forever) pauses
// nobody: every other order is answered, and the poison one is asked about once an interval, not
// again and again.
func TestPoisonOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p, srv := newProvider(t)
	const n = 40
	for i := range n {
		e.order(t, fmt.Sprintf("ORD-%02d", i), "PENDING", 2*time.Hour)
	}
	p.answer("ORD-00", func(w http.ResponseWriter) { http.Error(w, "boom", http.StatusInternalServerError) })
	e.start(t, srv.URL, time.Hour, 72*time.Hour)
	poll.For(t, "every other order answered", func() bool {
		return e.scalar(t, `SELECT count(*)::text FROM payment_reconciliations WHERE last_result = 'unknown'`) ==
			fmt.Sprint(n-1)
	})
	if got := p.askedAbout("ORD-00"); got != 1 {
		t.Errorf("the poison order was asked about %d times, want once: it waits its interval", got)
	}
	if got := e.scalar(t, `SELECT last_result || ' ' || asks FROM payment_reconciliations WHERE order_no = 'ORD-00'`); got != "error 0" {
		t.Errorf("the poison order's row: %s, want error 0 (not an answer)", got)
	}
}

// TestStopWhileApplying: a reconciler stopped while it applies an answer (its transaction waits on
// a row of the provider's transaction the test holds) reports nothing of it — no answer counted, no error
// logged — and gives the order back, to be asked about again: the answer did not commit.
func TestStopWhileApplying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	p, srv := newProvider(t)
	e.order(t, "ORD-STOP", "PENDING", 2*time.Hour)
	p.answer("ORD-STOP", answerPayment("ORD-STOP", "T-STOP", "SUCCESS"))

	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	// The provider's transaction, written and not committed: the answer's insert of it waits.
	var pid int
	if err := holder.QueryRow(ctx, `INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency)
		VALUES ('alipay', 'T-STOP', 'ORD-STOP', 99.90, 'CNY') RETURNING pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	reg, logs, stop := e.run(t, srv.URL, time.Hour, 72*time.Hour)
	poll.For(t, "the answer's transaction waiting on the order's row", func() bool {
		return e.scalar(t, `SELECT (count(*) > 0)::text FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
			pid) == "true"
	})
	stop()
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	want := map[string]float64{"paid": 0, "failed": 0, "unknown": 0, "pending": 0, "error": 0}
	if got := promtest.Counters(t, reg, "inboxworker_reconciliations_total", "result"); !maps.Equal(got, want) {
		t.Errorf("reconciliations %v, want none: the answer did not commit", got)
	}
	for _, r := range logs.All() {
		if r.Level >= slog.LevelWarn {
			t.Errorf("logged %s %q: stopping is not a failure", r.Level, r.Message)
		}
	}
	if got := e.scalar(t, `SELECT o.status || ' ' || r.asks || ' ' || (r.held_by IS NULL) || ' ' ||
			(SELECT count(*) FROM payments WHERE order_no = 'ORD-STOP')
		FROM orders o JOIN payment_reconciliations r USING (order_no) WHERE order_no = 'ORD-STOP'`); got != "PENDING 0 true 0" {
		t.Errorf("order, asks, given back, payments: %q, want %q", got, "PENDING 0 true 0")
	}
}
