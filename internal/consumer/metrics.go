package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's Prometheus metrics. They are recorded around the handler, never by it.
type Metrics struct {
	Messages *prometheus.CounterVec   // inboxworker_messages_total{topic,outcome}
	Retries  *prometheus.CounterVec   // inboxworker_retries_total{topic}
	Handle   *prometheus.HistogramVec // inboxworker_handle_seconds{topic}
	Lag      *prometheus.GaugeVec     // inboxworker_consumer_lag{topic,partition}
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxworker_messages_total",
			Help: "Messages finished, by topic and outcome (applied, duplicate, dead_lettered).",
		}, []string{"topic", "outcome"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxworker_retries_total",
			Help: "Retries of messages after a retryable error, by topic.",
		}, []string{"topic"}),
		Handle: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inboxworker_handle_seconds",
			Help:    "Time to finish a message, retries included, by topic.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"topic"}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxworker_consumer_lag",
			Help: "Messages behind the partition's end offset, from the group's committed offset.",
		}, []string{"topic", "partition"}),
	}
	reg.MustRegister(m.Messages, m.Retries, m.Handle, m.Lag)
	return m
}
