package cli

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestAnomalyGauge checks that inboxworker_payment_anomalies reports the committed rows of
// payment_anomalies by kind, every kind from the first refresh, and follows new rows; and that
// inboxworker_payment_anomaly_latest_timestamp_seconds says when the newest row of each kind was
// recorded, 0 for a kind without one.
func TestAnomalyGauge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Schema(t)
	g := newAnomalyGauge(prometheus.NewRegistry())
	if n := testutil.CollectAndCount(g.gauge); n != 0 {
		t.Errorf("%d series before the table was read, want none", n)
	}
	check := func(want map[string]float64) {
		t.Helper()
		if err := g.refresh(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
		if n := testutil.CollectAndCount(g.gauge); n != len(want) {
			t.Errorf("%d series, want %d", n, len(want))
		}
		for kind, n := range want {
			if got := testutil.ToFloat64(g.gauge.WithLabelValues(kind)); got != n {
				t.Errorf("%s: %v, want %v", kind, got, n)
			}
		}
	}
	check(map[string]float64{"amount_mismatch": 0, "duplicate_payment": 0, "paid_after_cancel": 0})
	_, err := db.Pool.Exec(ctx, `INSERT INTO payment_anomalies (order_no, provider, provider_txn_id, kind) VALUES
		('A-1', 'alipay', 'T-1', 'paid_after_cancel'), ('A-2', 'alipay', 'T-2', 'paid_after_cancel'),
		('A-3', 'alipay', 'T-3', 'amount_mismatch')`)
	if err != nil {
		t.Fatal(err)
	}
	check(map[string]float64{"amount_mismatch": 1, "duplicate_payment": 0, "paid_after_cancel": 2})
	var newest time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT max(created_at) FROM payment_anomalies`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]float64{"amount_mismatch": float64(newest.UnixNano()) / 1e9,
		"paid_after_cancel": float64(newest.UnixNano()) / 1e9, "duplicate_payment": 0} {
		got := testutil.ToFloat64(g.latest.WithLabelValues(kind))
		if got != want {
			t.Errorf("latest %s: %v, want %v", kind, got, want)
		}
	}
}
