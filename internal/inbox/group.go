package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Claims and completions of calls share transactions.
//
// Each call of ProcessCall commits twice: its lease (step 1) and its completion (step 3). One
// transaction per step and per message costs Postgres two transactions, about nine round trips and
// one flush per message, most of what a message costs it. So the lease requests of one handler's calls are
// committed in groups, and their completions in groups of their own: a step that arrives while its
// handler's previous group of that step is committing waits and joins the next group, with every
// other that arrives meanwhile (up to maxGroup). Nothing waits for a group to fill: a step that finds
// no commit of its kind in flight starts one at once, alone, so a quiet worker commits as before, and
// a busy one commits as many messages per transaction as arrive during one commit.
//
// Each message still gets its own outcome, and its caller reports it (and runs the actions its
// effect registered with AfterCommit) only once the group committed. A failure must not be charged
// to another message, nor lose one: when a group's transaction fails, nothing of it committed, and
// each of its messages does the step again alone, in a transaction of its own, from its own
// goroutine: the message at fault then fails alone, and the others commit. Savepoints per message
// would keep the others in the group's transaction, but cost two round trips per message in every
// group to save work only when one fails, which is rare (a Postgres error, an invalid payload). A
// handler's Check and a call's effect may so run twice, the first time in a transaction rolled back.
//
// A group's transaction goes on while any of its callers still waits for it, and is cancelled once
// the contexts of all of them are done; a caller whose context ends while it waits for a group to
// start leaves the queue, and nothing of it commits.

// maxGroup bounds how many messages one group transaction commits.
const maxGroup = 64

// maxGroupsInFlight is how many groups of one kind commit at once, each on a connection of its own:
// with two, a step rarely waits for a whole commit before its own starts, and groups still form
// while both are busy. (With one, the cmd/bench sms mode measured larger groups and no higher rate.)
const maxGroupsInFlight = 2

// errAlone is a group member's error when the group's transaction failed: nothing of it committed,
// and the member does its step again alone.
var errAlone = errors.New("inbox: the group failed; do the step alone")

// member is what a group knows of one of its messages.
type member struct {
	ctx  context.Context // its caller's
	done chan struct{}   // closed once err is set
	err  error           // the group's error: nil, errAlone, or that of a group of one
}

func newMember(ctx context.Context) member { return member{ctx: ctx, done: make(chan struct{})} }

// step is a lease request or a completion, as a grouper queues it.
type step interface {
	comparable
	base() *member
}

// grouperOf returns the grouper of handler's steps in groupers, made by newGrouper the first time.
func grouperOf[T step](groupers *sync.Map, handler string, newGrouper func() *grouper[T]) *grouper[T] {
	if g, ok := groupers.Load(handler); ok {
		return g.(*grouper[T])
	}
	g, _ := groupers.LoadOrStore(handler, newGrouper())
	return g.(*grouper[T])
}

// grouper commits the steps queued in it, of type T, in groups, one group at a time.
type grouper[T step] struct {
	// admits reports whether m may join group: a group holds each key at most once.
	admits func(group []T, m T) bool
	// commit commits group in one transaction, with ctx, and sets each member's result, or returns
	// the error that rolled it back.
	commit func(ctx context.Context, group []T) error

	mu         sync.Mutex
	queue      []T // waiting for a group
	committing int // goroutines running commitQueued
}

// do queues m, waits until a group holding it has committed or failed, and returns the group's
// error: nil when m's step committed, errAlone when m must do it alone, another error (a group of
// one's), or, when m's context ended before a group took it, that context's error.
func (g *grouper[T]) do(m T) error {
	b := m.base()
	g.mu.Lock()
	g.queue = append(g.queue, m)
	if g.committing < maxGroupsInFlight {
		g.committing++
		go g.commitQueued()
	}
	g.mu.Unlock()

	select {
	case <-b.done:
		return b.err
	case <-b.ctx.Done():
	}
	g.mu.Lock()
	i := slices.Index(g.queue, m)
	if i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
	}
	g.mu.Unlock()
	if i >= 0 { // in no group: nothing of it commits
		return Classify(fmt.Errorf("inbox: %w", context.Cause(b.ctx)))
	}
	<-b.done // in a group's transaction, which commits or not whatever this caller's context says
	return b.err
}

// commitQueued commits groups of the queued steps, one after another, until none is left.
func (g *grouper[T]) commitQueued() {
	for {
		group := g.next()
		if len(group) == 0 {
			return
		}
		err := g.commitGroup(group)
		var batchErr *BatchError
		for _, m := range group {
			b := m.base()
			switch {
			case err == nil:
			case len(group) == 1 && errors.As(err, &batchErr):
				b.err = batchErr.Err // the handler's error, as it is returned without a group
			case len(group) == 1:
				b.err = err
			default:
				b.err = errAlone
			}
			close(b.done)
		}
	}
}

// next takes the next group out of the queue: the queued steps in order, but for those that g does
// not admit into it, which wait for the following group. It reports none, and marks g as not
// committing, when the queue is empty.
func (g *grouper[T]) next() []T {
	g.mu.Lock()
	defer g.mu.Unlock()
	var group []T
	rest := g.queue[:0]
	for _, m := range g.queue {
		if len(group) < maxGroup && g.admits(group, m) {
			group = append(group, m)
		} else {
			rest = append(rest, m)
		}
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	if len(group) == 0 {
		g.committing--
	}
	return group
}

// commitGroup runs g.commit for group with a context that ends once the contexts of all its
// callers have.
func (g *grouper[T]) commitGroup(group []T) error {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(group[0].base().ctx))
	defer cancel(nil)
	var waiting atomic.Int32
	waiting.Store(int32(len(group)))
	for _, m := range group {
		mctx := m.base().ctx
		stop := context.AfterFunc(mctx, func() {
			if waiting.Add(-1) == 0 {
				cancel(context.Cause(mctx))
			}
		})
		defer stop()
	}
	return g.commit(ctx, group)
}

// memberContext is the context in which a group runs a member's handler code (a Check, an effect):
// the member's values, with actions of its own for AfterCommit, cancelled with the group's ctx. stop
// releases what ties it to ctx.
func memberContext(ctx context.Context, m *member) (_ context.Context, _ *afterCommitActions, stop func()) {
	mctx, cancel := context.WithCancelCause(context.WithoutCancel(m.ctx))
	unhook := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	mctx, actions := withAfterCommit(mctx)
	return mctx, actions, func() {
		unhook()
		cancel(nil)
	}
}
