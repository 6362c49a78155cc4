package reconcile

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/wait"
)

// Metrics are reconciliation's: the answers, and the orders left PENDING.
type Metrics struct {
	reconciliations *prometheus.CounterVec // inboxworker_reconciliations_total{result}
	pending         *prometheus.GaugeVec   // inboxworker_payments_pending{age}
	oldest          prometheus.Gauge       // inboxworker_payments_pending_oldest_seconds
}

// The age label's values.
const (
	ageOverAfter  = "over_reconcile_after"
	ageOverMaxAge = "over_max_age"
)

// NewMetrics registers the metrics with reg, every series at 0.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inboxworker_reconciliations_total",
			Help: "Questions to the payment provider about orders left PENDING, by result: paid and failed (a payment whose callback never came, applied), pending, unknown (404), error."},
			[]string{"result"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inboxworker_payments_pending",
			Help: "Orders PENDING longer than RECONCILE_AFTER and not past RECONCILE_MAX_AGE (over_reconcile_after), and past RECONCILE_MAX_AGE (over_max_age), left PENDING; read every 30s."},
			[]string{"age"}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Name: "inboxworker_payments_pending_oldest_seconds",
			Help: "Age of the oldest PENDING order; 0 when none is; read every 30s."}),
	}
	reg.MustRegister(m.reconciliations, m.pending, m.oldest)
	for _, r := range results {
		m.reconciliations.WithLabelValues(r)
	}
	m.pending.WithLabelValues(ageOverAfter)
	m.pending.WithLabelValues(ageOverMaxAge)
	return m
}

func (m *Metrics) answered(result string) {
	if m != nil {
		m.reconciliations.WithLabelValues(result).Inc()
	}
}

// pendingInterval is how often the pending orders are counted.
const pendingInterval = 30 * time.Second

// CountPending refreshes the pending gauges at once, then every 30s, until ctx is done: orders
// PENDING past after and not past maxAge, past maxAge, and the oldest one's age. It reads the
// partial index of PENDING orders; it runs whether or not the provider is asked.
func (m *Metrics) CountPending(ctx context.Context, pool *pgxpool.Pool, after, maxAge time.Duration, log *slog.Logger) {
	wait.Every(ctx, pendingInterval, log, "count the PENDING orders", func(ctx context.Context) error {
		return m.countPending(ctx, pool, after, maxAge)
	})
}

func (m *Metrics) countPending(ctx context.Context, pool *pgxpool.Pool, after, maxAge time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var overAfter, overMax int64
	var oldest float64
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE created_at <= now() - $1 * interval '1 microsecond'
		                          AND created_at > now() - $2 * interval '1 microsecond'),
		       count(*) FILTER (WHERE created_at <= now() - $2 * interval '1 microsecond'),
		       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM orders WHERE status = 'PENDING'`, after.Microseconds(), maxAge.Microseconds()).
		Scan(&overAfter, &overMax, &oldest)
	if err != nil {
		return err
	}
	m.pending.WithLabelValues(ageOverAfter).Set(float64(overAfter))
	m.pending.WithLabelValues(ageOverMaxAge).Set(float64(overMax))
	m.oldest.Set(max(oldest, 0))
	return nil
}
