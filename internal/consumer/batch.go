package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// applyBatch applies a batch's messages (Config.Transactions PerBatch) in as few transactions as it
// can, through the route's BatchHandler, and returns how many finished, in offset order. It keeps
// the per-message path's guarantees by handing that path every message a batch cannot settle:
//
//   - A message without a valid idempotency key is dead-lettered in its place, and a message whose
//     key has messages in the park is parked behind them; the messages on either side of it go in
//     separate transactions.
//   - A run of messages with valid keys is claimed and applied in one transaction
//     (inbox.Store.ProcessBatch), and its key-reused messages dead-lettered after the commit.
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
	runs := make([]int, len(batch)) // how often each message's handler ran in a batch
	done := 0
	for done < len(batch) {
		if p.isStopping() {
			return done
		}
		if batch[done].keyErr != nil || p.keyParked(batch[done]) {
			if p.applyMessage(ctx, batch[done], tried{}) != nil {
				return done
			}
			done++
			continue
		}
		end := done + 1
		for end < len(batch) && batch[end].keyErr == nil && !p.keyParked(batch[end]) {
			end++
		}
		got := p.applyRun(ctx, batch[done:end], runs[done:end])
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

// transaction is what came of one batch transaction.
type transaction struct {
	outcomes []inbox.Outcome // one per message, when it committed
	// panicked: HandleBatch panicked, which rolled the transaction back and is no one message's
	// failure.
	panicked bool
	err      error
}

// applyRun takes msgs, whose keys are valid, through one transaction, or takes the messages up to
// the first one that failed in it to a finished state (see applyBatch).
func (p *partition) applyRun(ctx context.Context, msgs []*entry, runs []int) batchProgress {
	began := time.Now()
	tx := p.transact(ctx, msgs, runs)
	if tx.err == nil {
		return p.settleRun(ctx, msgs, runs, tx.outcomes, began)
	}
	if ctx.Err() != nil {
		return batchProgress{abandoned: true}
	}

	var failed *inbox.BatchError
	if !errors.As(tx.err, &failed) || tx.panicked || isUnavailable(failed.Err) {
		if !tx.panicked { // else logged already
			p.log.WarnContext(ctx, "cannot apply the batch in one transaction; applying its messages one by one",
				"first_offset", msgs[0].msg.Offset, "last_offset", msgs[len(msgs)-1].msg.Offset, "error", tx.err)
		}
		return p.applyEach(ctx, msgs, runs, began)
	}

	t := failed.Index
	p.log.DebugContext(ctx, "a message failed in a batch; applying the others without it",
		"offset", msgs[t].msg.Offset, "key", msgs[t].key, "error", failed.Err)
	if t > 0 {
		var got batchProgress
		switch again := p.transact(ctx, msgs[:t], runs[:t]); {
		case again.err == nil:
			got = p.settleRun(ctx, msgs[:t], runs[:t], again.outcomes, began)
		case ctx.Err() != nil:
			got.abandoned = true
		default:
			p.log.WarnContext(ctx, "cannot apply the batch in one transaction; applying its messages one by one",
				"first_offset", msgs[0].msg.Offset, "last_offset", msgs[t-1].msg.Offset, "error", again.err)
			got = p.applyEach(ctx, msgs[:t], runs[:t], began)
		}
		if got.abandoned || p.isStopping() {
			return batchProgress{finished: got.finished, abandoned: true}
		}
	}
	// A retryable failure goes on from that failed attempt, with a backoff and a retry alone. A
	// permanent one is confirmed by a run alone before the message is dead-lettered: a batch may
	// fail on a message for a reason that is not that message's own.
	prior := tried{runs: runs[t], began: began}
	if kind, _, _ := fault.Classify(failed.Err); kind == fault.KindRetryable {
		prior.err = failed.Err
	}
	if p.applyMessage(ctx, msgs[t], prior) != nil {
		return batchProgress{finished: t, abandoned: true}
	}
	return batchProgress{finished: t + 1}
}

// applyEach takes msgs, which ran in batches that failed, through the per-message path.
func (p *partition) applyEach(ctx context.Context, msgs []*entry, runs []int, began time.Time) batchProgress {
	for i, e := range msgs {
		if p.isStopping() || p.applyMessage(ctx, e, tried{runs: runs[i], began: began}) != nil {
			return batchProgress{finished: i, abandoned: true}
		}
	}
	return batchProgress{finished: len(msgs)}
}

// transact claims msgs and runs the handler on the claimed ones in one inbox transaction, under a
// context bounded by AttemptTimeout, and counts the runs of their handler in runs: up to the
// message the batch failed on, if it did.
func (p *partition) transact(ctx context.Context, msgs []*entry, runs []int) (tx transaction) {
	ctx, cancel := context.WithTimeout(ctx, p.c.config.AttemptTimeout)
	defer cancel()
	batch := make([]inbox.Message, len(msgs))
	for i, e := range msgs {
		batch[i] = p.inboxMessage(e.msg, e.key)
	}
	var ran []int // the claimed messages, given to the handler
	tx.outcomes, tx.err = p.c.config.Store.ProcessBatch(ctx, batch, func(ctx context.Context, pgTx pgx.Tx, claimed []int) (results []error) {
		ran = claimed
		ds := make([]inbox.Delivery, len(claimed))
		for j, i := range claimed {
			ds[j] = inbox.Delivery{Key: msgs[i].key, Value: msgs[i].msg.Value, Attempt: runs[i] + 1}
		}
		defer func() {
			if r := recover(); r != nil {
				p.log.ErrorContext(ctx, "the handler panicked in a batch; applying its messages one by one",
					"first_offset", msgs[0].msg.Offset, "last_offset", msgs[len(msgs)-1].msg.Offset,
					"panic", r, "stack", string(debug.Stack()))
				tx.panicked = true
				results = make([]error, len(claimed))
				results[0] = fault.Permanent(fault.HandlerError, fmt.Errorf("panic: %v", r))
			}
		}()
		return p.batcher.HandleBatch(ctx, pgTx, ds)
	})
	var failed *inbox.BatchError
	for _, i := range ran {
		if errors.As(tx.err, &failed) && !tx.panicked && i > failed.Index {
			break // the handler stopped at the failure
		}
		runs[i]++
	}
	return tx
}

// settleRun settles the messages of a committed batch, in order: it dead-letters those whose key
// was reused (their handler ran only in batches that failed, as runs counts) and records the metrics. A dead letter it could not write before the work was
// cancelled or the consumer began to stop abandons the rest: they were applied, and are found
// duplicates when delivered again.
func (p *partition) settleRun(ctx context.Context, msgs []*entry, runs []int, outcomes []inbox.Outcome, began time.Time) batchProgress {
	counts := make(map[inbox.Outcome]int, 3)
	for i, e := range msgs {
		outcome := string(outcomes[i])
		if outcomes[i] == inbox.KeyReused {
			log := p.log.With("offset", e.msg.Offset, "key", e.key)
			if p.deadLetter(ctx, e.msg, *keyReused(e.key, runs[i]), log) != nil {
				return batchProgress{finished: i, abandoned: true}
			}
			outcome = outcomeDeadLettered
		}
		counts[outcomes[i]]++
		p.c.metrics.finished(p.topic, outcome, time.Since(began))
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
