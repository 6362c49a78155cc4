package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// ended is a message that finished, as its executor (in place, in a batch, or the park's retrier)
// hands it to finish.
type ended struct {
	msg     kafka.Message
	key     string // its idempotency key; "" when it has none
	span    tracing.Span
	outcome inbox.Outcome
	failure *failure  // set when it is dead-lettered; outcome is then ignored
	began   time.Time // when its handling began, its handle time's start
	// log is the message's logger; nil for one of a batch, whose logger finish builds only when it
	// writes a line.
	log *slog.Logger
	// parked is set for a message leaving the park; parkedAt and attempts are for its log line.
	parked   bool
	parkedAt time.Time
	attempts int
	// complete, when set, completes its end after its dead letter is written and before it is
	// counted: a parked message's removal from the park.
	complete func(context.Context) error
}

// finish ends a finished message m, the one place that does for every executor: it writes m's
// dead letter when it failed, sets the span's outcome, counts it with its handle time, and logs it.
// It returns an error only when the dead letter or m.complete fails (see partition.deadLetter):
// nothing of m is counted then.
func (p *partition) finish(ctx context.Context, m ended) error {
	outcome := string(m.outcome)
	if f := m.failure; f != nil {
		if err := p.deadLetter(ctx, m.msg, *f, m.logger(p)); err != nil {
			return err
		}
		outcome = outcomeDeadLettered
		m.span.Fail(string(f.reason), f.err)
		if f.reason == inboxtype.BadSignature {
			p.c.metrics.signatureFailed(p.topic, fault.SignatureProblem(f.err))
		}
	}
	if m.complete != nil {
		if err := m.complete(ctx); err != nil {
			return err
		}
	}
	m.span.SetOutcome(outcome)
	p.c.metrics.finished(p.topic, outcome, time.Since(m.began))
	switch {
	case m.parked:
		m.logger(p).InfoContext(ctx, "unparked the message", "outcome", outcome, "attempts", m.attempts,
			"parked_for", time.Since(m.parkedAt).Round(time.Millisecond))
	case m.outcome == inbox.Duplicate && m.failure == nil:
		m.logger(p).InfoContext(ctx, "skipped a duplicate: its idempotency key is recorded already")
	case p.log.Enabled(ctx, slog.LevelDebug):
		m.logger(p).DebugContext(ctx, "finished the message", "outcome", outcome)
	}
	return nil
}

// logger is m's logger: its own, or the partition's with m's offset and key.
func (m *ended) logger(p *partition) *slog.Logger {
	if m.log == nil {
		m.log = p.log.With("offset", m.msg.Offset, "key", m.key)
	}
	return m.log
}
