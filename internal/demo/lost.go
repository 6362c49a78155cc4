package demo

import (
	"context"
	"encoding/json"
	"net/http"
)

// lostOrder is the order whose callback never comes: the demo's provider says it was paid when it
// is asked (StatusEndpoint), and reconciliation applies that.
const (
	lostOrder = "DEMO-1007"
	lostTxn   = "T-1007"
)

// ReconcileAfter is RECONCILE_AFTER in the demo: the lost order was created an hour before the
// demo starts, the others as it starts, so that only the lost one is asked about.
const ReconcileAfter = "30m"

// StatusEndpoint is the demo's payment provider's status endpoint (PAYMENT_STATUS_URL): it knows
// the lost order's payment, and answers 404 for any other order.
func StatusEndpoint() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("order_no") != lostOrder {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"order_no": lostOrder, "provider": "alipay",
			"provider_txn_id": lostTxn, "amount": "30.00", "currency": "CNY", "result": "SUCCESS",
			"paid_at": "2026-12-01T09:00:00Z"})
	})
}

// readReconciled reads the orders paid from the provider's answers rather than by their callbacks.
func (s *summary) readReconciled(ctx context.Context, cfg Config) error {
	rows, err := cfg.Pool.Query(ctx, `SELECT order_no FROM payments WHERE source = 'reconciliation' ORDER BY order_no`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var orderNo string
		if err := rows.Scan(&orderNo); err != nil {
			return err
		}
		s.reconciled = append(s.reconciled, orderNo)
	}
	return rows.Err()
}
