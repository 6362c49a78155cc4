package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// anomalyInterval is how often the payment anomaly gauge is read from Postgres.
const anomalyInterval = 30 * time.Second

// anomalyGauge is inboxworker_payment_anomalies{kind}, the rows of payment_anomalies by kind as
// committed, and inboxworker_payment_anomaly_latest_timestamp_seconds{kind}, when the newest of
// them was recorded. Each row is money to refund or to chase. They are read from the table, not
// counted as the handler records anomalies, so that they report only what committed (a batch that
// rolls back and runs again records its anomalies once) and agree across instances and restarts:
// every instance reports the same figures, queries take max by (kind). The alert reads the newest
// row's time, which says "an anomaly in the last hour" from its first sample, with no history of
// the count to compare against, and which a stopped worker's last samples still say. Anomalies
// are rare, so a count(*) of the table every anomalyInterval is cheap.
type anomalyGauge struct {
	gauge  *prometheus.GaugeVec
	latest *prometheus.GaugeVec
}

func newAnomalyGauge(reg prometheus.Registerer) *anomalyGauge {
	g := &anomalyGauge{
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxworker_payment_anomalies",
			Help: "Rows of payment_anomalies (payments to refund or chase), by kind, as committed; read every 30s.",
		}, []string{"kind"}),
		latest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxworker_payment_anomaly_latest_timestamp_seconds",
			Help: "When the newest row of payment_anomalies of the kind was recorded (Unix time), 0 when it has none; read every 30s.",
		}, []string{"kind"}),
	}
	reg.MustRegister(g.gauge, g.latest)
	return g
}

// run refreshes the gauge at once, then every anomalyInterval until ctx is done. The kinds' series
// appear only once a refresh succeeded: a 0 before the table was read would be a guess.
func (g *anomalyGauge) run(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	wait.Every(ctx, anomalyInterval, logger, "read the payment anomalies", func(ctx context.Context) error {
		return g.refresh(ctx, pool)
	})
}

func (g *anomalyGauge) refresh(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	counts, err := payment.CountAnomalies(ctx, pool)
	if err != nil {
		return err
	}
	for kind, n := range counts {
		g.gauge.WithLabelValues(kind).Set(float64(n.Rows))
		latest := 0.0
		if !n.Latest.IsZero() {
			latest = float64(n.Latest.UnixNano()) / 1e9
		}
		g.latest.WithLabelValues(kind).Set(latest)
	}
	return nil
}
