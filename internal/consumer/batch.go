package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// processTogether is the per-batch strategy (Config.Transactions PerBatch): it applies a batch's
// messages in as few transactions as it can, through the route's BatchHandler, and returns how many
// finished, in offset order, as processEach does. It keeps the per-message path's guarantees by
// handing that path every message a batch cannot settle:
//
//   - A message without a valid idempotency key is dead-lettered in its place; the messages on
//     either side of it go in separate transactions.
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
func (p *partition) processTogether(ctx context.Context, h BatchHandler, batch []kafka.Message) int {
	keys := make([]string, len(batch))
	for i, m := range batch {
		if key, _, err := IdempotencyKey(m); err == nil {
			keys[i] = key
		}
	}
	runs := make([]int, len(batch)) // how often each message's handler ran in a batch
	done := 0
	for done < len(batch) {
		if p.isStopping() {
			return done
		}
		if keys[done] == "" {
			if p.processMessage(ctx, batch[done]) != nil {
				return done
			}
			done++
			continue
		}
		end := done + 1
		for end < len(batch) && keys[end] != "" {
			end++
		}
		n, ok := p.applyTogether(ctx, h, batch[done:end], keys[done:end], runs[done:end])
		done += n
		if !ok {
			return done
		}
	}
	return done
}

// applyTogether takes msgs, whose keys are valid, through one transaction, or takes the messages up
// to the first one that failed in it to a finished state (see processTogether). It returns how many
// finished, in order, and false if it abandoned the others because the work was cancelled or the
// consumer is stopping.
func (p *partition) applyTogether(ctx context.Context, h BatchHandler, msgs []kafka.Message, keys []string, runs []int) (int, bool) {
	began := time.Now()
	outcomes, panicked, err := p.tryTogether(ctx, h, msgs, keys, runs)
	if err == nil {
		return p.finishTogether(ctx, msgs, keys, outcomes, began)
	}
	if ctx.Err() != nil {
		return 0, false
	}

	var failed *inbox.BatchError
	if !errors.As(err, &failed) || panicked || isUnavailable(failed.Err) {
		if !panicked { // else logged already
			p.log.WarnContext(ctx, "cannot apply the batch in one transaction; applying its messages one by one",
				"first_offset", msgs[0].Offset, "last_offset", msgs[len(msgs)-1].Offset, "error", err)
		}
		n := p.processEach(ctx, msgs, priorRuns(runs, began))
		return n, n == len(msgs)
	}

	t := failed.Index
	p.log.DebugContext(ctx, "a message failed in a batch; applying the others without it",
		"offset", msgs[t].Offset, "key", keys[t], "error", failed.Err)
	if t > 0 {
		outcomes, _, err := p.tryTogether(ctx, h, msgs[:t], keys[:t], runs[:t])
		var n int
		switch {
		case err == nil:
			n, _ = p.finishTogether(ctx, msgs[:t], keys[:t], outcomes, began)
		case ctx.Err() != nil:
		default:
			p.log.WarnContext(ctx, "cannot apply the batch in one transaction; applying its messages one by one",
				"first_offset", msgs[0].Offset, "last_offset", msgs[t-1].Offset, "error", err)
			n = p.processEach(ctx, msgs[:t], priorRuns(runs[:t], began))
		}
		if n < t || p.isStopping() {
			return n, false
		}
	}
	// A retryable failure goes on from that failed attempt, with a backoff and a retry alone. A
	// permanent one is confirmed by a run alone before the message is dead-lettered: a batch may
	// fail on a message for a reason that is not that message's own.
	prior := tried{runs: runs[t], began: began}
	if kind, _, _ := fault.Classify(failed.Err); kind == fault.KindRetryable {
		prior.err = failed.Err
	}
	if p.finishMessage(ctx, msgs[t], prior) != nil {
		return t, false
	}
	return t + 1, true
}

// tryTogether claims msgs and runs the handler on the claimed ones in one inbox transaction, under
// a context bounded by AttemptTimeout, and counts the runs of their handler in runs: up to the
// message the batch failed on, if it did. It reports whether HandleBatch panicked: the panic rolls
// the transaction back, and is no one message's failure.
func (p *partition) tryTogether(ctx context.Context, h BatchHandler, msgs []kafka.Message, keys []string, runs []int) (outcomes []inbox.Outcome, panicked bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.c.config.AttemptTimeout)
	defer cancel()
	batch := make([]inbox.Message, len(msgs))
	for i, m := range msgs {
		batch[i] = p.inboxMessage(m, keys[i])
	}
	var ran []int // the claimed messages, given to the handler
	outcomes, err = p.c.config.Store.ProcessBatch(ctx, batch, func(ctx context.Context, tx pgx.Tx, claimed []int) (results []error) {
		ran = claimed
		ds := make([]inbox.Delivery, len(claimed))
		for j, i := range claimed {
			ds[j] = inbox.Delivery{Key: keys[i], Value: msgs[i].Value, Attempt: runs[i] + 1}
		}
		defer func() {
			if r := recover(); r != nil {
				p.log.ErrorContext(ctx, "the handler panicked in a batch; applying its messages one by one",
					"first_offset", msgs[0].Offset, "last_offset", msgs[len(msgs)-1].Offset,
					"panic", r, "stack", string(debug.Stack()))
				panicked = true
				results = make([]error, len(claimed))
				results[0] = fault.Permanent(fault.HandlerError, fmt.Errorf("panic: %v", r))
			}
		}()
		return h.HandleBatch(ctx, tx, ds)
	})
	var failed *inbox.BatchError
	for _, i := range ran {
		if errors.As(err, &failed) && !panicked && i > failed.Index {
			break // the handler stopped at the failure
		}
		runs[i]++
	}
	return outcomes, panicked, err
}

// finishTogether finishes the messages of a committed batch, in order: it dead-letters those whose
// key was reused and records the metrics. It returns how many finished, and false if it abandoned
// the others (a dead letter it could not write before the work was cancelled or the consumer began
// to stop): they were applied, and are found duplicates when delivered again.
func (p *partition) finishTogether(ctx context.Context, msgs []kafka.Message, keys []string, outcomes []inbox.Outcome, began time.Time) (int, bool) {
	counts := make(map[inbox.Outcome]int, 3)
	for i, m := range msgs {
		outcome := string(outcomes[i])
		if outcomes[i] == inbox.KeyReused {
			log := p.log.With("offset", m.Offset, "key", keys[i])
			if p.deadLetter(ctx, m, *keyReused(keys[i], 1), log) != nil {
				return i, false
			}
			outcome = outcomeDeadLettered
		}
		counts[outcomes[i]]++
		p.c.metrics.finished(p.topic, outcome, time.Since(began))
	}
	p.log.DebugContext(ctx, "applied a batch in one transaction",
		"first_offset", msgs[0].Offset, "last_offset", msgs[len(msgs)-1].Offset, "took", time.Since(began),
		"applied", counts[inbox.Applied], "duplicate", counts[inbox.Duplicate], "key_reused", counts[inbox.KeyReused])
	return len(msgs), true
}

// priorRuns describes, for the per-message path, messages that ran in batches that failed.
func priorRuns(runs []int, began time.Time) []tried {
	prior := make([]tried, len(runs))
	for i, n := range runs {
		prior[i] = tried{runs: n, began: began}
	}
	return prior
}

func isUnavailable(err error) bool {
	kind, _, _ := fault.Classify(err)
	return kind == fault.KindUnavailable
}
