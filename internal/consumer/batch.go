package consumer

import (
	"context"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// applyBatch applies a batch's messages (Config.Transactions PerBatch) in as few transactions as it
// can, through the route's BatchHandler, and returns how many finished, in offset order. It keeps
// the per-message path's guarantees by handing that path every message a batch cannot settle:
//
//   - A message without a valid idempotency key is dead-lettered in its place, and a message whose
//     key has messages in the park is parked behind them; the messages on either side of it go in
//     separate transactions.
//   - A run of messages with valid keys is claimed and applied in one transaction, and its
//     key-reused messages dead-lettered after the commit.
//   - When the handler fails on one message, the transaction rolls back; the messages before it are
//     applied again in one transaction, the failed one goes on through the per-message path
//     (retries, dead-lettering), its run in the batch counted as an attempt, and the rest of the
//     run is a new batch.
//   - A failure no one message is to blame for (a database outage, a failed commit, a panic in
//     HandleBatch) sends the rest of the run through the per-message path, which waits out
//     outages and finds the culprit.
//
// A message's handle time is measured from the start of the first transaction that tried it to
// when it finished: in a batch that commits at once, the batch's time.
func (p *partition) applyBatch(ctx context.Context, batch []*entry) int {
	hs := make([]history, len(batch)) // what the batch transactions did to each message
	done := 0
	for done < len(batch) {
		if p.isStopping() {
			return done
		}
		if batch[done].keyErr != nil || p.keyParked(batch[done]) {
			if p.applyMessage(batch[done].ctx, batch[done], carried{}) != nil {
				return done
			}
			done++
			continue
		}
		end := done + 1
		for end < len(batch) && batch[end].keyErr == nil && !p.keyParked(batch[end]) {
			end++
		}
		got := p.applyRun(ctx, batch[done:end], hs[done:end])
		done += got.finished
		if got.abandoned {
			return done
		}
	}
	return done
}

// batchProgress is how far a step took a batch's messages: how many finished, in offset order, and
// whether it abandoned the others because the work was cancelled or the consumer is stopping.
type batchProgress struct {
	finished  int
	abandoned bool
}

// applyRun takes msgs, whose keys are valid, through one transaction, or takes the messages up to
// the first one that failed in it to a finished state (see applyBatch).
func (p *partition) applyRun(ctx context.Context, msgs []*entry, hs []history) batchProgress {
	var began time.Time
	r, admitted, err := p.runAdmitted(ctx, msgs[0].order, p.parksWhilePaused, func() result {
		began = time.Now()
		return p.transact(ctx, msgs, hs)
	})
	switch {
	case err != nil:
		return batchProgress{abandoned: true}
	case !admitted:
		return p.applyEach(ctx, msgs, hs, time.Now()) // the route paused: they wait in the park
	}
	switch {
	case r.err == nil:
		return p.finishRun(ctx, msgs, hs, r, began)
	case ctx.Err() != nil:
		return batchProgress{abandoned: true}
	case r.failed < 0 || isUnavailable(r.err):
		p.log.WarnContext(ctx, "cannot apply the batch in one transaction; applying its messages one by one",
			"first_offset", msgs[0].msg.Offset, "last_offset", msgs[len(msgs)-1].msg.Offset, "error", r.err)
		return p.applyEach(ctx, msgs, hs, began)
	}
	return p.isolate(ctx, msgs, hs, r, began)
}

// isolate takes msgs, whose transaction r failed on the message at r.failed, on without it: those
// before it in a transaction of their own (applyRun again), then it alone.
func (p *partition) isolate(ctx context.Context, msgs []*entry, hs []history, r result, began time.Time) batchProgress {
	t := r.failed
	p.log.DebugContext(ctx, "a message failed in a batch; applying the others without it",
		"offset", msgs[t].msg.Offset, "key", msgs[t].key, "error", r.err)
	if t > 0 {
		got := p.applyRun(ctx, msgs[:t], hs[:t])
		if got.abandoned || p.isStopping() {
			return batchProgress{finished: got.finished, abandoned: true}
		}
		if got.finished < t {
			return got // one before it failed alone: the rest is the caller's next run
		}
	}
	// A retryable failure goes on from that failed attempt, with a backoff and a retry alone. A
	// permanent one is confirmed by a run alone before the message is dead-lettered: a batch may
	// fail on a message for a reason that is not that message's own.
	c := carried{h: hs[t], began: began}
	if kind, _, _ := fault.Classify(r.err); kind == fault.KindRetryable {
		one := r.one(t)
		one.ran[0] = 0 // counted in hs already
		c.first = &one
	}
	if p.applyMessage(msgs[t].ctx, msgs[t], c) != nil {
		return batchProgress{finished: t, abandoned: true}
	}
	return batchProgress{finished: t + 1}
}

// applyEach takes msgs, which ran in batches that failed, through the per-message path.
func (p *partition) applyEach(ctx context.Context, msgs []*entry, hs []history, began time.Time) batchProgress {
	for i, e := range msgs {
		if p.isStopping() || p.applyMessage(e.ctx, e, carried{h: hs[i], began: began}) != nil {
			return batchProgress{finished: i, abandoned: true}
		}
	}
	return batchProgress{finished: len(msgs)}
}

// transact makes one attempt at msgs in one transaction, and counts in hs the runs of their
// handler: up to the message the batch failed on, if it did.
func (p *partition) transact(ctx context.Context, msgs []*entry, hs []history) result {
	a := attempt{
		units: make([]unit, len(msgs)),
		log:   p.log.With("first_offset", msgs[0].msg.Offset, "last_offset", msgs[len(msgs)-1].msg.Offset),
	}
	for i, e := range msgs {
		a.units[i] = p.unitOf(e, hs[i].attempts+1)
	}
	ctx, span := p.c.config.Tracer.StartBatch(ctx, tracing.Batch{Group: p.c.config.GroupID, Topic: p.topic,
		Partition: p.id, Messages: len(msgs)})
	for _, e := range msgs {
		span.Link(e.span)
	}
	r := p.route.run(ctx, a)
	if r.err != nil {
		span.Fail("batch_failed", r.err)
	}
	span.End()
	for i := range hs {
		hs[i].attempts += r.ran[i]
	}
	return r
}

// finishRun finishes the messages of a committed batch, in order: it dead-letters those whose key
// was reused (their handler ran only in batches that failed, as hs counts) and records the
// metrics. A dead letter it could not write before the work was cancelled or the consumer began to
// stop abandons the rest: they were applied, and are found duplicates when delivered again.
func (p *partition) finishRun(ctx context.Context, msgs []*entry, hs []history, r result, began time.Time) batchProgress {
	counts := make(map[inbox.Outcome]int, 3)
	for i, e := range msgs {
		m := ended{msg: e.msg, key: e.key, span: e.span, outcome: r.outcomes[i], began: began}
		if r.outcomes[i] == inbox.KeyReused {
			d := decision{action: deadLetter, reason: inboxtype.IdempotencyKeyReused, err: errKeyReused}
			f := failureOf(d, hs[i], e.key)
			m.failure = &f
		}
		if p.finish(e.ctx, m) != nil {
			return batchProgress{finished: i, abandoned: true}
		}
		counts[r.outcomes[i]]++
	}
	p.log.DebugContext(ctx, "applied a batch in one transaction",
		"first_offset", msgs[0].msg.Offset, "last_offset", msgs[len(msgs)-1].msg.Offset, "took", time.Since(began),
		"applied", counts[inbox.Applied], "duplicate", counts[inbox.Duplicate], "key_reused", counts[inbox.KeyReused])
	return batchProgress{finished: len(msgs)}
}

func isUnavailable(err error) bool {
	kind, _, _ := fault.Classify(err)
	return kind == fault.KindUnavailable
}
