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
// note when Kafka acknowledged each event. While the clock runs it only keeps what it saw, with the
// time; the events' ids are computed and matched afterwards (note), so that the measurement costs
// the measured as little as it can.
type publication struct {
	handler *payment.Handler

	mu        sync.Mutex
	commits   []commit // in commit order
	acks      []ack    // in acknowledgement order
	published int
	first     time.Time // the first commit
	last      time.Time // the last acknowledgement
}

// commit is a transaction that committed: the callbacks it applied, and when.
type commit struct {
	values [][]byte
	at     time.Time
}

// ack is an event Kafka acknowledged: its id (the Idempotency-Key header), and when.
type ack struct {
	id []byte
	at time.Time
}

func newPublication(h *payment.Handler) *publication { return &publication{handler: h} }

func (p *publication) Handle(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	err := p.handler.Handle(ctx, tx, d)
	if err == nil {
		p.stamp(ctx, [][]byte{d.Value})
	}
	return err
}

func (p *publication) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery) []error {
	errs := p.handler.HandleBatch(ctx, tx, ds)
	values := make([][]byte, 0, len(ds))
	for i, err := range errs {
		if err == nil {
			values = append(values, ds[i].Value)
		}
	}
	p.stamp(ctx, values)
	return errs
}

// stamp notes the commit time of the callbacks applied, once their transaction commits.
func (p *publication) stamp(ctx context.Context, values [][]byte) {
	inboxworker.AfterCommit(ctx, func(context.Context) {
		now := time.Now()
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.first.IsZero() {
			p.first = now
		}
		p.commits = append(p.commits, commit{values, now})
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
			if h.Key == outbox.HeaderIdempotencyKey {
				p.acks = append(p.acks, ack{h.Value, now})
			}
		}
	}
}

// latencies matches each acknowledged order.paid event with the commit of its callback (the first,
// for a callback applied again after a rollback) and samples the time between them.
func (p *publication) latencies() *reservoir {
	p.mu.Lock()
	defer p.mu.Unlock()
	committed := make(map[string]time.Time, len(p.commits))
	for _, c := range p.commits {
		for _, v := range c.values {
			cb, err := payment.Decode(v)
			if err != nil {
				continue
			}
			id := outbox.EventID(payment.EventOrderPaid, payment.EventCause(cb.Provider, cb.ProviderTxnID))
			if _, ok := committed[id]; !ok {
				committed[id] = c.at
			}
		}
	}
	r := newReservoir(10_000)
	for _, a := range p.acks {
		if at, ok := committed[string(a.id)]; ok {
			r.add(a.at.Sub(at))
		}
	}
	return r
}

// relay runs the outbox relay of e's schema until the returned stop is called.
func (p *publication) relay(ctx context.Context, e *env, log *slog.Logger) (stop func(), err error) {
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: e.workerPool, Brokers: []string{e.addr}, Logger: log, Observer: p})
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
			latencies := p.latencies()
			return fmt.Sprintf("batch_events: relay published %d events at %.0f events/s (first commit to last "+
				"acknowledgement), the last %s after the consumer's last offset commit; commit → acknowledged: "+
				"p50 %s, p99 %s", published, rate, last.Sub(lastCommit).Round(time.Millisecond),
				latencies.quantile(0.5).Round(time.Microsecond), latencies.quantile(0.99).Round(time.Microsecond)), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("the relay published %d of %d events", published, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
