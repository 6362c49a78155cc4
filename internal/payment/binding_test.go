package payment_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// bindingStep is one callback of a bindingCase: its key, its changes to callback's defaults, and
// either the outcome it must have or, when field is set, the field it must be refused for
// (invalid_payload), having recorded nothing.
type bindingStep struct {
	key     string
	changes map[string]any
	want    inbox.Outcome
	field   string
}

// bindingOrder is an order of a bindingCase before its steps.
type bindingOrder struct {
	amount, status string
}

// bindingCase is a sequence of callbacks over several orders, and the state of each order after.
type bindingCase struct {
	name   string
	orders map[string]bindingOrder
	steps  []bindingStep
	want   map[string]state
}

var (
	paidByT1 = "PAID by T-1 at " + paidAt
	paidByT2 = "PAID by T-2 at " + paidAt
)

// bindingCases: a provider transaction belongs to one order and carries one amount and currency.
// Whatever the state of the order a later callback names, a transaction recorded (paid, failed or
// flagged) for another order, or with other money, is refused, and nothing is recorded.
var bindingCases = []bindingCase{
	{
		name:   "PaidOtherOrderNowForPaidOrder",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-2"}, want: inbox.Applied},
			{key: "k3", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: paidByT2, Payments: []string{"alipay/T-2 SUCCESS 99.90 CNY key=k2"}},
			"B": {Order: paidByT1, Payments: []string{"alipay/T-1 SUCCESS 99.90 CNY key=k1"}},
		},
	},
	{
		name:   "PaidOtherOrderNowForCancelledOrder",
		orders: map[string]bindingOrder{"A": {"99.90", "CANCELLED"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: "CANCELLED"},
			"B": {Order: paidByT1, Payments: []string{"alipay/T-1 SUCCESS 99.90 CNY key=k1"}},
		},
	},
	{
		name:   "PaidOtherOrderNowForMismatchingOrder",
		orders: map[string]bindingOrder{"A": {"50.00", "PENDING"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: "PENDING"},
			"B": {Order: paidByT1, Payments: []string{"alipay/T-1 SUCCESS 99.90 CNY key=k1"}},
		},
	},
	{
		name:   "PaidOtherOrderNowFailedForPendingOrder",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "result": "FAILED"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: "PENDING"},
			"B": {Order: paidByT1, Payments: []string{"alipay/T-1 SUCCESS 99.90 CNY key=k1"}},
		},
	},
	{
		name:   "FailedForOtherOrderNowForCancelledOrder",
		orders: map[string]bindingOrder{"A": {"99.90", "CANCELLED"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1", "result": "FAILED"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: "CANCELLED"},
			"B": {Order: "PENDING", Payments: []string{"alipay/T-1 FAILED 99.90 CNY key=k1"}},
		},
	},
	{
		// The refund flag must never stand on the transaction that paid.
		name:   "FlaggedForOtherOrderNowPays",
		orders: map[string]bindingOrder{"A": {"99.90", "CANCELLED"}, "B": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "B", "provider_txn_id": "T-1"}, field: "provider_txn_id"},
		},
		want: map[string]state{
			"A": {Order: "CANCELLED", Anomalies: []string{
				"alipay/T-1 paid_after_cancel expected=99.90 CNY received=99.90 CNY key=k1"}},
			"B": {Order: "PENDING"},
		},
	},
	{
		name:   "MismatchThenMatchingAmount",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "amount": "99.91"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "amount"},
		},
		want: map[string]state{
			"A": {Order: "PENDING", Anomalies: []string{
				"alipay/T-1 amount_mismatch expected=99.90 CNY received=99.91 CNY key=k1"}},
		},
	},
	{
		name:   "MismatchThenMatchingCurrency",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "currency": "USD"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "currency"},
		},
		want: map[string]state{
			"A": {Order: "PENDING", Anomalies: []string{
				"alipay/T-1 amount_mismatch expected=99.90 CNY received=99.90 USD key=k1"}},
		},
	},
	{
		name:   "PaidThenOtherAmount",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "amount": "99.91"}, field: "amount"},
		},
		want: map[string]state{
			"A": {Order: paidByT1, Payments: []string{"alipay/T-1 SUCCESS 99.90 CNY key=k1"}},
		},
	},
	{
		name:   "FailedThenSuccessWithOtherAmount",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "amount": "99.91", "result": "FAILED"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1"}, field: "amount"},
		},
		want: map[string]state{
			"A": {Order: "PENDING", Payments: []string{"alipay/T-1 FAILED 99.91 CNY key=k1"}},
		},
	},
	{
		// The same money under a new key is still the provider's resend: a duplicate.
		name:   "FlaggedThenSameMoneyAgain",
		orders: map[string]bindingOrder{"A": {"99.90", "PENDING"}},
		steps: []bindingStep{
			{key: "k1", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "amount": "99.91"}, want: inbox.Applied},
			{key: "k2", changes: map[string]any{"order_no": "A", "provider_txn_id": "T-1", "amount": "99.91"}, want: inbox.Duplicate},
		},
		want: map[string]state{
			"A": {Order: "PENDING", Anomalies: []string{
				"alipay/T-1 amount_mismatch expected=99.90 CNY received=99.91 CNY key=k1"}},
		},
	},
}

// TestTransactionBinding runs bindingCases with a transaction per callback (Handle) and in batches
// (HandleBatch): the callbacks that apply in batches of their own, in order, each batch opened by a
// callback that pays an order of its own; a refused one in a batch of its own after such a
// callback, which the refusal must roll back with it.
func TestTransactionBinding(t *testing.T) {
	t.Parallel()
	for _, tc := range bindingCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, batched := range []bool{false, true} {
				t.Run(map[bool]string{false: "PerMessage", true: "PerBatch"}[batched], func(t *testing.T) {
					t.Parallel()
					testTransactionBinding(t, tc, batched)
				})
			}
		})
	}
}

func testTransactionBinding(t *testing.T, tc bindingCase, batched bool) {
	e := setup(t)
	for orderNo, o := range tc.orders {
		createOrder(t, e.pool, orderNo, o.amount, "CNY", o.status)
	}
	value := func(s bindingStep) []byte { return callback(t, s.changes) }
	if !batched {
		for _, s := range tc.steps {
			got, err := e.deliver(t, s.key, value(s))
			if s.field != "" {
				if field := checkInvalid(t, err); field != s.field {
					t.Fatalf("%s: refused field %q, want %q", s.key, field, s.field)
				}
				continue
			}
			if err != nil || got != s.want {
				t.Fatalf("%s: got %q, %v; want %q", s.key, got, err, s.want)
			}
		}
	} else {
		// filler returns a callback that pays an order of its own, created now.
		fillers := 0
		filler := func() delivery {
			fillers++
			orderNo := fmt.Sprintf("FILL-%d", fillers)
			createOrder(t, e.pool, orderNo, "99.90", "CNY", "PENDING")
			return delivery{key: "fill-" + orderNo, value: callback(t, map[string]any{
				"order_no": orderNo, "provider_txn_id": "T-" + orderNo})}
		}
		for i := 0; i < len(tc.steps); {
			batch := []delivery{filler()}
			want := []inbox.Outcome{inbox.Applied}
			if s := tc.steps[i]; s.field != "" {
				batch = append(batch, delivery{s.key, value(s)})
				_, err := e.deliverBatch(t, batch, nil)
				var be *inbox.BatchError
				if !errors.As(err, &be) || be.Index != 1 {
					t.Fatalf("%s: got %v, want a *BatchError at 1", s.key, err)
				}
				if field := checkInvalid(t, err); field != s.field {
					t.Fatalf("%s: refused field %q, want %q", s.key, field, s.field)
				}
				if st := readState(t, e.pool, fmt.Sprintf("FILL-%d", fillers)); st.Order != "PENDING" {
					t.Fatalf("the refused batch left its other callback recorded:\n%s", st)
				}
				i++
				continue
			}
			for ; i < len(tc.steps) && tc.steps[i].field == ""; i++ {
				batch = append(batch, delivery{tc.steps[i].key, value(tc.steps[i])})
				want = append(want, tc.steps[i].want)
			}
			got, err := e.deliverBatch(t, batch, nil)
			if err != nil {
				t.Fatal(err)
			}
			for j, d := range batch {
				if got[j] != want[j] {
					t.Errorf("%s: outcome %q, want %q", d.key, got[j], want[j])
				}
			}
		}
	}
	for orderNo, want := range tc.want {
		if got := readState(t, e.pool, orderNo); !equalState(got, want) {
			t.Errorf("%s: state:\n%s\nwant:\n%s", orderNo, got, want)
		}
	}
}

// TestOneOrderPerTransactionConcurrently: one provider transaction arriving at once for a cancelled
// order and for an order whose amount differs, each in its own transaction, is recorded for one of
// them, and flagged once; the other callback is refused naming provider_txn_id. With a
// transaction per callback and per batch.
func TestOneOrderPerTransactionConcurrently(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(map[bool]string{false: "PerMessage", true: "PerBatch"}[batched], func(t *testing.T) {
			t.Parallel()
			testOneOrderPerTransactionConcurrently(t, batched)
		})
	}
}

func testOneOrderPerTransactionConcurrently(t *testing.T, batched bool) {
	const pairs = 200
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO orders (order_no, user_id, amount, currency, status)
		SELECT prefix || i, 'user-1', 99.90, 'CNY', status
		FROM generate_series(0, $1 - 1) AS i,
		     (VALUES ('CANCELLED-', 'CANCELLED'), ('MISMATCH-', 'PENDING')) AS o(prefix, status)`,
		pairs); err != nil {
		t.Fatal(err)
	}
	deliver := func(key string, value []byte) error {
		if !batched {
			_, err := e.deliver(t, key, value)
			return err
		}
		_, err := e.deliverBatch(t, []delivery{{key, value}}, nil)
		return err
	}
	type result struct {
		err error
		ok  bool
	}
	results := make([][2]result, pairs)
	var wg sync.WaitGroup
	for i := range pairs {
		for side, orderNo := range []string{fmt.Sprintf("CANCELLED-%d", i), fmt.Sprintf("MISMATCH-%d", i)} {
			value := callback(t, map[string]any{"order_no": orderNo, "provider_txn_id": fmt.Sprintf("T-%d", i),
				"amount": "99.91"})
			wg.Go(func() {
				err := deliver(fmt.Sprintf("k%d-%d", i, side), value)
				results[i][side] = result{err: err, ok: err == nil}
			})
		}
	}
	wg.Wait()

	rows, err := e.pool.Query(ctx, `SELECT provider_txn_id, order_no, kind FROM payment_anomalies`)
	if err != nil {
		t.Fatal(err)
	}
	flagged := map[string][]string{}
	for rows.Next() {
		var txn, orderNo, kind string
		if err := rows.Scan(&txn, &orderNo, &kind); err != nil {
			t.Fatal(err)
		}
		flagged[txn] = append(flagged[txn], orderNo+" "+kind)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	twice := 0
	for i := range pairs {
		txn := fmt.Sprintf("T-%d", i)
		r := results[i]
		if r[0].ok == r[1].ok {
			t.Errorf("%s: cancelled order %v, mismatching order %v; want one applied and one refused", txn, r[0].err, r[1].err)
		}
		for _, side := range r {
			if side.err == nil {
				continue
			}
			var fe *payment.FieldError
			if kind, reason, _ := fault.Classify(side.err); kind != fault.KindPermanent || reason != inboxtype.InvalidPayload ||
				!errors.As(side.err, &fe) || fe.Field != "provider_txn_id" {
				t.Errorf("%s: refused with %v/%s: %v; want invalid_payload naming provider_txn_id", txn, kind, reason, side.err)
			}
		}
		want := fmt.Sprintf("CANCELLED-%d paid_after_cancel", i)
		if r[1].ok {
			want = fmt.Sprintf("MISMATCH-%d amount_mismatch", i)
		}
		if len(flagged[txn]) > 1 {
			twice++
		}
		if len(flagged[txn]) != 1 || flagged[txn][0] != want {
			t.Errorf("%s: anomalies %q, want [%s]", txn, flagged[txn], want)
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d transactions flagged more than once", twice, pairs)
	}
}

// lockedBuffer is a log destination that goroutines share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many lines hold all of parts.
func (b *lockedBuffer) count(parts ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for line := range strings.Lines(b.buf.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			n++
		}
	}
	return n
}

// TestLogsWhatCommitted: a transaction that rolls back after the handler applied its callbacks
// logs nothing of them; its re-run logs each effect once, at info, the worker's default level: an
// operator can tell from the log that a callback applied. With a transaction per callback, and a
// batch rolled back because of one invalid callback and run again without it, as the consumer does.
func TestLogsWhatCommitted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	logs := &lockedBuffer{}
	handler, err := payment.NewHandler(payment.Config{
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, testlog.Writer(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	e.handler = handler
	for _, orderNo := range []string{"PAY-1", "PAY-2", "FAIL-1", "FAIL-2"} {
		createOrder(t, e.pool, orderNo, "99.90", "CNY", "PENDING")
	}
	for _, orderNo := range []string{"CANCELLED-1", "CANCELLED-2"} {
		createOrder(t, e.pool, orderNo, "99.90", "CNY", "CANCELLED")
	}
	pay := func(n int) []byte {
		return callback(t, map[string]any{"order_no": fmt.Sprintf("PAY-%d", n), "provider_txn_id": fmt.Sprintf("T-PAY-%d", n)})
	}
	flag := func(n int) []byte {
		return callback(t, map[string]any{"order_no": fmt.Sprintf("CANCELLED-%d", n), "provider_txn_id": fmt.Sprintf("T-CANCELLED-%d", n)})
	}
	fail := func(n int) []byte {
		return callback(t, map[string]any{"order_no": fmt.Sprintf("FAIL-%d", n), "provider_txn_id": fmt.Sprintf("T-FAIL-%d", n),
			"result": "FAILED"})
	}

	t.Run("PerMessage", func(t *testing.T) {
		ctx := context.Background()
		for _, d := range []delivery{{"pay-1", pay(1)}, {"flag-1", flag(1)}, {"fail-1", fail(1)}} {
			msg := inbox.Message{Handler: "payments", Key: d.key, Fingerprint: inbox.Fingerprint(d.value), Topic: "payments.callbacks"}
			rolledBack := errors.New("a later step failed")
			_, err := e.store.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
				if err := e.handler.Handle(ctx, tx, inbox.Delivery{Key: d.key, Value: d.value, Attempt: 1}); err != nil {
					return err
				}
				return rolledBack
			})
			if !errors.Is(err, rolledBack) {
				t.Fatalf("%s: got %v, want the effect's error", d.key, err)
			}
			e.mustDeliver(t, d.key, d.value, inbox.Applied)
		}
		if n := logs.count("level=INFO", "payment callback applied", "provider_txn_id=T-PAY-1 ", "effect=order_paid"); n != 1 {
			t.Errorf("%d lines for paying PAY-1, want 1", n)
		}
		if n := logs.count("payment anomaly recorded", "provider_txn_id=T-CANCELLED-1 "); n != 1 {
			t.Errorf("%d lines for the anomaly of T-CANCELLED-1, want 1", n)
		}
		if n := logs.count("level=INFO", "payment callback applied", "idempotency_key=fail-1", "effect=failed_payment_recorded"); n != 1 {
			t.Errorf("%d lines for the failed payment of FAIL-1, want 1", n)
		}
	})

	t.Run("PerBatch", func(t *testing.T) {
		batch := []delivery{{"pay-2", pay(2)}, {"flag-2", flag(2)}, {"fail-2", fail(2)}, {"bad", []byte(`{"order_no":`)}}
		if _, err := e.deliverBatch(t, batch, nil); err == nil {
			t.Fatal("the batch with an invalid callback committed")
		}
		if _, err := e.deliverBatch(t, batch[:3], nil); err != nil {
			t.Fatal(err)
		}
		if n := logs.count("level=INFO", "payment callback applied", "provider_txn_id=T-PAY-2 ", "effect=order_paid"); n != 1 {
			t.Errorf("%d lines for paying PAY-2, want 1", n)
		}
		if n := logs.count("payment anomaly recorded", "provider_txn_id=T-CANCELLED-2 "); n != 1 {
			t.Errorf("%d lines for the anomaly of T-CANCELLED-2, want 1", n)
		}
		if n := logs.count("level=INFO", "payment callback applied", "idempotency_key=fail-2", "effect=failed_payment_recorded"); n != 1 {
			t.Errorf("%d lines for the failed payment of FAIL-2, want 1", n)
		}
	})
}

// TestAppliedLevel: with Config.AppliedLevel at debug, a logger at info carries no line for an
// applied callback, and still the anomaly's.
func TestAppliedLevel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	logs := &lockedBuffer{}
	handler, err := payment.NewHandler(payment.Config{AppliedLevel: slog.LevelDebug,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, testlog.Writer(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	e.handler = handler
	createOrder(t, e.pool, "PAY-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "CANCELLED-1", "99.90", "CNY", "CANCELLED")
	e.mustDeliver(t, "pay-1", callback(t, map[string]any{"order_no": "PAY-1", "provider_txn_id": "T-1"}), inbox.Applied)
	e.mustDeliver(t, "flag-1", callback(t, map[string]any{"order_no": "CANCELLED-1", "provider_txn_id": "T-2"}), inbox.Applied)
	if n := logs.count("payment callback applied"); n != 0 {
		t.Errorf("%d lines for the applied callback at info, want none", n)
	}
	if n := logs.count("payment anomaly recorded", "provider_txn_id=T-2 "); n != 1 {
		t.Errorf("%d lines for the anomaly, want 1", n)
	}
}

// TestUniqueViolationIsRetryable: a payment row written by hand, outside the rules that record its
// provider transaction first, makes the callback that pays with that transaction meet the unique
// key. That is retried, as a conflict with another writer is, never a handler_error.
func TestUniqueViolationIsRetryable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "ORD-2", "99.90", "CNY", "PENDING")
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, idempotency_key)
		VALUES ('alipay', 'T1', 'ORD-2', 99.90, 'CNY', 'FAILED', 'by-hand')`); err != nil {
		t.Fatal(err)
	}
	_, err := e.deliver(t, "k1", callback(t, nil))
	if kind, reason, _ := fault.Classify(err); kind != fault.KindRetryable {
		t.Fatalf("got %v/%s: %v; want retryable", kind, reason, err)
	}
	if got := readState(t, e.pool, "ORD-1"); got.Order != "PENDING" {
		t.Fatalf("state:\n%s", got)
	}
}
