package cli

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/reconcile"
	"github.com/inboxworker/inboxworker/internal/settings"
)

// statusTimeout bounds a request to the payment status endpoint, its answer included.
const statusTimeout = 10 * time.Second

// paymentStatus is the status endpoint of PAYMENT_STATUS_URL, nil when it is unset.
func paymentStatus(cfg *settings.Config) (*reconcile.Status, error) {
	if cfg.PaymentStatusURL == "" {
		return nil, nil
	}
	return reconcile.NewStatus(cfg.PaymentStatusURL, cfg.PaymentStatusToken, statusTimeout)
}

// reconciliation is the worker's: the PENDING orders counted always, and asked about when
// PAYMENT_STATUS_URL is set.
type reconciliation struct {
	metrics    *reconcile.Metrics
	reconciler *reconcile.Reconciler // nil: no status endpoint
}

// newReconciliation registers reconciliation's metrics with reg and builds its reconciler, if any.
func newReconciliation(cfg *Config, pool *pgxpool.Pool, reg prometheus.Registerer, logger *slog.Logger) (*reconciliation, error) {
	r := &reconciliation{metrics: reconcile.NewMetrics(reg)}
	status, err := paymentStatus(cfg.Config)
	if err != nil || status == nil {
		if err == nil {
			logger.Info("PAYMENT_STATUS_URL is unset: orders left PENDING are counted, not asked about")
		}
		return r, err
	}
	store, err := inbox.NewStore(pool, inbox.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	payments, err := payment.NewHandler(payment.Config{EventsTopic: cfg.Topic(paymentEventsInbox), Logger: logger})
	if err != nil {
		return nil, err
	}
	r.reconciler, err = reconcile.New(reconcile.Config{Pool: pool, Payments: payments, Store: store,
		Group: cfg.KafkaGroupID, Status: status, RateLimit: float64(cfg.PaymentStatusRateLimit),
		After: cfg.ReconcileAfter, MaxAge: cfg.ReconcileMaxAge, Metrics: r.metrics, Logger: logger})
	return r, err
}

// run counts the PENDING orders, and asks about them, until ctx is done.
func (r *reconciliation) run(ctx context.Context, cfg *Config, pool *pgxpool.Pool, logger *slog.Logger) {
	var wg sync.WaitGroup
	wg.Go(func() { r.metrics.CountPending(ctx, pool, cfg.ReconcileAfter, cfg.ReconcileMaxAge, logger) })
	if r.reconciler != nil {
		wg.Go(func() { _ = r.reconciler.Run(ctx) })
	}
	wg.Wait()
}
