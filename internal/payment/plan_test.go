package payment

import (
	"context"
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestPayAllPlan: the batch statement reads tables by primary key only, in the generic plan that a
// prepared statement keeps, on a freshly migrated database with no statistics, empty and with a
// thousand orders.
func TestPayAllPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgtest.Schema(t).Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `RESET plan_cache_mode`) }()
	for _, orders := range []int{0, 1000} {
		if _, err := conn.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency)
			SELECT 'ORD-' || i, 'user-1', 99.90, 'CNY' FROM generate_series(1, $1) AS i`, orders); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `PREPARE pay_all (text[], text[], text[], text[], text[], timestamptz[], text[], text[]) AS `+
			payAllSQL); err != nil {
			t.Fatal(err)
		}
		rows, _ := conn.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE pay_all ('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')`)
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `DEALLOCATE pay_all`); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan") || !strings.Contains(text, "Index Scan using orders_pkey") ||
			!strings.Contains(text, "Conflict Arbiter Indexes: payment_transactions_pkey") {
			t.Errorf("%d orders: the plan reads a table other than by primary key:\n%s", orders, text)
		}
	}
}
