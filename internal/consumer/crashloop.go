package consumer

import (
	"context"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// The crash-loop guard. A message that kills the process (a panic outside the handler's recover, an
// out-of-memory kill, a SIGKILL) is never finished, so its offset is never committed and every new
// owner of its partition runs it again, forever. To notice, the partition records each range of
// fetched messages through the inbox store (inbox.StartLog.Record) before any of them starts: one
// autocommit statement per round of scheduling, which covers every message fetched by then, never
// one per message. The record goes when the range is finished: with the next record once the
// committed offset is past it, and when the partition is released cleanly (finished, or abandoned
// by a rebalance or a stop, rolled back: no death).
//
// So a record that is still there when a partition starts again, and ends at or after where it
// starts, is a range a run started, did not finish, and died in. The record keeps the fingerprint
// of the range's first message: a different message at that offset (a recreated topic, a new broker
// whose offsets start again at 0) is not the one a run died in, and the record is dropped. The new
// owner runs the messages of the suspect ranges one at a time, each recorded alone and committed
// as soon as it finishes, so that each one's starts are counted alone; a message started
// crashLoopStarts times in a row without finishing is dead-lettered with reason crash_loop on its
// next start, without running its handler (crashLooped, the policy's, decides, for parked messages
// too).
//
// A process that dies for a reason of its own while a message is in flight counts a start against
// that message too: it takes crashLoopStarts such deaths in a row on one message to dead-letter it,
// and a dead letter can be replayed.

// crashGuard is a partition's crash-loop guard. It belongs to the partition's loop goroutine.
type crashGuard struct {
	p     *partition
	where inbox.Partition

	loaded   bool
	suspects []suspect // ranges a previous run died in, not passed yet, in offset order
	covered  int64     // the last offset of the ranges this run recorded; -1 before the first
	recorded []inbox.StartedRange
}

// suspect is a range a previous run started and never finished.
type suspect struct {
	inbox.StartedRange
	// verified: its first message was seen and is the one recorded, or cannot be seen.
	verified bool
}

func newCrashGuard(p *partition) crashGuard {
	return crashGuard{
		p:       p,
		where:   inbox.Partition{Group: p.c.config.GroupID, Topic: p.topic, Partition: int32(p.id)},
		covered: -1,
	}
}

// fetched looks at a message as it is fetched: the first one tells where the partition starts, and
// so which recorded ranges it died in; later ones confirm or clear the suspect ranges they begin.
func (g *crashGuard) fetched(ctx context.Context, e *entry) {
	if !g.loaded {
		g.load(ctx, e.msg.Offset)
	}
	kept := g.suspects[:0]
	for _, s := range g.suspects {
		switch {
		case s.verified || e.msg.Offset < s.First:
		case e.msg.Offset > s.First:
			s.verified = true // its first message is gone (compacted): the rest is the same topic's
		case inbox.Fingerprint(e.msg.Value) != s.FirstFingerprint:
			g.p.log.Info("a message other than the one a previous run died on is at this offset; "+
				"the topic was recreated or its offsets restarted: not a crash loop",
				"offset", e.msg.Offset, "last_offset", s.Last, "starts", s.Starts)
			continue
		default:
			s.verified = true
		}
		kept = append(kept, s)
	}
	g.suspects = kept
}

// load reads the ranges a previous run died in, if the partition now starts at or before their
// end. It waits through database outages; when the partition is revoked or the consumer stops
// first, it gives up, and nothing starts.
func (g *crashGuard) load(ctx context.Context, from int64) {
	var ranges []inbox.StartedRange
	err := g.p.retryDatabase(ctx, "look up the partition's unfinished ranges", func(ctx context.Context) error {
		var err error
		ranges, err = g.p.c.config.Store.StartLog().Unfinished(ctx, g.where, from)
		return err
	})
	if err != nil {
		return
	}
	g.loaded = true
	for _, r := range ranges {
		g.suspects = append(g.suspects, suspect{StartedRange: r, verified: r.First < from})
		g.p.log.Warn("a previous run died in a range of this partition; running it one message at a time",
			"first_offset", r.First, "last_offset", r.Last, "starts", r.Starts)
	}
}

// narrowing drops the suspect ranges the partition has passed, and reports whether its first
// unfinished message is in one: then it runs alone.
func (g *crashGuard) narrowing() bool {
	p := g.p
	if !g.loaded || p.window.allFinished() {
		return false
	}
	next := p.window.firstUnfinished().msg.Offset
	for len(g.suspects) > 0 && g.suspects[0].Last < next {
		g.suspects = g.suspects[1:]
	}
	return len(g.suspects) > 0 && next >= g.suspects[0].First
}

// barrier is the first offset that may not start with the others: the first suspect one.
func (g *crashGuard) barrier() int64 {
	if !g.loaded {
		return -1 // nothing starts before the recorded ranges are known
	}
	if len(g.suspects) == 0 {
		return noBarrier
	}
	return g.suspects[0].First
}

// cover records, before ds start, the range of every message fetched and not yet covered, unless
// ds lie in ranges recorded already. It reports false when it could not (the partition is revoked
// or the consumer stops while the database is down): then ds must not start.
func (g *crashGuard) cover(ctx context.Context, ds []*dispatch) bool {
	last := int64(-1)
	for _, d := range ds {
		last = max(last, d.entries[len(d.entries)-1].msg.Offset)
	}
	if last <= g.covered {
		return true
	}
	p := g.p
	var first *entry
	for _, e := range p.window.all() {
		if e.msg.Offset > g.covered && !e.marker {
			first = e
			break
		}
	}
	r := inbox.StartedRange{
		First:            first.msg.Offset,
		Last:             p.window.last().msg.Offset,
		FirstFingerprint: inbox.Fingerprint(first.msg.Value),
	}
	if _, ok := g.record(ctx, r); !ok {
		return false
	}
	return true
}

// recordAlone records the start of e alone and returns how many times in a row it was started.
func (g *crashGuard) recordAlone(ctx context.Context, e *entry) (int, bool) {
	r := inbox.StartedRange{First: e.msg.Offset, Last: e.msg.Offset, FirstFingerprint: inbox.Fingerprint(e.msg.Value)}
	starts, ok := g.record(ctx, r)
	if ok && starts > 1 {
		g.p.log.Warn("starting a message again: a previous run died in it",
			"offset", e.msg.Offset, "starts", starts)
	}
	return starts, ok
}

func (g *crashGuard) record(ctx context.Context, r inbox.StartedRange) (int, bool) {
	p := g.p
	var starts int
	err := p.retryDatabase(ctx, "record the start of a range of messages", func(ctx context.Context) error {
		var err error
		starts, err = p.c.config.Store.StartLog().Record(ctx, g.where, r, p.committed)
		return err
	})
	if err != nil {
		return 0, false
	}
	g.covered = max(g.covered, r.Last)
	kept := g.recorded[:0]
	for _, old := range g.recorded {
		if old.Last >= p.committed && old.First != r.First { // else deleted by this statement
			kept = append(kept, old)
		}
	}
	g.recorded = append(kept, r)
	return starts, true
}

// release deletes the records of the ranges this run recorded: the partition is being released
// cleanly, its messages finished or rolled back. It is best effort: a record left behind only
// makes the next owner run the range one message at a time.
func (g *crashGuard) release(ctx context.Context) {
	if len(g.recorded) == 0 {
		return
	}
	firsts := make([]int64, len(g.recorded))
	for i, r := range g.recorded {
		firsts[i] = r.First
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := g.p.c.config.Store.StartLog().Release(ctx, g.where, firsts); err != nil {
		g.p.log.Warn("cannot release the records of the partition's started ranges", "error", err)
	}
}
