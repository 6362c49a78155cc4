package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/payment"
)

// anomalyInterval is how often the payment anomaly gauge is read from Postgres.
const anomalyInterval = 30 * time.Second

// anomalyGauge is inboxworker_payment_anomalies{kind}: the rows of payment_anomalies, by kind, as
// committed. Each row is money to refund or to chase, and an alert fires when the count grows. It is
// read from the table, not counted as the handler records anomalies, so that it reports only what
// committed (a batch that rolls back and runs again records its anomalies once) and agrees across
// instances and restarts: every instance reports the same figure, queries take max by (kind).
// Anomalies are rare, so a count(*) of the table every anomalyInterval is cheap.
type anomalyGauge struct {
	gauge *prometheus.GaugeVec
}

func newAnomalyGauge(reg prometheus.Registerer) *anomalyGauge {
	g := &anomalyGauge{gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inboxworker_payment_anomalies",
		Help: "Rows of payment_anomalies (payments to refund or chase), by kind, as committed; read every 30s.",
	}, []string{"kind"})}
	reg.MustRegister(g.gauge)
	return g
}

// run refreshes the gauge at once, then every anomalyInterval until ctx is done. The kinds' series
// appear only once a refresh succeeded: a 0 before the table was read would be a guess.
func (g *anomalyGauge) run(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	t := time.NewTicker(anomalyInterval)
	defer t.Stop()
	for {
		if err := g.refresh(ctx, pool); err != nil && ctx.Err() == nil {
			logger.DebugContext(ctx, "cannot read the payment anomalies", slog.String("err", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *anomalyGauge) refresh(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	counts, err := payment.CountAnomalies(ctx, pool)
	if err != nil {
		return err
	}
	for kind, n := range counts {
		g.gauge.WithLabelValues(kind).Set(float64(n))
	}
	return nil
}
