package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// commitInterval is the least time between two offset commits of a busy partition: messages
// finishing one by one at hundreds a second share a commit instead of costing one each. A partition
// whose fetched messages are all finished commits at once.
const commitInterval = 50 * time.Millisecond

// partition consumes one partition for the generation that assigned it. One goroutine (run) owns
// its state and goes round its steps, a file each:
//
//	fetch → schedule → apply → finish → settle → commit
//
// The messages fetched and not yet committed are its window (window.go), which the steps ask and
// change: a fetcher goroutine fetches up to MaxInFlight messages ahead of the commit, and fetch
// adds them to the window (fetch.go). schedule starts, each on a goroutine of its own, the
// messages the window says may start: the next message of every ordering key with nothing in
// flight (see Config.Ordering), as a batch or one by one, within the route's gate (schedule.go).
// apply takes a dispatch's messages to a finished state: applied, a duplicate, dead-lettered or
// parked (apply.go, batch.go); finish ends each finished one, whichever executor ran it: its dead
// letter, span, metrics and log line (finish.go). settle marks them finished in the window,
// freeing their keys, or abandoned, their keys kept (settle.go). commit commits the offset after
// the highest contiguous finished message and drops those messages from the window (commit.go).
type partition struct {
	c      *Consumer
	route  *route
	topic  string
	id     int
	gen    *kafka.Generation
	offset int64 // the assigned offset: the group's committed offset, or kafka.FirstOffset
	log    *slog.Logger
	// parked are the ordering keys with messages in the park, whose later messages are parked
	// behind them; nil with Ordering ByPartition, which parks nothing. retrier retries them.
	parked  *parkedKeys
	retrier *retrier

	stopping <-chan struct{} // closed when Run's context is cancelled

	// The state below belongs to run's goroutine.

	window    window // the messages fetched and not yet committed
	running   int    // dispatches in flight
	wantsSlot bool   // a message could start if a slot were free
	// slotFreed is closed when a slot of the route is freed after schedule last looked (see partition.schedule).
	slotFreed  <-chan struct{}
	room       chan struct{} // a token per message fetched and not committed
	settled    chan settled  // dispatches' results
	committed  int64         // the offset committed last, else the first fetched; -1 before that
	lastCommit time.Time
	// failedCommit is the offset of the last commit that failed: committed again while nothing
	// newer is.
	failedCommit int64
	// commitFailures counts the commits that failed in a row; commitWarnings says the failure
	// once, then once a minute.
	commitFailures int
	commitWarnings repeats
	guard          crashGuard
	// rewinding: the fetcher reads another log now, at lower offsets (reposition.go); nothing
	// starts or commits until the window's dispatches have settled and it is dropped.
	rewinding bool
	// fetchWarnings says a failing fetch once, then once a minute.
	fetchWarnings repeats
}

// entry is one fetched message, from its fetch to the commit that covers it.
type entry struct {
	msg    kafka.Message
	marker bool   // a transaction's marker, never handled (see record)
	order  string // its ordering key
	key    string // its idempotency key; "" when it has no valid one
	reason inboxtype.Reason
	keyErr error // why it cannot be handled: no valid idempotency key, or no valid signature
	// verifiedBy names the key that verified it, when its route verifies (Route.Verify).
	verifiedBy string
	fetched    time.Time
	// started and done are the window's (see window): started from its start, done once its
	// dispatch finished it.
	started bool
	done    bool
	// ctx and span are the message's span and a context holding it, from the start of its dispatch.
	ctx  context.Context
	span tracing.Span
}

// dispatch is what schedule starts at once: one message, or a batch applied in one transaction.
type dispatch struct {
	entries []*entry
	batch   bool
	// starts, for a message run alone in a range a previous run died in, counts the starts of its
	// range in a row, this one included (see crashGuard); 0 otherwise.
	starts int
}

// settled is what came of a dispatch: how many of its messages finished, in offset order. The
// others were abandoned, their work rolled back, because the partition was revoked or the
// consumer is stopping.
type settled struct {
	d        *dispatch
	finished int
}

func (c *Consumer) newPartition(route *route, a kafka.PartitionAssignment, gen *kafka.Generation) *partition {
	p := &partition{
		c:              c,
		route:          route,
		topic:          route.Topic,
		id:             a.ID,
		gen:            gen,
		offset:         a.Offset,
		log:            c.log.With("topic", route.Topic, "partition", a.ID, "generation", gen.ID),
		room:           make(chan struct{}, c.config.MaxInFlight),
		settled:        make(chan settled, c.config.MaxInFlight),
		committed:      -1,
		failedCommit:   -1,
		commitWarnings: repeats{interval: repeatInterval},
		fetchWarnings:  repeats{interval: repeatInterval},
	}
	p.guard = newCrashGuard(p)
	return p
}

// run consumes the partition until the generation ends (genCtx), Run's context is cancelled (stop),
// or in-flight work is cancelled at the end of the shutdown timeout (hard).
//
// Two contexts govern it. work, under which messages are applied, ends when the partition is
// revoked or the shutdown timeout runs out: a transaction in flight then rolls back. idle, under
// which it fetches, schedules and waits between retries, ends as well when the consumer begins to
// stop, so that a stop lets the messages in flight finish but starts no new one.
func (p *partition) run(stop, hard, genCtx context.Context) {
	work, cancelWork := context.WithCancelCause(hard)
	defer cancelWork(nil)
	defer context.AfterFunc(genCtx, func() { cancelWork(errRevoked) })()
	idle, cancelIdle := context.WithCancelCause(work)
	defer cancelIdle(nil)
	defer context.AfterFunc(stop, func() { cancelIdle(wait.ErrStopping) })()
	p.stopping = stop.Done()

	if p.c.config.Ordering == ByKey {
		stopRetrier, err := p.startRetrier(idle, work)
		if err != nil {
			p.log.Info("released the partition", "cause", err)
			return
		}
		defer stopRetrier()
	}
	transactions := PerMessage
	if p.route.batcher != nil {
		transactions = PerBatch
	}
	p.log.Info("consuming the partition", "offset", offsetAttr(p.offset), "transactions", transactions.String(),
		"ordering", p.c.config.Ordering.String())

	reader, err := p.c.newReader(p.topic, p.id, p.offset, p.log) // the fetcher's, which closes it
	if err != nil {
		p.log.Error("cannot read the partition", "offset", offsetAttr(p.offset), "error", err)
		return
	}
	fetched := make(chan record, p.c.config.MaxInFlight)
	var fetcher sync.WaitGroup
	fetcher.Go(func() { p.fetch(idle, reader, fetched) })
	p.loop(work, idle, fetched)
	cancelIdle(nil)
	fetcher.Wait()
	p.guard.release(work)

	cause := context.Cause(idle)
	if work.Err() != nil {
		cause = context.Cause(work) // revoked, or stopped at the shutdown timeout
	}
	p.log.Info("released the partition", "cause", cause)
}

// loop runs the partition's steps until it is drained: idle is done and nothing is in flight.
func (p *partition) loop(work, idle context.Context, fetched <-chan record) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		draining := idle.Err() != nil
		if p.rewinding && p.running == 0 && !draining {
			p.rewind(work)
		}
		wake := p.step(work, idle, draining)
		if draining && p.running == 0 {
			return
		}
		var alarm <-chan time.Time
		if wake > 0 {
			timer.Reset(wake) // since Go 1.23, no stale tick survives a Reset
			alarm = timer.C
		}
		if hook := p.c.beforeAwait; hook != nil {
			hook(p)
		}
		p.await(work, idle, fetched, draining, alarm)
	}
}

// step starts what may start (unless draining) and commits what is due, and says when to look
// again: 0 when only news can change anything.
func (p *partition) step(work, idle context.Context, draining bool) (wake time.Duration) {
	if p.rewinding {
		return 0 // what settles is of the log left behind: nothing more starts, nothing commits
	}
	if !draining {
		wake = p.schedule(work, idle)
	}
	if due, _ := p.commitDue(draining); due {
		p.commit()
	}
	if _, wait := p.commitDue(draining); wait > 0 && (wake == 0 || wait < wake) {
		wake = wait // the next commit, or a failed one's retry
	}
	return wake
}

// await waits for news and takes it in: a fetched message (and whatever else was fetched), a
// dispatch's result, a slot of the route freed while a message wants one, the alarm, or idle's end.
// Draining, only results and the alarm count.
func (p *partition) await(work, idle context.Context, fetched <-chan record, draining bool, alarm <-chan time.Time) {
	var in <-chan record
	var idleDone, slot <-chan struct{}
	if !draining {
		idleDone = idle.Done()
		if !p.rewinding {
			in = fetched
		}
		if p.wantsSlot {
			slot = p.slotFreed
		}
	}
	select {
	case r := <-in:
		p.add(work, r)
		p.addMore(work, fetched)
	case s := <-p.settled:
		p.settle(s)
	case <-slot: // a slot of the route was freed: what could start is looked at again
	case <-alarm:
	case <-idleDone:
	}
}

func (p *partition) isStopping() bool { return wait.Stopped(p.stopping) != nil }

// sleep waits for d, or until ctx is done or the consumer begins to stop, in which case it returns
// why.
func (p *partition) sleep(ctx context.Context, d time.Duration) error {
	return wait.SleepOrStop(ctx, d, p.stopping, nil)
}

// retry runs try until it succeeds, waiting between tries as the route's policy says for a wait
// that is no message's fault (policy.waitDelay): for the consumer's own writes, which fail only
// when the database or the brokers do. failed hears of each failed try, its number and the delay
// before the next, to say so. It returns an error only when ctx is done or the consumer begins to
// stop.
func (p *partition) retry(ctx context.Context, try func(context.Context) error, failed func(err error, waits int, delay time.Duration)) error {
	for waits := 1; ; waits++ {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		delay := p.route.policy.waitDelay(waits)
		failed(err, waits, delay)
		if err := p.sleep(ctx, delay); err != nil {
			return err
		}
	}
}

// retryDatabase runs fn until it succeeds (see partition.retry). It is for the consumer's own
// statements, which fail only when the database does: no message is to blame, so there is no retry
// budget; after gate.HeldAfterWaits failed tries the route is held until fn succeeds.
func (p *partition) retryDatabase(ctx context.Context, what string, fn func(context.Context) error) error {
	db := databaseWait{gate: p.route.gate}
	defer db.end()
	return p.retry(ctx, fn, func(err error, waits int, delay time.Duration) {
		db.failed(err, waits)
		p.log.Warn("cannot "+what+"; retrying", "delay", delay, "error", err)
	})
}

func offsetAttr(offset int64) any {
	switch offset {
	case kafka.FirstOffset:
		return "first"
	case kafka.LastOffset:
		return "last"
	}
	return offset
}
