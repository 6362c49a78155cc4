package payment

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AnomalyCount is what payment_anomalies holds of one kind.
type AnomalyCount struct {
	// Rows is how many rows of the kind are committed.
	Rows int64
	// Latest is when the newest of them was recorded; zero when there is none.
	Latest time.Time
}

// CountAnomalies returns the committed rows of payment_anomalies by kind, every kind present (no
// rows when it has none), for the metrics and the demo's summary, in one statement. It reads; it
// decides nothing.
func CountAnomalies(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) (map[string]AnomalyCount, error) {
	rows, err := db.Query(ctx, `SELECT kind, count(*), max(created_at) FROM payment_anomalies GROUP BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]AnomalyCount{AmountMismatch: {}, DuplicatePayment: {}, PaidAfterCancel: {}}
	for rows.Next() {
		var kind string
		var c AnomalyCount
		if err := rows.Scan(&kind, &c.Rows, &c.Latest); err != nil {
			return nil, err
		}
		counts[kind] = c
	}
	return counts, rows.Err()
}
