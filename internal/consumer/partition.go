package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"
)

// errStopping is the cause of the end of fetching and waiting once Run's context is cancelled.
var errStopping = errors.New("consumer: stopping")

// beforeOffsetCommit, when set (by tests only), runs after a batch is finished and before its
// offset is committed.
var beforeOffsetCommit func(topic string, partition int, offset int64)

// partition consumes one partition for the generation that assigned it. Its run loop is:
//
//	fetch a batch → record the batch's offset range (crash-loop guard) → process the batch's
//	messages → commit the offset after the last finished one
//
// Messages are processed strictly in offset order; partitions run concurrently.
type partition struct {
	c      *Consumer
	route  Route
	topic  string
	id     int
	gen    *kafka.Generation
	offset int64 // the assigned offset: the group's committed offset, or kafka.FirstOffset
	log    *slog.Logger

	// together is the route's handler when batches are applied in one transaction, else nil.
	together BatchHandler

	reader   *kafka.Reader
	stopping <-chan struct{} // closed when Run's context is cancelled
	pending  []kafka.Message // fetched, not yet taken into a batch

	// suspects is the last offset of a range a previous run started and never finished: it died in
	// it, perhaps because of one of its messages. Up to it, messages run one per batch, so that the
	// crash-loop guard counts each one's starts. -1 when there is none.
	suspects int64
	checked  bool // whether suspects has been looked up
}

func (c *Consumer) newPartition(route Route, a kafka.PartitionAssignment, gen *kafka.Generation) *partition {
	var together BatchHandler
	if h, ok := route.Handler.(BatchHandler); ok && c.config.Transactions == PerBatch {
		together = h
	}
	return &partition{
		together: together,
		c:        c,
		route:    route,
		topic:    route.Topic,
		id:       a.ID,
		gen:      gen,
		offset:   a.Offset,
		log:      c.log.With("topic", route.Topic, "partition", a.ID, "generation", gen.ID),
		suspects: -1,
	}
}

// run consumes the partition until the generation ends (genCtx), Run's context is cancelled (stop),
// or in-flight work is cancelled at the end of the shutdown timeout (hard).
//
// Two contexts govern the loop. work, under which messages are processed, ends when the partition
// is revoked or the shutdown timeout runs out: a transaction in flight then rolls back. idle, under
// which the loop fetches and waits between retries, ends as well when the consumer begins to stop,
// so that a stop lets the current message finish but starts no new one.
func (p *partition) run(stop, hard, genCtx context.Context) {
	work, cancelWork := context.WithCancelCause(hard)
	defer cancelWork(nil)
	defer context.AfterFunc(genCtx, func() { cancelWork(errRevoked) })()
	idle, cancelIdle := context.WithCancelCause(work)
	defer cancelIdle(nil)
	defer context.AfterFunc(stop, func() { cancelIdle(errStopping) })()
	p.stopping = stop.Done()

	p.reader = kafka.NewReader(kafka.ReaderConfig{
		Brokers:         p.c.config.Brokers,
		Topic:           p.topic,
		Partition:       p.id,
		Dialer:          p.c.dialer,
		QueueCapacity:   p.c.config.BatchSize,
		MaxWait:         fetchMaxWait,
		ReadLagInterval: -1,
		Logger:          kafkaLogger(p.log, slog.LevelDebug),
		ErrorLogger:     kafkaLogger(p.log, slog.LevelWarn),
	})
	defer func() {
		if err := p.reader.Close(); err != nil {
			p.log.Warn("cannot close the partition's reader", "error", err)
		}
	}()
	if err := p.reader.SetOffset(p.offset); err != nil {
		p.log.Error("cannot seek the partition's reader", "offset", p.offset, "error", err)
		return
	}
	transactions := PerMessage
	if p.together != nil {
		transactions = PerBatch
	}
	p.log.Info("consuming the partition", "offset", offsetAttr(p.offset), "transactions", transactions.String())

	for {
		batch, err := p.nextBatch(idle)
		if err != nil {
			if idle.Err() != nil {
				break
			}
			p.log.Warn("cannot fetch from the partition; retrying", "error", err)
			if p.sleep(idle, time.Second) != nil {
				break
			}
			continue
		}
		finished := p.runBatch(work, batch)
		if finished > 0 {
			p.commit(batch[finished-1].Offset + 1)
		}
		if finished < len(batch) {
			break
		}
	}
	cause := context.Cause(idle)
	if work.Err() != nil {
		cause = context.Cause(work) // revoked, or stopped at the shutdown timeout
	}
	p.log.Info("released the partition", "cause", cause)
}

// nextBatch returns the next messages to run together: up to BatchSize, or those that arrived
// within BatchWait of the first; a single message while in a range a previous run died in.
func (p *partition) nextBatch(ctx context.Context) ([]kafka.Message, error) {
	if len(p.pending) == 0 {
		if err := p.fetch(ctx); err != nil {
			return nil, err
		}
	}
	if !p.checked {
		if err := p.findUnfinished(ctx, p.pending[0].Offset); err != nil {
			return nil, err
		}
		p.checked = true
	}
	n := min(len(p.pending), p.c.config.BatchSize)
	if p.pending[0].Offset <= p.suspects {
		n = 1
	}
	batch := p.pending[:n:n]
	p.pending = p.pending[n:]
	return batch, nil
}

// fetch waits for a message, then takes whatever else arrives within BatchWait, up to BatchSize.
func (p *partition) fetch(ctx context.Context) error {
	m, err := p.reader.FetchMessage(ctx)
	if err != nil {
		return err
	}
	p.fetched(m)
	p.pending = append(make([]kafka.Message, 0, p.c.config.BatchSize), m)
	wait, cancel := context.WithTimeout(ctx, p.c.config.BatchWait)
	defer cancel()
	for len(p.pending) < p.c.config.BatchSize {
		m, err := p.reader.FetchMessage(wait)
		if err != nil {
			// The wait is over (or the fetch failed, which the next fetch will report). A cancelled
			// FetchMessage loses no message.
			return nil
		}
		p.fetched(m)
		p.pending = append(p.pending, m)
	}
	return nil
}

// runBatch records the batch's start for the crash-loop guard, then processes it. It returns how
// many of the batch's messages finished, in offset order: all of them unless the work was cancelled
// or the consumer is stopping.
func (p *partition) runBatch(ctx context.Context, batch []kafka.Message) int {
	first, last := batch[0].Offset, batch[len(batch)-1].Offset
	starts, err := p.recordStart(ctx, first, last)
	if err != nil {
		return 0
	}
	if len(batch) == 1 && starts > crashLoopStarts {
		if p.deadLetterCrashLoop(ctx, batch[0], starts-1) != nil {
			return 0 // the count stays: the next owner dead-letters it without running it
		}
		return 1
	}
	finished := p.processBatch(ctx, batch)
	if finished < len(batch) {
		// Abandoned cleanly, by a rebalance or a stop: no crash to count.
		p.releaseStart(ctx, first, last)
	}
	return finished
}

// processBatch applies a batch's messages and returns how many finished (applied, duplicate or
// dead-lettered), in offset order. It stops early when the work is cancelled or the consumer begins
// to stop. It is the seam between the processing strategies: in one transaction when the route's
// handler can take a batch (processTogether), else one transaction per message (processEach).
func (p *partition) processBatch(ctx context.Context, batch []kafka.Message) int {
	if p.together != nil {
		return p.processTogether(ctx, p.together, batch)
	}
	return p.processEach(ctx, batch, nil)
}

// processEach is the per-message strategy: it applies a batch's messages one at a time, each in its
// own inbox transaction, and returns how many finished. prior, when set, says what happened to each
// message in batches before.
func (p *partition) processEach(ctx context.Context, batch []kafka.Message, prior []tried) int {
	for i, m := range batch {
		if p.isStopping() {
			return i
		}
		var t tried
		if prior != nil {
			t = prior[i]
		}
		if err := p.finishMessage(ctx, m, t); err != nil {
			return i
		}
	}
	return len(batch)
}

// commit commits offset, the next to consume, in the generation that assigned the partition. A
// commit that fails is not retried: the next batch's commit covers it, and if none comes the
// messages since the last commit are delivered again and found in the inbox.
func (p *partition) commit(offset int64) {
	if hook := beforeOffsetCommit; hook != nil {
		hook(p.topic, p.id, offset)
	}
	err := p.gen.CommitOffsets(map[string]map[int]int64{p.topic: {p.id: offset}})
	if err != nil {
		p.log.Warn("cannot commit the offset; messages from the last commit on will be delivered again",
			"offset", offset, "error", err)
		return
	}
	p.log.Debug("committed the offset", "offset", offset)
	if o := p.c.config.Observer; o != nil {
		o.Committed(p.topic, p.id, offset)
	}
}

func (p *partition) fetched(m kafka.Message) {
	if o := p.c.config.Observer; o != nil {
		o.Fetched(p.topic, p.id, m.Offset)
	}
}

func (p *partition) isStopping() bool {
	select {
	case <-p.stopping:
		return true
	default:
		return false
	}
}

// sleep waits for d, or until ctx is done or the consumer begins to stop, in which case it returns
// why.
func (p *partition) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-p.stopping:
		return errStopping
	}
}

// outageBackOff paces waits for a dependency that is down: without limit, and never so long apart
// that the partition is slow to resume once the dependency is back.
func (p *partition) outageBackOff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.c.config.Retry.InitialInterval),
		backoff.WithMaxInterval(min(p.c.config.Retry.MaxInterval, maxOutageInterval)),
		backoff.WithMaxElapsedTime(0),
	)
}

// maxOutageInterval bounds the wait between checks of a dependency that is down.
const maxOutageInterval = 5 * time.Second

func offsetAttr(offset int64) any {
	switch offset {
	case kafka.FirstOffset:
		return "first"
	case kafka.LastOffset:
		return "last"
	}
	return offset
}
