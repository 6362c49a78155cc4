package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
