package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// publication times the order events of the batch_events mode: it wraps the payment handler to
// note when each callback's transaction committed (inboxworker.AfterCommit), and observes the relay to
// note when Kafka acknowledged each event.
type publication struct {
	handler *payment.Handler

	mu        sync.Mutex
	committed map[string]time.Time // by event id
	latencies *reservoir           // commit → acknowledgement
	published int
	first     time.Time // the first commit
	last      time.Time // the last acknowledgement
}

func newPublication(h *payment.Handler) *publication {
	return &publication{handler: h, committed: map[string]time.Time{}, latencies: newReservoir(10_000)}
}

func (p *publication) Handle(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	err := p.handler.Handle(ctx, tx, d)
	if err == nil {
		p.stamp(ctx, []inboxworker.Delivery{d})
	}
	return err
}

func (p *publication) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery) []error {
	errs := p.handler.HandleBatch(ctx, tx, ds)
	var ok []inboxworker.Delivery
	for i, err := range errs {
		if err == nil {
			ok = append(ok, ds[i])
		}
	}
	p.stamp(ctx, ok)
	return errs
}

// stamp notes the commit time of the order.paid events of ds, once their transaction commits.
func (p *publication) stamp(ctx context.Context, ds []inboxworker.Delivery) {
	ids := make([]string, 0, len(ds))
	for _, d := range ds {
		if cb, err := payment.Decode(d.Value); err == nil {
			ids = append(ids, outbox.EventID(payment.EventOrderPaid, payment.EventCause(cb.Provider, cb.ProviderTxnID)))
		}
	}
	inboxworker.AfterCommit(ctx, func(context.Context) {
		now := time.Now()
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.first.IsZero() {
			p.first = now
		}
		for _, id := range ids {
			if _, ok := p.committed[id]; !ok {
				p.committed[id] = now
			}
		}
	})
}

func (p *publication) Publishing(int64, []kafka.Message) {}

func (p *publication) Published(_ int64, msgs []kafka.Message, published []bool, _ error) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		if !published[i] {
			continue
		}
		p.published++
		p.last = now
		for _, h := range m.Headers {
			if at, ok := p.committed[string(h.Value)]; ok && h.Key == outbox.HeaderIdempotencyKey {
				p.latencies.add(now.Sub(at))
			}
		}
	}
}

// relay runs the outbox relay of e's schema until the returned stop is called.
func (p *publication) relay(ctx context.Context, e *env, log *slog.Logger) (stop func(), err error) {
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: e.pool, Brokers: []string{e.addr}, Logger: log, Observer: p})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	return func() { cancel(); <-done }, nil
}

// note waits until the relay has published the n events, then says how fast it did and how long
// they took from commit to acknowledgement. lastCommit is the consumer's last offset commit.
func (p *publication) note(ctx context.Context, n int, lastCommit time.Time) (string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		published, first, last := p.published, p.first, p.last
		p.mu.Unlock()
		if published >= n {
			rate := float64(published) / last.Sub(first).Seconds()
			return fmt.Sprintf("batch_events: relay published %d events at %.0f events/s (first commit to last "+
				"acknowledgement), the last %s after the consumer's last offset commit; commit → acknowledged: "+
				"p50 %s, p99 %s", published, rate, last.Sub(lastCommit).Round(time.Millisecond),
				p.latencies.quantile(0.5).Round(time.Microsecond), p.latencies.quantile(0.99).Round(time.Microsecond)), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("the relay published %d of %d events", published, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
