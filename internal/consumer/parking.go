package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// toParked is m, read from route's partition, whose idempotency key is key and ordering key
// orderingKey, as the park keeps it.
func toParked(route Route, partition int, m kafka.Message, key string, orderingKey []byte) inbox.Parked {
	p := inbox.Parked{
		Handler:        route.Name,
		Topic:          route.Topic,
		Partition:      int32(partition),
		Offset:         m.Offset,
		OrderingKey:    orderingKey,
		IdempotencyKey: key,
		MessageKey:     m.Key,
		Value:          m.Value,
	}
	for _, h := range m.Headers {
		p.Headers = append(p.Headers, inbox.Header{Key: h.Key, Value: h.Value})
	}
	return p
}

// fromParked is the message p was parked from, as it was read: its key, value and headers, and its
// origin.
func fromParked(p inbox.Parked) kafka.Message {
	m := kafka.Message{
		Topic:     p.Topic,
		Partition: int(p.Partition),
		Offset:    p.Offset,
		Key:       p.MessageKey,
		Value:     p.Value,
	}
	for _, h := range p.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	return m
}

// ParkedDeadLetter is the dead letter of the parked message p, dead-lettered by an operator rather
// than retried: the original key, value and headers and the dlq-* headers (package deadletter), with
// p's reason (retries_exhausted when it has not run) and attempts, and why (the operator's words)
// in dlq-error with p's last error. Its Topic is p's topic + dlqSuffix.
func ParkedDeadLetter(p inbox.Parked, dlqSuffix, why string, at time.Time) kafka.Message {
	m := fromParked(p)
	reason := p.Reason
	if reason == "" {
		reason = fault.RetriesExhausted
	}
	text := why
	if p.LastError != "" {
		text += ": " + p.LastError
	}
	letter := deadletter.Letter{
		Reason:    reason,
		Error:     deadletter.ErrorText(errors.New(text)),
		Topic:     p.Topic,
		Partition: int(p.Partition),
		Offset:    p.Offset,
		Attempts:  p.Attempts,
		FailedAt:  at,
	}
	return kafka.Message{Topic: p.Topic + dlqSuffix, Key: m.Key, Value: m.Value, Headers: letter.Headers(m.Headers)}
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

// setPaused sets the route_paused gauge of topic from its circuit's state.
func (m *Metrics) setPaused(topic string, state RouteState) {
	if m == nil {
		return
	}
	paused := 0.0
	if state != RouteOpen {
		paused = 1
	}
	m.Paused.WithLabelValues(topic).Set(paused)
}

// countPause counts a pause of topic's route.
func (m *Metrics) countPause(topic string) {
	if m == nil {
		return
	}
	m.Pauses.WithLabelValues(topic).Inc()
}

// reportParked refreshes the park's gauges of topics every interval until ctx is done. A failed
// read is logged at debug level and leaves the gauges as they were: the park is in Postgres, whose
// outages are reported elsewhere.
func reportParked(ctx context.Context, m *Metrics, store *inbox.Store, topics []string, interval time.Duration, log *slog.Logger) {
	if m == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		stats, err := store.Stats(ctx)
		if err == nil {
			m.observe(topics, stats)
		} else if ctx.Err() == nil {
			log.DebugContext(ctx, "cannot read the park's statistics", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// routeChange logs a change of a route's circuit and sets its gauge.
func routeChange(log *slog.Logger, m *Metrics, topic string) func(from, to RouteState, why string) {
	return func(from, to RouteState, why string) {
		m.setPaused(topic, to)
		switch {
		case from == RouteOpen:
			m.countPause(topic)
			log.Warn("pausing the route: its dependency looks down", "topic", topic, "why", why)
		case to == RouteOpen:
			log.Info("resuming the route", "topic", topic, "why", why)
		default:
			log.Info(fmt.Sprintf("the route is %s", to), "topic", topic, "why", why)
		}
	}
}

// startRetrier reads the keys the park holds for the partition, for a new owner, and starts the
// partition's retrier of parked messages. It waits for the database as long as it is down, and
// fails only when ctx is done or the consumer is stopping. stop stops the retrier and waits for it.
func (p *partition) startRetrier(ctx context.Context) (stop func(), err error) {
	err = p.retryDatabase(ctx, "read the keys parked from the partition", func(ctx context.Context) error {
		p.parked, err = loadParkedKeys(ctx, p.c.config.Store, p.topic, p.id)
		return err
	})
	if err != nil {
		return nil, err
	}
	if n := p.parked.len(); n > 0 {
		p.log.Info("taking over the partition's parked keys", "keys", n)
	}
	log := p.log.With("component", "retrier")
	p.retrier = newRetrier(retrierConfig{
		store:     p.c.config.Store,
		route:     p.route,
		partition: p.id,
		owner:     fmt.Sprintf("%s %s/%d generation %d", p.gen.MemberID, p.topic, p.id, p.gen.ID),
		lease:     p.c.config.ParkLease,
		retry:     p.c.config.Retry,
		circuit:   p.circuit,
		keys:      p.parked,
		slots:     p.limit,
		apply:     parkedEffect(p.c.config.Store, p.route, p.c.config.AttemptTimeout, log),
		classify:  p.classify,
		deadLetter: func(ctx context.Context, m kafka.Message, reason fault.Reason, err error, attempts int) error {
			return p.deadLetter(ctx, m, failure{reason: reason, err: err, attempts: attempts}, log.With("offset", m.Offset))
		},
		finished: func(outcome string) { p.c.metrics.count(p.topic, outcome) },
		retried:  func() { p.c.metrics.retried(p.topic) },
		poll:     retrierPoll,
		idle:     retrierIdlePoll,
		log:      log,
	})
	var wg sync.WaitGroup
	wg.Go(func() { p.retrier.run(ctx) })
	return wg.Wait, nil
}

// retrierPoll is the longest a retrier waits before it looks at the park again while the park holds
// messages of its partition, and retrierIdlePoll while it holds none: a message parked by an owner
// that has just lost the partition is found within it.
const (
	retrierPoll     = time.Second
	retrierIdlePoll = 30 * time.Second
)

// routePoll is how often a partition whose route is probing looks whether it is open again.
const routePoll = 100 * time.Millisecond

// keyParked reports whether e's ordering key has messages in the park, so that e is to be parked
// behind them.
func (p *partition) keyParked(e *entry) bool {
	return p.parked != nil && e.keyErr == nil && p.parked.parked([]byte(e.order))
}

// parkBehind parks e behind the messages of its key in the park, if there still are any, and says
// whether it did. It waits for the database as long as it is down; it fails only when ctx is done
// or the consumer is stopping.
func (p *partition) parkBehind(ctx context.Context, e *entry, log *slog.Logger) (bool, error) {
	if !p.keyParked(e) {
		return false, nil
	}
	var behind bool
	err := p.retryDatabase(ctx, "park the message", func(ctx context.Context) (err error) {
		behind, err = p.parked.parkBehind(ctx, toParked(p.route, p.id, e.msg, e.key, []byte(e.order)))
		return err
	})
	if err != nil {
		return false, err
	}
	if behind {
		log.InfoContext(ctx, "parked the message behind its key")
		p.retrier.wake()
	}
	return behind, nil
}

// tries is what happened to a message retried in place, for the park.
type tries struct {
	attempts    int
	first, last error
	firstAt     time.Time
	reason      fault.Reason
}

func (t *tries) failed(err error, reason fault.Reason, attempts int) {
	if t.first == nil {
		t.first, t.firstAt = err, time.Now()
	}
	t.last, t.reason, t.attempts = err, reason, attempts
}

// park parks e, which failed in place as t says, due in retryIn with spent of its retry budget
// spent. It waits for the database as long as it is down; it fails only when ctx is done or the
// consumer is stopping.
func (p *partition) park(ctx context.Context, e *entry, t tries, spent, retryIn time.Duration, why string, log *slog.Logger) error {
	parked := toParked(p.route, p.id, e.msg, e.key, []byte(e.order))
	parked.Attempts, parked.Reason, parked.FirstFailedAt, parked.BudgetSpent = t.attempts, t.reason, t.firstAt, spent
	if t.first != nil {
		parked.FirstError, parked.LastError = t.first.Error(), t.last.Error()
	}
	err := p.retryDatabase(ctx, "park the message", func(ctx context.Context) error {
		return p.parked.park(ctx, parked, retryIn)
	})
	if err != nil {
		return err
	}
	attrs := []any{"why", why, "attempts", t.attempts, "retry_in", retryIn, "budget_spent", spent}
	if t.last != nil {
		attrs = append(attrs, "error", t.last)
	}
	log.InfoContext(ctx, "parked the message", attrs...)
	p.retrier.wake()
	return nil
}

// routeGate says whether messages may start on the partition's route: any while it is open; while
// it is paused, one, the probe, once a probe is due and nothing of the partition is in flight; else
// none, with how long to wait before asking again.
func (p *partition) routeGate() (probeOnly bool, wait time.Duration) {
	state, probeAt := p.circuit.State()
	switch state {
	case RouteOpen:
		return false, 0
	case RoutePaused:
		if d := time.Until(probeAt); d > 0 {
			return false, d
		}
		if p.running == 0 {
			return true, 0
		}
	}
	return false, routePoll
}

// waitRoute waits while the partition's route is paused and no probe is due, or until ctx is done.
func (p *partition) waitRoute(ctx context.Context) error {
	state, probeAt := p.circuit.State()
	wait := routePoll
	if state == RoutePaused {
		wait = max(time.Until(probeAt), time.Millisecond)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-p.circuit.Changed():
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-p.stopping:
		return errStopping
	}
}

// circuitResult is what a run that ended in err, of kind and reason, tells the route's circuit. A
// retryable error with a reason of its own (an order that does not exist yet) is the message's
// wait, and a key leased by another worker's call is that call's, not the route's dependency
// failing.
func circuitResult(err error, kind fault.Kind, reason fault.Reason) result {
	switch {
	case err == nil, kind == fault.KindPermanent:
		return resultAnswered
	case kind == fault.KindRetryable && reason == fault.RetriesExhausted && !errors.Is(err, inbox.ErrLeaseHeld):
		return resultFailed
	}
	return resultInconclusive // Postgres down, a key leased by another worker, a message's own wait
}
