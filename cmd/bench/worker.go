package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// runWorker returns the mode that runs the worker's consumer with the payment handler over the
// stream, applying it with transactions (per message or per batch), until the group's committed
// offsets reach the partitions' end offsets. The clock stops at that last offset commit; then the
// consumer is stopped, and the database checked against the stream.
func runWorker(transactions consumer.Transactions) mode { return runPayments(transactions, false) }

// runPayments is runWorker, with the order events emitted and relayed when events is set: then the
// note says how fast the relay published them, and how long each took from its transaction's commit
// to Kafka's acknowledgement.
func runPayments(transactions consumer.Transactions, events bool) mode {
	return func(ctx context.Context, e *env) (result, error) {
		ends, err := endOffsets(ctx, e.addr, e.topic, e.cfg.Partitions)
		if err != nil {
			return result{}, err
		}
		log := e.cfg.workerLogger()
		handler, clock, stop, err := paymentsHandler(ctx, e, events, log)
		if err != nil {
			return result{}, err
		}
		defer stop()
		metrics := consumer.NewMetrics(prometheus.NewRegistry())
		progress := newProgress(e.topic, ends)
		c, err := newConsumer(e, transactions, handler, metrics, progress, log)
		if err != nil {
			return result{}, err
		}

		elapsed, err := consumeAll(ctx, c, progress)
		if err != nil {
			return result{}, err
		}

		if err := checkOutcomes(metrics, e); err != nil {
			return result{}, err
		}
		if err := checkPayments(ctx, e); err != nil {
			return result{}, err
		}
		r := result{Elapsed: elapsed, Messages: e.cfg.N, Latencies: progress.latencies}
		if clock != nil {
			if r.Note, err = clock.note(ctx, e.stream.unique, progress.last()); err != nil {
				return result{}, err
			}
		}
		return r, nil
	}
}

// paymentsHandler is the mode's payment handler; with events, one that emits the order events, and
// the clock of their publication by a relay, which stop ends.
func paymentsHandler(ctx context.Context, e *env, events bool, log *slog.Logger) (
	handler inboxworker.BatchHandler, clock *publication, stop func(), err error) {
	var eventsTopic string
	if events {
		eventsTopic = e.topic + ".events"
	}
	h, err := payment.NewHandler(payment.Config{EventsTopic: eventsTopic, Logger: log, AppliedLevel: e.cfg.appliedLevel()})
	if err != nil || !events {
		return h, nil, func() {}, err
	}
	clock = newPublication(h)
	if stop, err = clock.relay(ctx, e, log); err != nil {
		return nil, nil, nil, err
	}
	return clock, clock, stop, nil
}

// newConsumer is the worker's consumer of the mode's topic, applying it with handler in
// transactions, verifying its signatures when the stream is signed, counting into metrics and timed
// by progress.
func newConsumer(e *env, transactions consumer.Transactions, handler inboxworker.BatchHandler,
	metrics *consumer.Metrics, progress *progress, log *slog.Logger) (*consumer.Consumer, error) {
	store, err := inbox.NewStore(e.workerPool, inbox.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	verify, err := e.stream.signing.verify()
	if err != nil {
		return nil, err
	}
	return consumer.New(consumer.Config{
		Brokers:      []string{e.addr},
		GroupID:      "bench-" + transactions.String(),
		Routes:       []consumer.Route{{Topic: e.topic, Name: "payments", Handler: handler, Verify: verify}},
		Transactions: transactions,
		BatchSize:    e.cfg.BatchSize,
		BatchWait:    e.cfg.BatchWait,
		Store:        store,
		DeadLetters:  deadletter.NewStore(e.workerPool),
		Metrics:      metrics,
		Logger:       log,
		Observer:     progress,
	})
}

// consumeAll runs c until progress says every partition's committed offset reached its end, stops
// it, and returns the time from its start to that last offset commit.
func consumeAll(ctx context.Context, c *consumer.Consumer, progress *progress) (time.Duration, error) {
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(runCtx) }()
	select {
	case <-progress.done:
	case err := <-stopped:
		return 0, fmt.Errorf("the consumer stopped before the end of the stream: %v", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	elapsed := progress.last().Sub(start)
	stop()
	return elapsed, <-stopped
}

// progress is the consumer's Observer: it times each message from its fetch to the offset commit
// that covers it, and closes done once every partition's committed offset reaches its end.
type progress struct {
	topic     string
	latencies *reservoir
	done      chan struct{}

	mu         sync.Mutex
	fetched    map[int][]fetch // by partition: fetched, not yet committed, in offset order
	ends       map[int]int64
	remaining  int // partitions not at their end
	lastCommit time.Time
}

type fetch struct {
	offset int64
	at     time.Time
}

func newProgress(topic string, ends map[int]int64) *progress {
	p := &progress{
		topic:     topic,
		latencies: newReservoir(10_000),
		done:      make(chan struct{}),
		fetched:   make(map[int][]fetch, len(ends)),
		ends:      ends,
	}
	for _, end := range ends {
		if end > 0 {
			p.remaining++
		}
	}
	if p.remaining == 0 {
		close(p.done)
	}
	return p
}

func (p *progress) Fetched(topic string, partition int, offset int64) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetched[partition] = append(p.fetched[partition], fetch{offset, now})
}

func (p *progress) Committed(topic string, partition int, offset int64) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	pending := p.fetched[partition]
	n := 0
	for n < len(pending) && pending[n].offset < offset {
		p.latencies.add(now.Sub(pending[n].at))
		n++
	}
	p.fetched[partition] = pending[n:]
	if end, ok := p.ends[partition]; ok && offset >= end {
		delete(p.ends, partition)
		p.lastCommit = now
		if p.remaining--; p.remaining == 0 {
			close(p.done)
		}
	}
}

func (p *progress) last() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastCommit
}

// checkOutcomes checks the consumer's counts: every distinct callback applied, every redelivery a
// duplicate, nothing dead-lettered.
func checkOutcomes(metrics *consumer.Metrics, e *env) error {
	want := map[string]int{
		"applied":       e.stream.unique,
		"duplicate":     e.cfg.N - e.stream.unique,
		"dead_lettered": 0,
	}
	var errs []error
	for outcome, n := range want {
		var m dto.Metric
		if err := metrics.Messages.WithLabelValues(e.topic, outcome).Write(&m); err != nil {
			return err
		}
		if got := int(m.GetCounter().GetValue()); got != n {
			errs = append(errs, fmt.Errorf("%d messages %s, want %d", got, outcome, n))
		}
	}
	return errors.Join(errs...)
}

// checkPayments checks the database against the stream: one inbox row and one payments row per
// distinct callback, each for its own order and transaction, every order PAID by its transaction, and
// nothing else.
func checkPayments(ctx context.Context, e *env) error {
	var keys, payments, matching, unpaid, anomalies int
	err := e.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM inbox),
		       (SELECT count(*) FROM payments),
		       (SELECT count(*) FROM payments p JOIN orders o USING (order_no)
		        WHERE p.result = 'SUCCESS' AND o.status = 'PAID' AND o.provider_txn_id = p.provider_txn_id
		          AND o.amount = p.amount AND substr(p.idempotency_key, 5) = substr(p.order_no, 5)
		          AND substr(p.provider_txn_id, 5) = substr(p.order_no, 5)),
		       (SELECT count(*) FROM orders WHERE status <> 'PAID'),
		       (SELECT count(*) FROM payment_anomalies)`).Scan(&keys, &payments, &matching, &unpaid, &anomalies)
	if err != nil {
		return fmt.Errorf("check the database: %w", err)
	}
	u := e.stream.unique
	if keys != u || payments != u || matching != u || unpaid != 0 || anomalies != 0 {
		return fmt.Errorf("the database does not match the stream's %d callbacks: %d inbox keys, %d payments "+
			"(%d matching their callback and paying their order), %d orders not paid, %d anomalies",
			u, keys, payments, matching, unpaid, anomalies)
	}
	return nil
}
