package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// retrier retries the parked messages of one partition, for the generation that owns it: the due
// head of each key, as many at once as the route's gate lets start, each on a goroutine of its own,
// until it is applied, found a duplicate or dead-lettered, and the key's next message gets its
// turn. It is the park's executor of the policy's decisions (policy.go), as the partition is the
// executor in place (apply.go). It takes messages only while the gate lets them start — while the
// route is paused, one probe at a time — and a stop lets the retries in flight finish, within the
// shutdown timeout, as it does the messages in place.
type retrier struct {
	p *partition
	// owner names the retrier in its holds of parked messages; unique to it.
	owner string
	// lease is how long a hold lasts: longer than an attempt.
	lease time.Duration
	// poll is the longest wait between two looks at the park while it holds messages of the
	// partition; idle, while it holds none. A message parked by this partition wakes the retrier at
	// once; idle bounds how long one parked by an owner that has just lost the partition waits to
	// be found.
	poll, idle time.Duration
	log        *slog.Logger
	wakeup     chan struct{}

	inFlight sync.WaitGroup
	// outages counts the retries in a row that found the database down: the retrier slows down.
	outages atomic.Int32
}

// retrierPoll and retrierIdlePoll are retrier.poll and retrier.idle.
const (
	retrierPoll     = time.Second
	retrierIdlePoll = 30 * time.Second
)

// retryBatch is the most due messages a retrier takes at once: finding the due heads costs a scan
// of the partition's parked keys. probeCandidates is how many it looks at for a probe.
const (
	retryBatch      = 32
	probeCandidates = 8
)

// startRetrier reads the keys the park holds for the partition, for a new owner, and starts the
// partition's retrier: it takes parked messages under idle, and retries them under work. It waits
// for the database as long as it is down, and fails only when idle is done. stop waits for the
// retrier, and for its retries in flight.
func (p *partition) startRetrier(idle, work context.Context) (stop func(), err error) {
	err = p.retryDatabase(idle, "read the keys parked from the partition", func(ctx context.Context) error {
		p.parked, err = loadParkedKeys(ctx, p.c.config.Store, p.topic, p.id)
		return err
	})
	if err != nil {
		return nil, err
	}
	if n := p.parked.len(); n > 0 {
		p.log.Info("taking over the partition's parked keys", "keys", n)
	}
	p.retrier = newRetrier(p, inbox.NewHolder(fmt.Sprintf("retrier of %s/%d (generation %d, member %s)", p.topic, p.id, p.gen.ID, p.gen.MemberID)))
	var wg sync.WaitGroup
	wg.Go(func() { p.retrier.run(idle, work) })
	return wg.Wait, nil
}

// newRetrier returns the retrier of p, named owner in its holds.
func newRetrier(p *partition, owner string) *retrier {
	return &retrier{
		p:      p,
		owner:  owner,
		lease:  p.c.config.ParkLease,
		poll:   retrierPoll,
		idle:   retrierIdlePoll,
		log:    p.log.With("component", "retrier"),
		wakeup: make(chan struct{}, 1),
	}
}

// wake makes the retrier look at the park now: something was parked.
func (r *retrier) wake() {
	select {
	case r.wakeup <- struct{}{}:
	default:
	}
}

// run takes due messages until idle is done, then waits for its retries in flight and gives up its
// holds, so that the partition's next owner need not wait for them to lapse.
func (r *retrier) run(idle, work context.Context) {
	defer r.releaseAll(work)
	defer r.inFlight.Wait()
	if r.p.parked.len() == 0 {
		// Nothing parked from the partition: nothing to look at until something is parked.
		r.sleep(idle, max(r.idle, r.poll))
	}
	waits := 0
	for idle.Err() == nil {
		if n := r.outages.Load(); n > 0 {
			r.sleep(idle, r.p.route.policy.waitDelay(int(n)))
		}
		limit, probe, wait := r.mayTake()
		if limit == 0 {
			r.sleep(idle, wait)
			continue
		}
		taken, err := r.p.c.config.Store.Park().TakeDue(idle, r.p.topic, int32(r.p.id), r.owner, r.lease, limit)
		if err == nil && len(taken) == 0 {
			wait, err = r.untilDue(idle)
		}
		switch {
		case err != nil && idle.Err() != nil:
			return
		case err != nil:
			waits++
			delay := r.p.route.policy.waitDelay(waits)
			r.log.WarnContext(idle, "cannot read the park; waiting for the database", "delay", delay, "error", err)
			r.sleep(idle, delay)
			continue
		case len(taken) == 0:
			r.sleep(idle, wait)
			continue
		}
		waits = 0
		if probe {
			taken = r.pickProbe(work, taken)
		}
		r.launch(idle, work, taken)
	}
}

// mayTake says how many due messages may be taken now — as many as the route has slots free
// (one at least, which waits for a slot), or candidates for the probe of a paused route — or how
// long to wait before asking again.
func (r *retrier) mayTake() (limit int, probe bool, wait time.Duration) {
	g := r.p.route.gate
	switch admission, wait := g.Admit(); admission {
	case gate.AdmitNone:
		return 0, false, cmp.Or(wait, r.poll)
	case gate.AdmitProbe:
		return probeCandidates, true, 0
	}
	return min(max(g.Free(), 1), retryBatch), false, 0
}

// pickProbe keeps one of taken to probe the paused route with — of a key whose failures did not
// trip the circuit if there is one — and gives the others back, due as they were.
func (r *retrier) pickProbe(ctx context.Context, taken []inbox.Parked) []inbox.Parked {
	pick := 0
	for i, m := range taken {
		if !r.p.route.gate.Tripped(string(m.OrderingKey)) {
			pick = i
			break
		}
	}
	rest := append(append([]inbox.Parked(nil), taken[:pick]...), taken[pick+1:]...)
	r.releaseRest(ctx, rest)
	return taken[pick : pick+1]
}

// launch retries each of taken on a goroutine of its own once it has a slot of the route. It gives
// back what it has not launched when idle is done, or when waiting for slots has taken so long that
// the holds on the rest may lapse.
func (r *retrier) launch(idle, work context.Context, taken []inbox.Parked) {
	tookAt := time.Now()
	for i, m := range taken {
		if time.Since(tookAt) > r.lease/2 || r.p.route.gate.Acquire(idle) != nil {
			r.releaseRest(work, taken[i:])
			return
		}
		r.inFlight.Go(func() {
			defer r.wake() // its key's next message, or its own next retry, may be due
			defer r.p.route.gate.Release()
			r.retry(work, m)
		})
	}
}

// untilDue returns how long until the next parked message is due, at most poll.
func (r *retrier) untilDue(ctx context.Context) (time.Duration, error) {
	wait, ok, err := r.p.c.config.Store.Park().NextDue(ctx, r.p.topic, int32(r.p.id))
	switch {
	case err != nil:
		return r.poll, err
	case !ok:
		return max(r.idle, r.poll), nil
	}
	return min(max(wait, time.Millisecond), r.poll), nil
}

// sleep waits for d, for a wake-up, for the route's circuit to change, or for ctx to be done.
func (r *retrier) sleep(ctx context.Context, d time.Duration) {
	_ = wait.Sleep(ctx, d, r.wakeup, r.p.route.gate.Changed())
}

// retry makes one attempt at m, which the retrier holds, and settles it as the policy decides: it
// leaves the park (applied, a duplicate, dead-lettered) or is rescheduled.
func (r *retrier) retry(ctx context.Context, m inbox.Parked) {
	log := r.log.With("offset", m.Offset, "key", m.IdempotencyKey, "parked_id", m.ID)
	starts, err := r.p.c.config.Store.StartLog().RecordParked(ctx, m)
	if err != nil {
		r.settleFailed(ctx, "begin a retry of the parked message", err, log)
		return
	}
	ctx, span := r.p.c.config.Tracer.StartMessage(ctx, tracing.Message{Group: r.p.c.config.GroupID,
		Topic: r.p.topic, Partition: r.p.id, Offset: m.Offset, IdempotencyKey: m.IdempotencyKey,
		Headers: fromParked(m).Headers})
	defer span.End()
	if crash, ok := crashLooped(starts); ok {
		r.deadLetterAndRemove(ctx, m, span, failure{reason: crash.reason, err: crash.err, attempts: m.Attempts}, log)
		return
	}
	g := r.p.route.gate
	a := attempt{
		units: []unit{{msg: parkedMessage(m), value: m.Value, produced: m.Produced, verifiedBy: m.VerifiedBy,
			number: m.Attempts + 1}},
		parked: &m, log: log,
	}
	// Only the route's pace is waited for here: paused since m was taken, the route keeps it in the
	// park, nothing charged.
	res, admitted, err := r.p.runAdmitted(ctx, string(m.OrderingKey), func() bool { return g.NotYet() != 0 },
		func() result { return r.p.route.run(ctx, a) })
	if !admitted || err != nil {
		r.release(ctx, m, 0, log)
		return
	}
	h := history{attempts: m.Attempts, spent: m.BudgetSpent, parked: true, reason: m.Reason, firstAt: m.FirstFailedAt}
	if abandoned(ctx, res) {
		if ctx.Err() == nil {
			log.InfoContext(ctx, "another owner took the parked message over", "error", res.err)
		}
		return
	}
	d := r.p.route.policy.decide(h, res, routeView{open: g.Open()})
	h = h.next(res, d, time.Now())
	if d.throttle > 0 {
		g.Throttle(d.throttle)
	}
	switch d.action {
	case finish:
		_ = r.leave(ctx, m, r.ended(m, span, d.outcome, h.attempts, log)) // no dead letter: it cannot fail
	case deadLetter:
		r.deadLetterAndRemove(ctx, m, span, failureOf(d, h, m.IdempotencyKey), log)
	default:
		span.SetOutcome("parked")
		r.reschedule(ctx, m, res, d, h, log)
	}
}

// reschedule puts m back in the park, due after d.delay: with the attempt's failure and the budget
// it cost, or, when its handler did not run (the database down, its key's lease held), as it was.
func (r *retrier) reschedule(ctx context.Context, m inbox.Parked, res result, d decision, h history, log *slog.Logger) {
	if d.wait == waitDatabase {
		r.outages.Add(1)
		log.WarnContext(ctx, "the database is unavailable; the parked message waits for it", "error", d.err)
	} else {
		r.outages.Store(0)
	}
	if res.ran[0] == 0 {
		r.release(ctx, m, d.delay, log)
		return
	}
	failed := inbox.ParkedFailure{Err: d.err, Reason: d.reason, Spent: d.charge, RetryIn: d.delay}
	if err := r.p.c.config.Store.Park().Reschedule(ctx, m, failed); err != nil {
		r.settleFailed(ctx, "reschedule the parked message", err, log)
		return
	}
	r.p.c.metrics.retried(r.p.topic)
	log.InfoContext(ctx, "retrying the parked message", "attempt", h.attempts, "delay", d.delay,
		"budget_spent", h.spent, "error", d.err)
}

// deadLetterAndRemove dead-letters m, then takes it out of the park: the key's next message gets its
// turn. A dead letter written whose message could not be removed is written again by the next
// retry: never lost.
func (r *retrier) deadLetterAndRemove(ctx context.Context, m inbox.Parked, span tracing.Span, f failure, log *slog.Logger) {
	end := r.ended(m, span, "", f.attempts, log)
	end.failure = &f
	deadLettered := false
	end.complete = func(ctx context.Context) error {
		deadLettered = true
		err := r.p.c.config.Store.Park().Remove(ctx, m)
		if err != nil {
			r.settleFailed(ctx, "remove the dead-lettered message from the park", err, log)
		}
		return err
	}
	if err := r.leave(ctx, m, end); err != nil && !deadLettered && ctx.Err() == nil {
		log.ErrorContext(ctx, "cannot dead-letter the parked message; it stays parked", "error", err)
		r.release(ctx, m, r.p.c.config.Retry.InitialInterval, log)
	}
}

// ended is m, which left the park with outcome after attempts, as finish takes it: its handle time
// counts from its first failure (from when it was parked, for one parked behind its key's head
// without having run).
func (r *retrier) ended(m inbox.Parked, span tracing.Span, outcome inbox.Outcome, attempts int, log *slog.Logger) ended {
	return ended{msg: fromParked(m), key: m.IdempotencyKey, span: span, outcome: outcome,
		began: cmp.Or(m.FirstFailedAt, m.ParkedAt), log: log, parked: true, parkedAt: m.ParkedAt, attempts: attempts}
}

// leave finishes m, which left the park as end says, and frees its key for its next parked message.
// It returns finish's error: nothing of m is recorded then.
func (r *retrier) leave(ctx context.Context, m inbox.Parked, end ended) error {
	if err := r.p.finish(ctx, end); err != nil {
		return err
	}
	r.outages.Store(0)
	if err := r.p.parked.left(ctx, m.OrderingKey); err != nil && ctx.Err() == nil {
		// The key stays marked: its next message is parked behind, where it waits no longer than
		// a look at the park.
		log := end.logger(r.p)
		log.WarnContext(ctx, "cannot tell whether the key has more messages parked", "error", err)
	}
	return nil
}

// release gives m's hold back, due in retryIn, nothing charged.
func (r *retrier) release(ctx context.Context, m inbox.Parked, retryIn time.Duration, log *slog.Logger) {
	if err := r.p.c.config.Store.Park().Release(ctx, m, retryIn); err != nil {
		r.settleFailed(ctx, "release the parked message", err, log)
	}
}

// settleFailed logs a failed change to the park, what it could not do. The message keeps its hold until it lapses, then
// is retried: nothing is lost, and the inbox keeps a message applied once.
func (r *retrier) settleFailed(ctx context.Context, what string, err error, log *slog.Logger) {
	if ctx.Err() != nil || errors.Is(err, inbox.ErrHoldLost) {
		return
	}
	log.WarnContext(ctx, "cannot "+what+"; its hold will lapse", "lease", r.lease, "error", err)
	if isUnavailable(err) {
		r.outages.Add(1)
	}
}

// releaseRest gives back the holds on ms, not retried, due as they were.
func (r *retrier) releaseRest(ctx context.Context, ms []inbox.Parked) {
	for _, m := range ms {
		if err := r.p.c.config.Store.Park().Release(ctx, m, 0); err != nil && ctx.Err() == nil && !errors.Is(err, inbox.ErrHoldLost) {
			r.log.WarnContext(ctx, "cannot give back the hold on a parked message; it will lapse",
				"parked_id", m.ID, "error", err)
		}
	}
}

// releaseAll gives up the retrier's holds when it stops.
func (r *retrier) releaseAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := r.p.c.config.Store.Park().ReleaseAll(ctx, r.owner); err != nil {
		r.log.WarnContext(ctx, "cannot give up the holds on parked messages; they will lapse", "lease", r.lease, "error", err)
	}
}

// rollbackTimeout bounds the clean-up that runs once the retrier's context is done.
const rollbackTimeout = 5 * time.Second

// parkedMessage is m as the inbox records it.
func parkedMessage(m inbox.Parked) inbox.Message {
	return inbox.Message{
		Handler:     m.Handler,
		Key:         m.IdempotencyKey,
		Fingerprint: inbox.Fingerprint(m.Value),
		Topic:       m.Topic,
		Partition:   m.Partition,
		Offset:      m.Offset,
	}
}
