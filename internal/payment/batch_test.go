package payment_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// delivery is one message of a batch: its idempotency key and value.
type delivery struct {
	key   string
	value []byte
}

// deliverBatch runs ds through the inbox and HandleBatch in one transaction, as the consumer does,
// with tx wrapped by wrap when it is set.
func (e *env) deliverBatch(t testing.TB, ds []delivery, wrap func(pgx.Tx) pgx.Tx) ([]inbox.Outcome, error) {
	t.Helper()
	msgs := make([]inbox.Message, len(ds))
	for i, d := range ds {
		msgs[i] = inbox.Message{Handler: "payments", Key: d.key, Fingerprint: inbox.Fingerprint(d.value), Topic: "payments.callbacks"}
	}
	return e.store.ProcessBatch(context.Background(), msgs, func(ctx context.Context, tx pgx.Tx, claimed []int) []error {
		batch := make([]inbox.Delivery, len(claimed))
		for j, i := range claimed {
			batch[j] = inbox.Delivery{Key: ds[i].key, Value: ds[i].value, Attempt: 1}
		}
		if wrap != nil {
			tx = wrap(tx)
		}
		return e.handler.HandleBatch(ctx, tx, batch)
	})
}

// TestContractInOneBatch runs every case of TestContract in one batch: each case on an order and
// provider transactions of its own, its callbacks in order, the cases one after another. Each
// callback must have the outcome it has when delivered alone, and each order the same state. The
// batch holds the same order several times (PaidByOtherTransaction), the same provider transaction
// under two keys (PaidBySameTransactionSuccess) and callbacks that pay their order with the others
// in one statement (PendingSuccessPays). Then the batch is redelivered, under its keys and under
// new ones, and changes nothing.
func TestContractInOneBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// rename gives a case's order, transactions and keys names of their own: "<case>/T1".
	rename := func(tc contractCase, s step) delivery {
		prefix := tc.name + "/"
		changes := maps.Clone(s.changes)
		if changes == nil {
			changes = map[string]any{}
		}
		changes["order_no"] = "ORD-" + tc.name
		txn, _ := changes["provider_txn_id"].(string)
		changes["provider_txn_id"] = prefix + cmpOr(txn, "T1")
		return delivery{key: prefix + s.key, value: callback(t, changes)}
	}
	var batch []delivery
	var want []inbox.Outcome
	for _, tc := range contractCases {
		createOrder(t, e.pool, "ORD-"+tc.name, "99.90", "CNY", tc.order)
		for _, s := range tc.steps {
			batch = append(batch, rename(tc, s))
			want = append(want, s.want)
		}
	}
	// The state of a case's order, with the case's prefix taken off its names.
	stateOf := func(tc contractCase) state {
		s := readState(t, e.pool, "ORD-"+tc.name)
		strip := func(line string) string { return strings.ReplaceAll(line, tc.name+"/", "") }
		s.Order = strip(s.Order)
		for i := range s.Payments {
			s.Payments[i] = strip(s.Payments[i])
		}
		for i := range s.Anomalies {
			s.Anomalies[i] = strip(s.Anomalies[i])
		}
		return s
	}

	got, err := e.deliverBatch(t, batch, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range batch {
		if got[i] != want[i] {
			t.Errorf("%s: outcome %q, want %q", d.key, got[i], want[i])
		}
	}
	for _, tc := range contractCases {
		if s := stateOf(tc); !equalState(s, tc.want) {
			t.Errorf("%s: state:\n%s\nwant:\n%s", tc.name, s, tc.want)
		}
	}

	again := slices.Clone(batch)
	for _, d := range batch {
		again = append(again, delivery{key: "again-" + d.key, value: d.value})
	}
	got, err = e.deliverBatch(t, again, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range again {
		if got[i] != inbox.Duplicate {
			t.Errorf("redelivery of %s: outcome %q, want %q", d.key, got[i], inbox.Duplicate)
		}
	}
	for _, tc := range contractCases {
		if s := stateOf(tc); !equalState(s, tc.want) {
			t.Errorf("%s: redelivery changed the state:\n%s\nwant:\n%s", tc.name, s, tc.want)
		}
	}
}

func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// countingTx counts the statements sent through it.
type countingTx struct {
	pgx.Tx
	statements int
}

func (tx *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx.statements++
	return tx.Tx.Exec(ctx, sql, args...)
}

func (tx *countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx.statements++
	return tx.Tx.Query(ctx, sql, args...)
}

func (tx *countingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx.statements++
	return tx.Tx.QueryRow(ctx, sql, args...)
}

// TestBatchPaysTogether: callbacks that pay distinct PENDING orders are applied by one statement,
// not two per callback, with the rows Handle writes.
func TestBatchPaysTogether(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 50
	var batch []delivery
	for i := range n {
		orderNo := fmt.Sprintf("ORD-%d", i)
		createOrder(t, e.pool, orderNo, "99.90", "CNY", "PENDING")
		batch = append(batch, delivery{key: fmt.Sprintf("k%d", i),
			value: callback(t, map[string]any{"order_no": orderNo, "provider_txn_id": fmt.Sprintf("T%d", i)})})
	}
	counter := &countingTx{}
	got, err := e.deliverBatch(t, batch, func(tx pgx.Tx) pgx.Tx { counter.Tx = tx; return counter })
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range got {
		if o != inbox.Applied {
			t.Errorf("%s: outcome %q, want applied", batch[i].key, o)
		}
	}
	if counter.statements != 1 {
		t.Errorf("%d statements for %d callbacks, want one", counter.statements, n)
	}
	for i := range n {
		want := state{Order: fmt.Sprintf("PAID by T%d at %s", i, paidAt),
			Payments: []string{fmt.Sprintf("alipay/T%d SUCCESS 99.90 CNY key=k%d", i, i)}}
		if s := readState(t, e.pool, fmt.Sprintf("ORD-%d", i)); !equalState(s, want) {
			t.Fatalf("ORD-%d: state:\n%s\nwant:\n%s", i, s, want)
		}
	}
}

// TestBatchInvalidPayload: an invalid callback in the middle of a batch fails it on that callback,
// and nothing of the batch is recorded.
func TestBatchInvalidPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "ORD-2", "99.90", "CNY", "PENDING")
	batch := []delivery{
		{"k1", callback(t, map[string]any{"order_no": "ORD-1"})},
		{"k2", callback(t, map[string]any{"order_no": "ORD-2", "amount": 99.9})},
		{"k3", callback(t, map[string]any{"order_no": "ORD-2", "provider_txn_id": "T2"})},
	}
	_, err := e.deliverBatch(t, batch, nil)
	var be *inbox.BatchError
	if !errors.As(err, &be) || be.Index != 1 {
		t.Fatalf("got %v, want a *BatchError at 1", err)
	}
	if field := checkInvalid(t, err); field != "amount" {
		t.Fatalf("refused field %q, want amount", field)
	}
	for _, orderNo := range []string{"ORD-1", "ORD-2"} {
		if s := readState(t, e.pool, orderNo); s.Order != "PENDING" || len(s.Payments)+len(s.Anomalies) != 0 {
			t.Errorf("%s: state:\n%s", orderNo, s)
		}
	}
}

// TestBatchTransactionOfAnotherOrder: a provider transaction named by two orders in one batch pays
// the first, and the second callback is refused, as when delivered alone.
func TestBatchTransactionOfAnotherOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "ORD-2", "99.90", "CNY", "PENDING")
	batch := []delivery{
		{"k1", callback(t, map[string]any{"order_no": "ORD-1"})},
		{"k2", callback(t, map[string]any{"order_no": "ORD-2"})},
	}
	_, err := e.deliverBatch(t, batch, nil)
	var be *inbox.BatchError
	if !errors.As(err, &be) || be.Index != 1 {
		t.Fatalf("got %v, want a *BatchError at 1", err)
	}
	if field := checkInvalid(t, err); field != "provider_txn_id" {
		t.Fatalf("refused field %q, want provider_txn_id", field)
	}
}

// TestBatchConcurrentSuccesses: batches racing in their own transactions, each paying ORD-1 with a
// transaction of its own and an order of its own, pay ORD-1 once; every other callback for it is a
// duplicate_payment, and every batch's own order is paid.
func TestBatchConcurrentSuccesses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	const n = 8
	for i := range n {
		createOrder(t, e.pool, fmt.Sprintf("OWN-%d", i), "99.90", "CNY", "PENDING")
	}
	var wg sync.WaitGroup
	for i := range n {
		// Built here: callback may call t.Fatal, which only the test's goroutine may.
		batch := []delivery{
			{fmt.Sprintf("k%d", i), callback(t, map[string]any{"provider_txn_id": fmt.Sprintf("T%d", i)})},
			{fmt.Sprintf("own%d", i), callback(t, map[string]any{"order_no": fmt.Sprintf("OWN-%d", i),
				"provider_txn_id": fmt.Sprintf("OWN-T%d", i)})},
		}
		wg.Go(func() {
			got, err := e.deliverBatch(t, batch, nil)
			if err != nil || !slices.Equal(got, []inbox.Outcome{inbox.Applied, inbox.Applied}) {
				t.Errorf("batch %d: got %v, %v; want both applied", i, got, err)
			}
		})
	}
	wg.Wait()
	got := readState(t, e.pool, "ORD-1")
	if len(got.Payments) != 1 || len(got.Anomalies) != n-1 {
		t.Fatalf("%d payments, %d anomalies; want 1, %d:\n%s", len(got.Payments), len(got.Anomalies), n-1, got)
	}
	for i := range n {
		if s := readState(t, e.pool, fmt.Sprintf("OWN-%d", i)); !strings.HasPrefix(s.Order, "PAID by OWN-T") {
			t.Errorf("OWN-%d: state:\n%s", i, s)
		}
	}
}

// TestBatchTransactionRecordedConcurrently: a provider transaction that a concurrent transaction
// records for another order while a batch pays with it makes the batch's statement wait, and then
// not pay with it: only that callback is refused, as when delivered alone, and the others apply.
func TestBatchTransactionRecordedConcurrently(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	config, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	app := "payment_test_" + hex.EncodeToString(suffix)
	config.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, inbox.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{pool: pool, store: store, handler: newHandler(t)}
	for _, orderNo := range []string{"ORD-1", "ORD-2", "ORD-3"} {
		createOrder(t, pool, orderNo, "99.90", "CNY", "PENDING")
	}

	// The first batch pays ORD-1 with T1 and holds its transaction open.
	paidFirst, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	// The batches are built here: callback may call t.Fatal, which only the test's goroutine may.
	first := []delivery{{"k1", callback(t, map[string]any{"order_no": "ORD-1"})}}
	second := []delivery{
		{"k2", callback(t, map[string]any{"order_no": "ORD-2"})},
		{"k3", callback(t, map[string]any{"order_no": "ORD-3", "provider_txn_id": "T3"})},
	}
	go func() {
		_, err := e.deliverBatch(t, first,
			func(tx pgx.Tx) pgx.Tx {
				return &hookedTx{Tx: tx, match: "INSERT INTO payment_transactions", after: func() { close(paidFirst); <-release }}
			})
		firstDone <- err
	}()
	<-paidFirst

	// The second names T1 for ORD-2: its statement waits for the first transaction, then fails.
	secondDone := make(chan error, 1)
	go func() {
		_, err := e.deliverBatch(t, second, nil)
		secondDone <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second batch never waited for the first")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	err = <-secondDone
	var be *inbox.BatchError
	if !errors.As(err, &be) || be.Index != 0 {
		t.Fatalf("second batch: got %v, want a *BatchError at 0", err)
	}
	if field := checkInvalid(t, err); field != "provider_txn_id" {
		t.Fatalf("refused field %q, want provider_txn_id", field)
	}

	// As the consumer does: the refused callback is dead-lettered, the rest applied again.
	got, err := e.deliverBatch(t, []delivery{{"k3", callback(t, map[string]any{"order_no": "ORD-3", "provider_txn_id": "T3"})}}, nil)
	if err != nil || !slices.Equal(got, []inbox.Outcome{inbox.Applied}) {
		t.Fatalf("the rest: got %v, %v; want applied", got, err)
	}
	if s := readState(t, pool, "ORD-2"); s.Order != "PENDING" {
		t.Errorf("ORD-2: state:\n%s", s)
	}
	if s := readState(t, pool, "ORD-3"); s.Order != "PAID by T3 at "+paidAt {
		t.Errorf("ORD-3: state:\n%s", s)
	}
}

// TestHandleBatchStopsAtFirstError: HandleBatch reports an invalid callback where it is, and does
// not apply the callbacks after it.
func TestHandleBatchStopsAtFirstError(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	createOrder(t, tx, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, tx, "ORD-2", "99.90", "CNY", "PENDING")
	errs := newHandler(t).HandleBatch(context.Background(), tx, []inbox.Delivery{
		{Key: "k1", Value: callback(t, map[string]any{"order_no": "ORD-1"}), Attempt: 1},
		{Key: "k2", Value: []byte(`{"order_no":`), Attempt: 1},
		{Key: "k3", Value: callback(t, map[string]any{"order_no": "ORD-2", "provider_txn_id": "T2"}), Attempt: 1},
	})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errors = %v, want one for k2 only", errs)
	}
	if kind, reason, _ := fault.Classify(errs[1]); kind != fault.KindPermanent || reason != inboxtype.InvalidPayload {
		t.Fatalf("k2: %v/%s (%v), want permanent/%s", kind, reason, errs[1], inboxtype.InvalidPayload)
	}
	if s := readState(t, tx, "ORD-1"); s.Order != paid {
		t.Errorf("ORD-1, before the invalid callback: state:\n%s", s)
	}
	if s := readState(t, tx, "ORD-2"); s.Order != "PENDING" {
		t.Errorf("ORD-2, after the invalid callback: state:\n%s", s)
	}
}

var _ interface {
	HandleBatch(context.Context, pgx.Tx, []inbox.Delivery) []error
} = (*payment.Handler)(nil)
