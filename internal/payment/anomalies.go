package payment

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// CountAnomalies returns the committed rows of payment_anomalies by kind, every kind present (0
// when it has none), for the metrics and the demo's summary. It reads; it decides nothing.
func CountAnomalies(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) (map[string]int64, error) {
	rows, err := db.Query(ctx, `SELECT kind, count(*) FROM payment_anomalies GROUP BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]int64{AmountMismatch: 0, DuplicatePayment: 0, PaidAfterCancel: 0}
	for rows.Next() {
		var kind string
		var n int64
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		counts[kind] = n
	}
	return counts, rows.Err()
}
