package consumer

import (
	"context"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/idkey"
)

// fetch fetches the partition's messages into out with reader until ctx is done, never more than
// MaxInFlight ahead of the commit. When the reader's position leaves the log, it reads on from where
// reposition says, after a rewind record if that goes back.
func (p *partition) fetch(ctx context.Context, reader *reader, out chan<- record) {
	defer func() { reader.close() }()
	for {
		select {
		case p.room <- struct{}{}:
		case <-ctx.Done():
			return
		}
		r, err := reader.next(ctx)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return // a cancelled fetch loses no message
		case leftTheLog(err):
			next, back := p.reposition(ctx, reader, err)
			if next == nil {
				return
			}
			reader.close()
			reader = next
			if back {
				out <- record{rewind: true} // it holds the room taken above
			} else {
				<-p.room
			}
			continue
		default:
			<-p.room
			if ok, since := p.fetchWarnings.say("fetch", time.Now()); ok {
				p.log.Warn("cannot fetch from the partition; retrying", "error", err, "repeated", since)
			}
			if p.sleep(ctx, time.Second) != nil {
				return
			}
			continue
		}
		if o := p.c.config.Observer; o != nil && !r.marker {
			o.Fetched(p.topic, p.id, r.msg.Offset)
		}
		out <- r // never blocks: out holds MaxInFlight
	}
}

// add takes a fetched record into the window: a message with its keys, or a transaction's marker,
// finished as it comes.
func (p *partition) add(ctx context.Context, r record) {
	if r.rewind {
		p.rewinding = true // see rewind
		return
	}
	m := r.msg
	if p.committed < 0 {
		p.committed = m.Offset // the partition starts here: what came before is not this run's
	}
	if r.marker {
		p.window.pass(&entry{msg: m, marker: true})
		return
	}
	e := &entry{msg: m, fetched: time.Now()}
	switch {
	case len(m.Value) == 0:
		// A tombstone is refused for what it is, whatever the route's Verify and key rule say.
		e.key, e.reason, e.keyErr = idkey.Of(m)
	case p.route.Verify != nil:
		if e.verifiedBy, e.keyErr = p.route.Verify(m); e.keyErr != nil {
			e.reason = inboxtype.BadSignature
		}
	}
	if e.keyErr == nil {
		e.key, e.reason, e.keyErr = p.route.IdempotencyKey(m)
	}
	e.order = orderingKey(p.c.config.Ordering, m, e.key, e.keyErr)
	p.window.add(e)
	p.guard.fetched(ctx, e)
}

// orderingKey is the ordering key of m, whose idempotency key is key (or none, for keyErr), under
// ordering: the one key "" of the whole partition with ByPartition; else its Kafka key, or
// without one its idempotency key, or without either a key of its own, for it is dead-lettered,
// in any order. The three kinds are prefixed so that none is taken for another.
func orderingKey(ordering Ordering, m kafka.Message, key string, keyErr error) string {
	switch {
	case ordering == ByPartition:
		return ""
	case len(m.Key) > 0:
		return "k" + string(m.Key)
	case keyErr == nil:
		return "i" + key
	}
	return "o" + strconv.FormatInt(m.Offset, 10)
}

// addMore takes in whatever else was fetched already, so that one schedule covers it all.
func (p *partition) addMore(ctx context.Context, fetched <-chan record) {
	for p.window.inFlight() < p.c.config.MaxInFlight && !p.rewinding {
		select {
		case r := <-fetched:
			p.add(ctx, r)
		default:
			return
		}
	}
}
