package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// Metrics are the relay's Prometheus metrics. The waiting, oldest and stalled gauges describe the
// outbox, which every instance reads (query them with max); the counter and the active gauge are
// this instance's.
type Metrics struct {
	Waiting   prometheus.Gauge       // inboxworker_outbox_waiting
	Oldest    prometheus.Gauge       // inboxworker_outbox_oldest_seconds
	Stalled   prometheus.Gauge       // inboxworker_outbox_stalled_seconds
	Published *prometheus.CounterVec // inboxworker_outbox_published_total{topic}
	Active    prometheus.Gauge       // inboxworker_outbox_relay_active
}

// NewMetrics creates the metrics, at 0, and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxworker_outbox_waiting",
			Help: "Events in the outbox waiting to be published (committed, not yet acknowledged by Kafka).",
		}),
		Oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxworker_outbox_oldest_seconds",
			Help: "How long the oldest waiting event of the outbox has waited; 0 when none waits.",
		}),
		Stalled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxworker_outbox_stalled_seconds",
			Help: "How long the relay has published nothing while events wait (at most the oldest's wait); 0 when none waits.",
		}),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxworker_outbox_published_total",
			Help: "Events this instance's relay published (acknowledged by every in-sync replica), by topic.",
		}, []string{"topic"}),
		Active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxworker_outbox_relay_active",
			Help: "1 while this instance's relay holds the outbox lease and publishes, else 0.",
		}),
	}
	reg.MustRegister(m.Waiting, m.Oldest, m.Stalled, m.Published, m.Active)
	return m
}

// init creates the published series of topics at 0.
func (m *Metrics) init(topics []string) {
	if m == nil {
		return
	}
	for _, t := range topics {
		m.Published.WithLabelValues(t)
	}
}

func (m *Metrics) published(topic string) {
	if m != nil {
		m.Published.WithLabelValues(topic).Inc()
	}
}

func (m *Metrics) setActive(active bool) {
	if m == nil {
		return
	}
	if active {
		m.Active.Set(1)
	} else {
		m.Active.Set(0)
	}
}

// Stats are the outbox's state, as the gauges show it.
type Stats struct {
	// Waiting counts the events not published yet.
	Waiting int64
	// Oldest is how long the oldest of them has waited.
	Oldest time.Duration
	// Stalled is how long the relay has published nothing while events wait: the time since the
	// last publication, but no more than Oldest; 0 when none waits.
	Stalled time.Duration
}

// statsSQL reads the outbox's state: the waiting events (those of the emissions after the lease's
// cursor, through the primary key), the oldest of them, and the last time the cursor moved.
const statsSQL = `
SELECT (SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox_batches WHERE position > c.at),
       coalesce((SELECT extract(epoch FROM now() - created_at) FROM outbox_batches WHERE position > c.at
                 ORDER BY position LIMIT 1), 0)::float8,
       (SELECT extract(epoch FROM now() - published_at) FROM outbox_relay_lease WHERE name = 'relay')::float8
FROM (SELECT coalesce((SELECT published_position FROM outbox_relay_lease WHERE name = 'relay'), 0) AS at) AS c`

// ReadStats reads the outbox's state.
func (r *Relay) ReadStats(ctx context.Context) (Stats, error) {
	var s Stats
	var oldest float64
	var sincePublished *float64
	if err := r.config.Pool.QueryRow(ctx, statsSQL).Scan(&s.Waiting, &oldest, &sincePublished); err != nil {
		return Stats{}, fmt.Errorf("outbox: read the outbox's state: %w", inbox.Classify(err))
	}
	s.Oldest = seconds(oldest)
	if s.Waiting > 0 {
		s.Stalled = s.Oldest
		if sincePublished != nil {
			s.Stalled = min(s.Stalled, seconds(*sincePublished))
		}
	}
	return s, nil
}

func seconds(f float64) time.Duration { return max(time.Duration(f*float64(time.Second)), 0) }

// reportStats refreshes the gauges at once, then every StatsInterval until ctx is done.
func (r *Relay) reportStats(ctx context.Context) {
	m := r.config.Metrics
	if m == nil {
		return
	}
	wait.Every(ctx, r.config.StatsInterval, r.log, "read the outbox's state", func(ctx context.Context) error {
		s, err := r.ReadStats(ctx)
		if err == nil {
			m.Waiting.Set(float64(s.Waiting))
			m.Oldest.Set(s.Oldest.Seconds())
			m.Stalled.Set(s.Stalled.Seconds())
		}
		return err
	})
}
