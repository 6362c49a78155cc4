package consumer

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// Metrics are the consumer's Prometheus metrics. They are recorded around the handler, never by it.
type Metrics struct {
	Messages *prometheus.CounterVec   // inboxworker_messages_total{topic,outcome}
	Retries  *prometheus.CounterVec   // inboxworker_retries_total{topic}
	Handle   *prometheus.HistogramVec // inboxworker_handle_seconds{topic}
	Lag      *prometheus.GaugeVec     // inboxworker_consumer_lag{topic,partition}
	Stalled  *prometheus.GaugeVec     // inboxworker_consumer_stalled_seconds{topic,partition}
	// TransactionOpen is how long a transaction left open upstream has held the partition (see
	// lag.go).
	TransactionOpen *prometheus.GaugeVec // inboxworker_consumer_transaction_open_seconds{topic,partition}
	// DeadLettersStored counts the dead letters their topic refused for good, kept in Postgres
	// (each is counted in Messages as dead_lettered too).
	DeadLettersStored *prometheus.CounterVec // inboxworker_dead_letters_stored_total{topic}
	// The park and the routes' outage circuits (see parking.go).
	Parked *prometheus.GaugeVec   // inboxworker_parked_messages{topic}
	Oldest *prometheus.GaugeVec   // inboxworker_parked_oldest_seconds{topic}
	Paused *prometheus.GaugeVec   // inboxworker_route_paused{topic,reason}
	Pauses *prometheus.CounterVec // inboxworker_route_pauses_total{topic,reason}
	// Skipped counts the records deleted from a partition before the group read them (see
	// reposition.go).
	Skipped *prometheus.CounterVec // inboxworker_records_skipped_total{topic}
	// SignatureFailures counts the messages dead-lettered because their route's verifier refused
	// them, by problem (fault.SignatureProblems).
	SignatureFailures *prometheus.CounterVec // inboxworker_signature_failures_total{topic,reason}
	// CommitFailures counts the offset commits that failed (see commit.go).
	CommitFailures *prometheus.CounterVec // inboxworker_offset_commit_failures_total{topic}
	// The route gates' slots and pace (package gate).
	ConcurrencyLimit *prometheus.GaugeVec   // inboxworker_route_concurrency_limit{topic}
	RateLimit        *prometheus.GaugeVec   // inboxworker_route_rate_limit{topic}
	RateWaits        *prometheus.CounterVec // inboxworker_route_rate_waits_total{topic}
	// Who holds what in the group (see lag.go).
	Owner    *prometheus.GaugeVec // inboxworker_partition_owner{topic,partition,member_id,client_id,host}
	Assigned *prometheus.GaugeVec // inboxworker_assigned_partitions{topic}
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Messages: newCounter("inboxworker_messages_total",
			"Messages finished, by topic and outcome (applied, duplicate, dead_lettered, and expired or suppressed: declined by their handler on purpose, their key recorded).",
			"topic", "outcome"),
		Retries: newCounter("inboxworker_retries_total",
			"Retries of messages after a retryable error, by topic.",
			"topic"),
		Handle: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "inboxworker_handle_seconds",
			Help:    "Time to finish a message, retries included (in a batch applied in one transaction, the batch's time; a parked message, from its first failure), by topic.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"topic"}),
		Lag: newGauge("inboxworker_consumer_lag",
			"Messages behind the partition's end offset, from the group's committed offset; every partition of the consumed topics, whichever member owns it.",
			"topic", "partition"),
		Stalled: newGauge("inboxworker_consumer_stalled_seconds",
			"How long the group's committed offset of the partition has not moved while the partition has lag, as seen by this instance; 0 without lag.",
			"topic", "partition"),
		TransactionOpen: newGauge("inboxworker_consumer_transaction_open_seconds",
			"How long the partition's last stable offset has stayed put below its end: a producer's transaction left open holds the partition, for every read_committed consumer, until it commits or aborts; 0 when none is open.",
			"topic", "partition"),
		DeadLettersStored: newCounter("inboxworker_dead_letters_stored_total",
			"Dead letters their dead-letter topic refused for good (too large, not authorised), kept in the table dead_letters for worker replay, by source topic.",
			"topic"),
		Parked: newGauge("inboxworker_parked_messages",
			"Messages parked, waiting for a retry out of their partition's way, by topic.",
			"topic"),
		Oldest: newGauge("inboxworker_parked_oldest_seconds",
			"How long ago the oldest parked message of the topic was parked; 0 when none is.",
			"topic"),
		Paused: newGauge("inboxworker_route_paused",
			"1 while the topic's route starts nothing, by reason: outage (its dependency looks down; the route is paused or probing) or retry_after (its dependency asked to wait), else 0.",
			"topic", "reason"),
		Pauses: newCounter("inboxworker_route_pauses_total",
			"Times the topic's route was paused, by reason (outage, retry_after).",
			"topic", "reason"),
		Owner: newGauge("inboxworker_partition_owner",
			"1 for the member of the group holding the partition, as the group's description says (refreshed with the lag); no series while the group rebalances.",
			"topic", "partition", "member_id", "client_id", "host"),
		Assigned: newGauge("inboxworker_assigned_partitions",
			"Partitions of the topic this instance holds in its current generation of the group; 0 before it joins.",
			"topic"),
		ConcurrencyLimit: newGauge("inboxworker_route_concurrency_limit",
			"How many of the topic's handler runs may go at once on this instance now: Route.Concurrency, or less while a call route starts slowly.",
			"topic"),
		RateLimit: newGauge("inboxworker_route_rate_limit",
			"Calls per second at which this instance books the turns of the topic's route in the group's shared schedule: its rate limit, lowered while its dependency throttles this instance; 0 without a limit.",
			"topic"),
		RateWaits: newCounter("inboxworker_route_rate_waits_total",
			"Calls of the topic's route that waited for their turn under its rate limit before they went out.",
			"topic"),
		Skipped: newCounter("inboxworker_records_skipped_total",
			"Records of the topic deleted before the group read them (retention, or DeleteRecords, took them first): never handled, never dead-lettered; the log names each range.",
			"topic"),
		SignatureFailures: newCounter("inboxworker_signature_failures_total",
			"Messages dead-lettered bad_signature, their route's verifier having refused them, by topic and reason: unsigned, malformed, timestamp (signed too far from when the record was produced) or no_key_matched.",
			"topic", "reason"),
		CommitFailures: newCounter("inboxworker_offset_commit_failures_total",
			"Offset commits of the topic's partitions that failed (the broker refused them, or the connection closed): messages since the last commit will be delivered again.",
			"topic"),
	}
	reg.MustRegister(m.Messages, m.Retries, m.Handle, m.Lag, m.Stalled, m.TransactionOpen, m.DeadLettersStored, m.Parked, m.Oldest,
		m.Paused, m.Pauses, m.ConcurrencyLimit, m.RateLimit, m.RateWaits, m.CommitFailures, m.Skipped, m.SignatureFailures, m.Owner, m.Assigned)
	return m
}

func newCounter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newGauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// outcomes are the values of the outcome label.
var outcomes = []string{string(inbox.Applied), string(inbox.Duplicate), outcomeDeadLettered,
	string(inbox.Expired), string(inbox.Suppressed)}

// initSeries creates the series of topics whose labels are known before any message, at 0, so that
// a fresh instance exposes them: rate() and absent() then see a counter that starts at 0, not one
// that appears with its first increment. The lag series appear with the first lag refresh, once the
// topics' partitions are known.
func (m *Metrics) initSeries(topics []string) {
	if m == nil {
		return
	}
	for _, topic := range topics {
		for _, outcome := range outcomes {
			m.Messages.WithLabelValues(topic, outcome)
		}
		m.Retries.WithLabelValues(topic)
		m.Handle.WithLabelValues(topic)
		m.DeadLettersStored.WithLabelValues(topic)
		m.Parked.WithLabelValues(topic)
		m.Oldest.WithLabelValues(topic)
		m.CommitFailures.WithLabelValues(topic)
		m.Skipped.WithLabelValues(topic)
		m.ConcurrencyLimit.WithLabelValues(topic)
		m.RateLimit.WithLabelValues(topic)
		m.RateWaits.WithLabelValues(topic)
		for _, reason := range gate.PauseReasons {
			m.Paused.WithLabelValues(topic, reason)
			m.Pauses.WithLabelValues(topic, reason)
		}
		m.Assigned.WithLabelValues(topic)
		for _, problem := range fault.SignatureProblems() {
			m.SignatureFailures.WithLabelValues(topic, problem) // 0 for a route that does not verify
		}
	}
}

// The outcomes of a finished message, as the outcome label. Applied, duplicate, expired and
// suppressed are inbox's.
const outcomeDeadLettered = "dead_lettered"

// finished counts a message that finished with outcome and observes how long it took, retries
// included.
func (m *Metrics) finished(topic, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.Messages.WithLabelValues(topic, outcome).Inc()
	m.Handle.WithLabelValues(topic).Observe(took.Seconds())
}

// signatureFailed counts a message of topic dead-lettered bad_signature, for problem.
func (m *Metrics) signatureFailed(topic, problem string) {
	if m == nil {
		return
	}
	m.SignatureFailures.WithLabelValues(topic, problem).Inc()
}

func (m *Metrics) deadLetterStored(topic string) {
	if m == nil {
		return
	}
	m.DeadLettersStored.WithLabelValues(topic).Inc()
}

func (m *Metrics) retried(topic string) {
	if m == nil {
		return
	}
	m.Retries.WithLabelValues(topic).Inc()
}

func (m *Metrics) setLag(topic string, partition int, lag int64, stalled, transactionOpen time.Duration) {
	if m == nil {
		return
	}
	p := strconv.Itoa(partition)
	m.Lag.WithLabelValues(topic, p).Set(float64(lag))
	m.Stalled.WithLabelValues(topic, p).Set(stalled.Seconds())
	m.TransactionOpen.WithLabelValues(topic, p).Set(transactionOpen.Seconds())
}

// deleteLag forgets a partition that is no longer consumed (its topic was deleted).
func (m *Metrics) deleteLag(topic string, partition int) {
	if m == nil {
		return
	}
	p := strconv.Itoa(partition)
	m.Lag.DeleteLabelValues(topic, p)
	m.Stalled.DeleteLabelValues(topic, p)
	m.TransactionOpen.DeleteLabelValues(topic, p)
}

// SetPaused sets the route_paused gauge of topic for reason.
func (m *Metrics) SetPaused(topic, reason string, paused bool) {
	if m == nil {
		return
	}
	v := 0.0
	if paused {
		v = 1
	}
	m.Paused.WithLabelValues(topic, reason).Set(v)
}

// CountPause counts a pause of topic's route for reason.
func (m *Metrics) CountPause(topic, reason string) {
	if m == nil {
		return
	}
	m.Pauses.WithLabelValues(topic, reason).Inc()
}

// observe sets the park's gauges of topics from stats; a topic without stats has nothing parked.
func (m *Metrics) observe(topics []string, stats []inbox.ParkStats) {
	if m == nil {
		return
	}
	byTopic := make(map[string]inbox.ParkStats, len(stats))
	for _, st := range stats {
		byTopic[st.Topic] = st
	}
	for _, t := range topics {
		st := byTopic[t]
		m.Parked.WithLabelValues(t).Set(float64(st.Messages))
		m.Oldest.WithLabelValues(t).Set(st.OldestAge.Seconds())
	}
}

func (m *Metrics) setOwner(topic string, partition int, o owner) {
	if m == nil {
		return
	}
	m.Owner.WithLabelValues(topic, strconv.Itoa(partition), o.memberID, o.clientID, o.host).Set(1)
}

func (m *Metrics) deleteOwner(topic string, partition int, o owner) {
	if m == nil {
		return
	}
	m.Owner.DeleteLabelValues(topic, strconv.Itoa(partition), o.memberID, o.clientID, o.host)
}

// assigned sets the assigned_partitions gauge of every consumed topic from a generation's
// assignments (topic → partitions).
func (m *Metrics) assigned(topics []string, assignments map[string][]int) {
	if m == nil {
		return
	}
	for _, topic := range topics {
		m.Assigned.WithLabelValues(topic).Set(float64(len(assignments[topic])))
	}
}

// SetConcurrency sets the concurrency limit gauge of topic.
func (m *Metrics) SetConcurrency(topic string, limit int) {
	if m == nil {
		return
	}
	m.ConcurrencyLimit.WithLabelValues(topic).Set(float64(limit))
}

// SetRate sets the rate limit gauge of topic, in calls per second.
func (m *Metrics) SetRate(topic string, perSecond float64) {
	if m == nil {
		return
	}
	m.RateLimit.WithLabelValues(topic).Set(perSecond)
}

// WaitedForRate counts a call of topic that waited for its turn under its rate limit.
func (m *Metrics) WaitedForRate(topic string) {
	if m == nil {
		return
	}
	m.RateWaits.WithLabelValues(topic).Inc()
}

// commitFailed counts a failed offset commit of topic.
func (m *Metrics) commitFailed(topic string) {
	if m == nil {
		return
	}
	m.CommitFailures.WithLabelValues(topic).Inc()
}

// skipped counts n records of topic deleted before the group read them.
func (m *Metrics) skipped(topic string, n int64) {
	if m == nil {
		return
	}
	m.Skipped.WithLabelValues(topic).Add(float64(n))
}
