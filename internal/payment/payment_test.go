package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func newHandler(t testing.TB) *payment.Handler {
	t.Helper()
	h, err := payment.NewHandler(payment.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

type env struct {
	pool    *pgxpool.Pool
	store   *inbox.Store
	handler *payment.Handler
}

// setup returns a fresh migrated schema with an inbox store and a payment handler.
func setup(t *testing.T) *env {
	t.Helper()
	pool := pgtest.Schema(t).Pool
	store, err := inbox.NewStore(pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, store: store, handler: newHandler(t)}
}

// deliver runs one delivery through the inbox and the handler, as the consumer does.
func (e *env) deliver(t testing.TB, key string, value []byte) (inbox.Outcome, error) {
	t.Helper()
	msg := inbox.Message{Handler: "payments", Key: key, Fingerprint: inbox.Fingerprint(value), Topic: "payments.callbacks"}
	return e.store.Process(context.Background(), msg, func(ctx context.Context, tx pgx.Tx) error {
		return e.handler.Handle(ctx, tx, inbox.Delivery{Key: key, Value: value, Attempt: 1})
	})
}

func (e *env) mustDeliver(t testing.TB, key string, value []byte, want inbox.Outcome) {
	t.Helper()
	got, err := e.deliver(t, key, value)
	if err != nil || got != want {
		t.Fatalf("deliver %s %s: got %q, %v; want %q", key, value, got, err, want)
	}
}

// querier is what a pool and a transaction share.
type querier interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// createOrder inserts an order as the order service does; a status other than PENDING is set after.
func createOrder(t testing.TB, db querier, orderNo, amount, currency, status string) {
	t.Helper()
	if err := insertOrder(db, orderNo, amount, currency, status); err != nil {
		t.Fatal(err)
	}
}

// insertOrder is createOrder for a goroutine other than the test's, which must not call t.Fatal.
func insertOrder(db querier, orderNo, amount, currency, status string) error {
	ctx := context.Background()
	if _, err := db.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ($1, 'user-1', $2::numeric, $3, 'PENDING')`, orderNo, amount, currency); err != nil {
		return err
	}
	if status != "PENDING" {
		if _, err := db.Exec(ctx, `UPDATE orders SET status = $2 WHERE order_no = $1`, orderNo, status); err != nil {
			return err
		}
	}
	return nil
}

// state is what an operator would see of one order: one line per row.
type state struct {
	Order     string
	Payments  []string
	Anomalies []string
}

func readState(t testing.TB, q querier, orderNo string) state {
	t.Helper()
	ctx := context.Background()
	var s state
	var status string
	var txn *string
	var paidAt *time.Time
	if err := q.QueryRow(ctx, `SELECT status, provider_txn_id, paid_at FROM orders WHERE order_no = $1`,
		orderNo).Scan(&status, &txn, &paidAt); err != nil {
		t.Fatalf("read order %s: %v", orderNo, err)
	}
	s.Order = status
	if txn != nil {
		s.Order += " by " + *txn
	}
	if paidAt != nil {
		s.Order += " at " + paidAt.UTC().Format(time.RFC3339)
	}

	rows, _ := q.Query(ctx, `
		SELECT provider || '/' || provider_txn_id || ' ' || result || ' ' || amount::text || ' ' || currency
		       || ' key=' || idempotency_key
		FROM payments WHERE order_no = $1 ORDER BY provider, provider_txn_id`, orderNo)
	payments, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	s.Payments = payments

	rows, _ = q.Query(ctx, `
		SELECT provider || '/' || provider_txn_id || ' ' || kind, detail
		FROM payment_anomalies WHERE order_no = $1 ORDER BY provider, provider_txn_id, kind`, orderNo)
	type anomaly struct {
		Line   string
		Detail map[string]string
	}
	anomalies, err := pgx.CollectRows(rows, pgx.RowToStructByPos[anomaly])
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range anomalies {
		d := a.Detail
		line := fmt.Sprintf("%s expected=%s %s received=%s %s key=%s", a.Line, d["expected_amount"],
			d["expected_currency"], d["received_amount"], d["received_currency"], d["idempotency_key"])
		if p := d["previous_provider_txn_id"]; p != "" {
			line += " previous=" + d["previous_provider"] + "/" + p
		}
		s.Anomalies = append(s.Anomalies, line)
	}
	return s
}

func (s state) String() string {
	b, _ := json.MarshalIndent(s, "", "  ")
	return string(b)
}

func equalState(a, b state) bool {
	return a.Order == b.Order && slices.Equal(a.Payments, b.Payments) && slices.Equal(a.Anomalies, b.Anomalies)
}

const paidAt = "2024-05-01T10:00:00Z"

// callback returns a valid callback for order ORD-1 (alipay transaction T1, 99.90 CNY, SUCCESS)
// with fields changed.
func callback(t testing.TB, changes map[string]any) []byte {
	t.Helper()
	fields := map[string]any{"event_id": nil, "paid_at": paidAt}
	for k, v := range changes {
		fields[k] = v
	}
	return callbackJSON(t, fields)
}

// step is one callback of a contract case: its key, its changes to callback's defaults, and the
// outcome it must have.
type step struct {
	key     string
	changes map[string]any
	want    inbox.Outcome
}

// contractCase is a case of the contract's table of effects, or of the cases it leaves open: the
// callbacks delivered for order ORD-1 (99.90 CNY) in the given status, and the state they leave.
type contractCase struct {
	name  string
	order string // status of ORD-1 (99.90 CNY) before the steps
	steps []step
	want  state
}

var (
	failed = map[string]any{"result": "FAILED"}
	paid   = "PAID by T1 at " + paidAt
)

var contractCases = []contractCase{
	{
		name:  "PendingSuccessPays",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied}},
		want:  state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}},
	},
	{
		name:  "PendingFailedRecordsPayment",
		order: "PENDING",
		steps: []step{{"k1", failed, inbox.Applied}},
		want:  state{Order: "PENDING", Payments: []string{"alipay/T1 FAILED 99.90 CNY key=k1"}},
	},
	{
		name:  "PendingAmountDiffers",
		order: "PENDING",
		steps: []step{{"k1", map[string]any{"amount": "9.99"}, inbox.Applied}},
		want: state{Order: "PENDING", Anomalies: []string{
			"alipay/T1 amount_mismatch expected=99.90 CNY received=9.99 CNY key=k1"}},
	},
	{
		name:  "PendingCurrencyDiffers",
		order: "PENDING",
		steps: []step{{"k1", map[string]any{"currency": "USD"}, inbox.Applied}},
		want: state{Order: "PENDING", Anomalies: []string{
			"alipay/T1 amount_mismatch expected=99.90 CNY received=99.90 USD key=k1"}},
	},
	{
		name:  "PaidBySameTransactionSuccess",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied}, {"k2", nil, inbox.Duplicate}},
		want:  state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}},
	},
	{
		name:  "PaidBySameTransactionFailed",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied}, {"k2", failed, inbox.Duplicate}},
		want:  state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}},
	},
	{
		name:  "PaidByOtherTransaction",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied}, {"k2", map[string]any{"provider_txn_id": "T2"}, inbox.Applied}},
		want: state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}, Anomalies: []string{
			"alipay/T2 duplicate_payment expected=99.90 CNY received=99.90 CNY key=k2 previous=alipay/T1"}},
	},
	{
		name:  "PaidBySameTransactionIDOfOtherProvider",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied}, {"k2", map[string]any{"provider": "wechat"}, inbox.Applied}},
		want: state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}, Anomalies: []string{
			"wechat/T1 duplicate_payment expected=99.90 CNY received=99.90 CNY key=k2 previous=alipay/T1"}},
	},
	{
		name:  "PaidOutsideTheWorker",
		order: "PAID",
		steps: []step{{"k1", nil, inbox.Applied}},
		want: state{Order: "PAID", Anomalies: []string{
			"alipay/T1 duplicate_payment expected=99.90 CNY received=99.90 CNY key=k1"}},
	},
	{
		name:  "CancelledSuccess",
		order: "CANCELLED",
		steps: []step{{"k1", nil, inbox.Applied}},
		want: state{Order: "CANCELLED", Anomalies: []string{
			"alipay/T1 paid_after_cancel expected=99.90 CNY received=99.90 CNY key=k1"}},
	},
	// Cases the contract leaves open (see the package comment).
	{
		name:  "PaidByOtherTransactionFailed",
		order: "PENDING",
		steps: []step{{"k1", nil, inbox.Applied},
			{"k2", map[string]any{"provider_txn_id": "T2", "result": "FAILED"}, inbox.Applied}},
		want: state{Order: paid, Payments: []string{
			"alipay/T1 SUCCESS 99.90 CNY key=k1", "alipay/T2 FAILED 99.90 CNY key=k2"}},
	},
	{
		name:  "CancelledFailed",
		order: "CANCELLED",
		steps: []step{{"k1", failed, inbox.Applied}},
		want:  state{Order: "CANCELLED", Payments: []string{"alipay/T1 FAILED 99.90 CNY key=k1"}},
	},
	{
		name:  "PendingFailedTwiceUnderNewKey",
		order: "PENDING",
		steps: []step{{"k1", failed, inbox.Applied}, {"k2", failed, inbox.Duplicate}},
		want:  state{Order: "PENDING", Payments: []string{"alipay/T1 FAILED 99.90 CNY key=k1"}},
	},
	{
		name:  "FailedThenSuccessOfSameTransaction",
		order: "PENDING",
		steps: []step{{"k1", failed, inbox.Applied}, {"k2", nil, inbox.Applied}},
		want:  state{Order: paid, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k2"}},
	},
	{
		name:  "FailedThenPaidByOtherThenSuccess",
		order: "PENDING",
		steps: []step{{"k1", failed, inbox.Applied},
			{"k2", map[string]any{"provider_txn_id": "T2"}, inbox.Applied},
			{"k3", nil, inbox.Applied}},
		want: state{
			Order:     "PAID by T2 at " + paidAt,
			Payments:  []string{"alipay/T1 FAILED 99.90 CNY key=k1", "alipay/T2 SUCCESS 99.90 CNY key=k2"},
			Anomalies: []string{"alipay/T1 duplicate_payment expected=99.90 CNY received=99.90 CNY key=k3 previous=alipay/T2"},
		},
	},
	{
		name:  "OneAnomalyPerTransaction",
		order: "PENDING",
		steps: []step{{"k1", map[string]any{"amount": "9.99"}, inbox.Applied},
			{"k2", map[string]any{"provider_txn_id": "T2"}, inbox.Applied},
			{"k3", map[string]any{"amount": "9.99"}, inbox.Duplicate}},
		want: state{
			Order:     "PAID by T2 at " + paidAt,
			Payments:  []string{"alipay/T2 SUCCESS 99.90 CNY key=k2"},
			Anomalies: []string{"alipay/T1 amount_mismatch expected=99.90 CNY received=9.99 CNY key=k1"},
		},
	},
}

// TestContract runs the contract's table of effects, and the cases it leaves open, through the
// inbox. Every case then redelivers each of its callbacks, under its own key and under a new one,
// and checks that nothing changes.
func TestContract(t *testing.T) {
	t.Parallel()
	for _, tc := range contractCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			createOrder(t, e.pool, "ORD-1", "99.90", "CNY", tc.order)
			for _, s := range tc.steps {
				e.mustDeliver(t, s.key, callback(t, s.changes), s.want)
			}
			got := readState(t, e.pool, "ORD-1")
			if !equalState(got, tc.want) {
				t.Fatalf("state:\n%s\nwant:\n%s", got, tc.want)
			}
			for _, s := range tc.steps {
				e.mustDeliver(t, s.key, callback(t, s.changes), inbox.Duplicate)
				e.mustDeliver(t, "again-"+s.key, callback(t, s.changes), inbox.Duplicate)
			}
			if again := readState(t, e.pool, "ORD-1"); !equalState(again, got) {
				t.Fatalf("redelivery changed the state:\n%s\nwas:\n%s", again, got)
			}
		})
	}
}

func TestUnknownOrderIsRetryable(t *testing.T) {
	t.Parallel()
	for _, result := range []string{"SUCCESS", "FAILED"} {
		t.Run(strings.ToUpper(result[:1])+strings.ToLower(result[1:]), func(t *testing.T) {
			t.Parallel()
			tx := pgtest.Tx(t)
			err := newHandler(t).Handle(context.Background(), tx, inbox.Delivery{
				Key: "k1", Value: callback(t, map[string]any{"order_no": "NO-SUCH-ORDER", "result": result}), Attempt: 1})
			kind, reason, _ := fault.Classify(err)
			if kind != fault.KindRetryable || reason != payment.UnknownOrder {
				t.Fatalf("got %v/%s (%v), want retryable/%s", kind, reason, err, payment.UnknownOrder)
			}
		})
	}
}

// TestCallbackOvertakesOrder: a callback for an order not created yet records nothing, so its
// retry, once the order exists, applies it.
func TestCallbackOvertakesOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	value := callback(t, nil)
	if outcome, err := e.deliver(t, "k1", value); err == nil {
		t.Fatalf("got %q, want an error", outcome)
	}
	var keys int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("inbox rows = %d, %v; want 0", keys, err)
	}
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	e.mustDeliver(t, "k1", value, inbox.Applied)
	if got := readState(t, e.pool, "ORD-1"); got.Order != "PAID by T1 at "+paidAt {
		t.Fatalf("state:\n%s", got)
	}
}

func TestInvalidPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	createOrder(t, tx, "ORD-1", "99.90", "CNY", "PENDING")
	err := newHandler(t).Handle(context.Background(), tx, inbox.Delivery{
		Key: "k1", Value: callback(t, map[string]any{"amount": 99.9}), Attempt: 1})
	if field := checkInvalid(t, err); field != "amount" {
		t.Fatalf("refused field %q, want amount", field)
	}
	if got := readState(t, tx, "ORD-1"); got.Order != "PENDING" || len(got.Payments)+len(got.Anomalies) != 0 {
		t.Fatalf("state:\n%s", got)
	}
}

// TestSameTransactionUnderTwoKeys: a provider resending one transaction with a new event id is
// recorded once.
func TestSameTransactionUnderTwoKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	e.mustDeliver(t, "evt-1", callback(t, map[string]any{"event_id": "evt-1"}), inbox.Applied)
	e.mustDeliver(t, "evt-2", callback(t, map[string]any{"event_id": "evt-2"}), inbox.Duplicate)
	want := state{Order: "PAID by T1 at " + paidAt, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=evt-1"}}
	if got := readState(t, e.pool, "ORD-1"); !equalState(got, want) {
		t.Fatalf("state:\n%s\nwant:\n%s", got, want)
	}
}

// TestTransactionOfAnotherOrder: a provider transaction that paid one order cannot pay another;
// the callback is refused and nothing of it is written.
func TestTransactionOfAnotherOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "ORD-2", "99.90", "CNY", "PENDING")
	e.mustDeliver(t, "k1", callback(t, nil), inbox.Applied)
	_, err := e.deliver(t, "k2", callback(t, map[string]any{"order_no": "ORD-2"}))
	if field := checkInvalid(t, err); field != "provider_txn_id" {
		t.Fatalf("refused field %q, want provider_txn_id", field)
	}
	if got := readState(t, e.pool, "ORD-2"); got.Order != "PENDING" || len(got.Payments)+len(got.Anomalies) != 0 {
		t.Fatalf("state of ORD-2:\n%s", got)
	}
}

// TestConcurrentSuccesses: SUCCESS callbacks of different transactions for one order, racing in
// their own transactions, pay it once; every other one is a duplicate_payment. Redelivered under
// new keys, they change nothing.
func TestConcurrentSuccesses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	const n = 20
	race := func(keyPrefix string, want inbox.Outcome) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			// Built here: callback may call t.Fatal, which only the test's goroutine may.
			value := callback(t, map[string]any{"provider_txn_id": fmt.Sprintf("T%d", i)})
			wg.Go(func() {
				key := fmt.Sprintf("%s%d", keyPrefix, i)
				if got, err := e.deliver(t, key, value); err != nil || got != want {
					errs <- fmt.Errorf("deliver %s: got %q, %v; want %q", key, got, err, want)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	race("k", inbox.Applied)
	got := readState(t, e.pool, "ORD-1")
	if len(got.Payments) != 1 || len(got.Anomalies) != n-1 {
		t.Fatalf("%d payments, %d anomalies; want 1, %d:\n%s", len(got.Payments), len(got.Anomalies), n-1, got)
	}
	winner, _, _ := strings.Cut(strings.TrimPrefix(got.Payments[0], "alipay/"), " ")
	if got.Order != "PAID by "+winner+" at "+paidAt {
		t.Fatalf("order %q, but the payment is %q", got.Order, got.Payments[0])
	}
	for _, a := range got.Anomalies {
		if !strings.Contains(a, " duplicate_payment ") || !strings.HasSuffix(a, " previous=alipay/"+winner) {
			t.Errorf("anomaly %q, want a duplicate_payment of %s", a, winner)
		}
	}

	race("again-k", inbox.Duplicate)
	if again := readState(t, e.pool, "ORD-1"); !equalState(again, got) {
		t.Fatalf("redelivery changed the state:\n%s\nwas:\n%s", again, got)
	}
}

// hookedTx runs after once, right after the first statement that contains match has run and its
// results have been read.
type hookedTx struct {
	pgx.Tx
	match string
	after func()
	done  bool
}

// hook returns the function to run after a statement of sql.
func (tx *hookedTx) hook(sql string) func() {
	if tx.done || !strings.Contains(sql, tx.match) {
		return func() {}
	}
	tx.done = true
	return tx.after
}

func (tx *hookedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	after := tx.hook(sql)
	tag, err := tx.Tx.Exec(ctx, sql, args...)
	after()
	return tag, err
}

func (tx *hookedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := tx.Tx.Query(ctx, sql, args...)
	return &hookedRows{Rows: rows, after: tx.hook(sql)}, err
}

func (tx *hookedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &hookedRow{row: tx.Tx.QueryRow(ctx, sql, args...), after: tx.hook(sql)}
}

type hookedRows struct {
	pgx.Rows
	after func()
	once  sync.Once
}

func (r *hookedRows) Close() {
	r.Rows.Close()
	r.once.Do(r.after)
}

type hookedRow struct {
	row   pgx.Row
	after func()
}

func (r *hookedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.after()
	return err
}

// TestOrderCommittedDuringCallback: an order committed after the statement that pays the common
// case missed it, but before the follow-up read, is paid, not reported as an anomaly.
func TestOrderCommittedDuringCallback(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	hooked := &hookedTx{Tx: tx, match: "INSERT INTO payment_transactions", after: func() {
		createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	}}
	if err := e.handler.Handle(ctx, hooked, inbox.Delivery{Key: "k1", Value: callback(t, nil), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if !hooked.done {
		t.Fatal("the order was not created between the statements")
	}
	want := state{Order: "PAID by T1 at " + paidAt, Payments: []string{"alipay/T1 SUCCESS 99.90 CNY key=k1"}}
	if got := readState(t, tx, "ORD-1"); !equalState(got, want) {
		t.Fatalf("state:\n%s\nwant:\n%s", got, want)
	}
}
