package consumer

import (
	"context"
	"math"
	"time"

	"github.com/inboxworker/inboxworker/internal/gate"
)

// schedule starts the messages that may start now, each dispatch on a goroutine of its own, and
// returns how long until it should look again though nothing happens (a batch waiting for more
// messages, a paused route); 0 when only an event (a fetch, a settled dispatch, a free slot of the
// route) can change what may start. While the route's circuit has it paused, nothing starts but,
// once a probe is due, one message (see gate.Gate.Admit).
//
// A message may start when it is the first unstarted message of its ordering key and its key has
// nothing in flight. Messages of a route whose handler takes batches start as batches: the
// startable messages, and the later messages of their keys, in offset order, up to BatchSize; a
// batch smaller than that waits BatchWait after its first message's fetch for more.
func (p *partition) schedule(work, idle context.Context) time.Duration {
	// Taken before any slot is looked at: a slot freed from now on closes it, and await wakes.
	// Taken in await instead, a slot freed in between would be missed, and with it, if it was the
	// route's last to free, the partition's remaining messages.
	p.wantsSlot, p.slotFreed = false, p.route.gate.SlotFreed()
	if p.guard.narrowing() {
		return p.scheduleAlone(work)
	}
	admission, wait := p.route.gate.Admit()
	switch {
	case admission == gate.AdmitNone:
		return wait
	case admission == gate.AdmitProbe && p.running > 0:
		return gate.RoutePoll // the probe starts once nothing of the partition is in flight
	case p.window.unstarted() == 0:
		return 0
	case p.route.gate.Free() == 0:
		p.wantsSlot = true // no slot to start anything with: no need to look for what could start
		return 0
	}
	var ds []*dispatch
	switch {
	case admission == gate.AdmitProbe:
		ds = p.pickProbe() // its first run is the probe of the paused route
	case p.route.batcher != nil:
		ds, wait = p.pickBatches()
	default:
		ds = p.pickMessages()
	}
	if len(ds) == 0 {
		return wait
	}
	if !p.guard.cover(work, ds) {
		p.unpick(ds) // stopping or revoked while the database was down
		return 0
	}
	for _, d := range ds {
		p.launch(work, d)
	}
	return wait
}

// pickMessages takes the messages that may start, one dispatch each, as long as the route has slots.
func (p *partition) pickMessages() []*dispatch {
	var ds []*dispatch
	for e := range p.window.startable(p.guard.barrier()) {
		if !p.takeSlot() {
			p.wantsSlot = true
			break
		}
		p.window.start(e) // its key's later messages wait for it
		ds = append(ds, &dispatch{entries: []*entry{e}})
	}
	return ds
}

// pickProbe takes one message to probe the paused route with: of a key whose failures did not
// trip the circuit if it can, as such a probe tells more of the dependency than a key that may
// fail on its own.
func (p *partition) pickProbe() []*dispatch {
	var pick *entry
	for e := range p.window.startable(p.guard.barrier()) {
		if pick == nil || !p.route.gate.Tripped(e.order) {
			pick = e
		}
		if !p.route.gate.Tripped(e.order) {
			break
		}
	}
	if pick == nil || !p.takeSlot() {
		p.wantsSlot = pick != nil
		return nil
	}
	p.window.start(pick)
	return []*dispatch{{entries: []*entry{pick}}}
}

// pickBatches forms the batches that may start, as long as the route has slots, and says how long
// the next is to wait for more messages.
func (p *partition) pickBatches() ([]*dispatch, time.Duration) {
	var ds []*dispatch
	barrier := p.guard.barrier()
	for {
		if wait := p.batchWait(); wait > 0 {
			return ds, wait // before looking through the window for each message fetched meanwhile
		}
		var batch []*entry
		for e := range p.window.startable(barrier) {
			batch = append(batch, e) // a key's later messages follow its first, in offset order
			if len(batch) == p.c.config.BatchSize {
				break
			}
		}
		if len(batch) == 0 {
			return ds, 0
		}
		if len(batch) < p.c.config.BatchSize && p.window.inFlight() < p.c.config.MaxInFlight {
			if wait := p.c.config.BatchWait - time.Since(batch[0].fetched); wait > 0 {
				return ds, wait
			}
		}
		if !p.takeSlot() {
			p.wantsSlot = true
			return ds, 0
		}
		for _, e := range batch {
			p.window.start(e)
		}
		ds = append(ds, &dispatch{entries: batch, batch: true})
	}
}

// scheduleAlone starts the first unfinished message alone, once nothing else is in flight: the
// partition is in a range a previous run died in (see crashGuard). A first unfinished message that
// was started is one a stop abandoned: nothing starts before its redelivery.
func (p *partition) scheduleAlone(work context.Context) time.Duration {
	if p.running > 0 {
		return 0
	}
	e := p.window.firstUnfinished() // there is one: the guard is narrowing
	if e.started {
		return 0
	}
	if admission, wait := p.route.gate.Admit(); admission == gate.AdmitNone {
		return wait
	}
	if !p.takeSlot() {
		p.wantsSlot = true
		return 0
	}
	starts, ok := p.guard.recordAlone(work, e)
	if !ok {
		p.route.gate.Release()
		return 0
	}
	p.window.start(e)
	p.launch(work, &dispatch{entries: []*entry{e}, batch: p.route.batcher != nil, starts: starts})
	return 0
}

// launch runs d on a goroutine of its own, holding its route slot; its result comes back to settle.
func (p *partition) launch(work context.Context, d *dispatch) {
	p.running++
	go func() {
		s := p.apply(work, d)
		p.route.gate.Release()
		p.settled <- s // never blocks: there are never more dispatches than messages in flight
	}()
}

// unpick undoes the picking of dispatches that will not start.
func (p *partition) unpick(ds []*dispatch) {
	for _, d := range ds {
		for _, e := range d.entries {
			p.window.unstart(e)
		}
		p.route.gate.Release()
	}
}

// batchWait says how long the next batch is to wait for more messages: while fewer than BatchSize
// are unstarted, there is room to fetch more, and the first unstarted one was fetched less than
// BatchWait ago.
func (p *partition) batchWait() time.Duration {
	if p.window.unstarted() >= p.c.config.BatchSize || p.window.inFlight() >= p.c.config.MaxInFlight {
		return 0
	}
	if e := p.window.firstUnstarted(); e != nil {
		return p.c.config.BatchWait - time.Since(e.fetched)
	}
	return 0
}

// takeSlot takes a free slot of the route.
func (p *partition) takeSlot() bool { return p.route.gate.TryAcquire() }

// noBarrier is crashGuard.barrier when no range is suspect.
const noBarrier = math.MaxInt64
