package consumer

import "iter"

// window is a partition's in-flight window: the messages fetched and not yet committed, in offset
// order, with what became of each. It knows which messages may start (the next message of every
// ordering key with nothing in flight), which finished, and so which offset a commit covers. It
// holds no reader, no goroutine and no clock: the partition's goroutine owns it and asks it at each
// step.
//
// A message is unstarted from its fetch (add) until it starts (start); then its ordering key is in
// flight until its dispatch settles (settle), which leaves it finished or, abandoned, unfinished: an
// abandoned message's work rolled back because the partition was revoked or the consumer is
// stopping, and it stays unfinished, never started again by this owner, its key in flight, so that
// no commit covers it, no later message of its key overtakes it, and it is delivered again. The
// window's first messages that are all finished are what the next commit covers (dropFinished): a
// message finished after an unfinished one waits for it.
//
// With Ordering ByPartition every message has the one ordering key "" (see orderingKey), so a
// partition has at most one message in flight, or one batch. The zero window is empty and ready.
type window struct {
	entries []*entry        // fetched, not yet committed, in offset order
	done    int             // how many of entries' first messages are finished
	busy    map[string]bool // ordering keys with a dispatch in flight
	waiting int             // how many of entries are not started
}

// add takes a fetched message into the window, unstarted. Messages are added in offset order.
func (w *window) add(e *entry) {
	w.entries = append(w.entries, e)
	w.waiting++
}

// pass takes a transaction's marker into the window, finished: it is never handled, and a commit
// after it covers it (and the aborted records before it).
func (w *window) pass(e *entry) {
	e.started, e.done = true, true
	w.entries = append(w.entries, e)
	if w.done == len(w.entries)-1 {
		w.done++
	}
}

// startable yields, in offset order and before barrier (the first offset that may not start with
// the others, see crashGuard.barrier), the messages that may start now: those not started whose
// ordering key has nothing in flight. It looks at each message as it reaches it, so a message
// started meanwhile (start) puts its key in flight and the key's later messages are not yielded: a
// caller that starts each message it takes gets the first unstarted message of every free key; one
// that collects them before starting any, as a batch does, gets their keys' later messages too, in
// offset order behind the first.
func (w *window) startable(barrier int64) iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for _, e := range w.entries[w.done:] {
			if e.msg.Offset >= barrier {
				return
			}
			if e.started || w.busy[e.order] {
				continue
			}
			if !yield(e) {
				return
			}
		}
	}
}

// start marks e started and its ordering key in flight.
func (w *window) start(e *entry) {
	if w.busy == nil {
		w.busy = make(map[string]bool)
	}
	e.started = true
	w.waiting--
	w.busy[e.order] = true
}

// unstart undoes the start of e, whose dispatch will not run after all: e is unstarted again and
// its ordering key free.
func (w *window) unstart(e *entry) {
	e.started = false
	w.waiting++
	delete(w.busy, e.order)
}

// settle records what came of a dispatch of entries, in offset order: its first finished messages
// finished, the others abandoned (they stay started and unfinished). It frees the ordering keys of
// the dispatch's finished messages and extends the window's finished messages over those now
// contiguous. An abandoned message's key stays in flight for the rest of the window: its later
// messages must not overtake it, and it is not started again before its redelivery (a stop noticed
// by a retry's wait can abandon a message while schedule still runs).
func (w *window) settle(entries []*entry, finished int) {
	for i, e := range entries {
		e.done = i < finished
		delete(w.busy, e.order)
	}
	for _, e := range entries[finished:] {
		w.busy[e.order] = true
	}
	for w.done < len(w.entries) && w.entries[w.done].done {
		w.done++
	}
}

// dropFinished drops the window's first messages, all finished, and returns the offset after the
// last of them, the next to consume, which a commit is to cover, and how many it dropped: 0, with
// offset 0, when the first message is not finished.
func (w *window) dropFinished() (offset int64, dropped int) {
	if w.done == 0 {
		return 0, 0
	}
	offset = w.entries[w.done-1].msg.Offset + 1
	dropped = w.done
	clear(w.entries[:dropped])
	w.entries = w.entries[dropped:]
	w.done = 0
	return offset, dropped
}

// inFlight returns how many messages the window holds: fetched and not yet committed, what
// Config.MaxInFlight bounds.
func (w *window) inFlight() int { return len(w.entries) }

// unstarted returns how many of the window's messages are not started.
func (w *window) unstarted() int { return w.waiting }

// finished returns how many of the window's first messages are finished: those the next commit
// covers.
func (w *window) finished() int { return w.done }

// allFinished reports whether every message of the window is finished (so also when it is empty).
func (w *window) allFinished() bool { return w.done == len(w.entries) }

// firstUnfinished returns the window's first message that is not finished, or nil if there is none.
func (w *window) firstUnfinished() *entry {
	if w.allFinished() {
		return nil
	}
	return w.entries[w.done]
}

// firstUnstarted returns the window's first message that is not started, or nil if there is none.
func (w *window) firstUnstarted() *entry {
	for _, e := range w.entries[w.done:] {
		if !e.started {
			return e
		}
	}
	return nil
}

// all returns the window's messages, in offset order. The caller must not change the slice.
func (w *window) all() []*entry { return w.entries }

// last returns the window's last message, the last fetched, or nil if the window is empty.
func (w *window) last() *entry {
	if len(w.entries) == 0 {
		return nil
	}
	return w.entries[len(w.entries)-1]
}
