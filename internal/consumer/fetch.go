package consumer

import (
	"context"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// fetch fetches the partition's messages into out until ctx is done, never more than MaxInFlight
// ahead of the commit.
func (p *partition) fetch(ctx context.Context, out chan<- kafka.Message) {
	for {
		select {
		case p.room <- struct{}{}:
		case <-ctx.Done():
			return
		}
		m, err := p.reader.FetchMessage(ctx)
		if err != nil {
			<-p.room
			if ctx.Err() != nil {
				return // a cancelled FetchMessage loses no message
			}
			p.log.Warn("cannot fetch from the partition; retrying", "error", err)
			if p.sleep(ctx, time.Second) != nil {
				return
			}
			continue
		}
		if o := p.c.config.Observer; o != nil {
			o.Fetched(p.topic, p.id, m.Offset)
		}
		out <- m // never blocks: out holds MaxInFlight
	}
}

// add takes a fetched message into the window, with its keys.
func (p *partition) add(ctx context.Context, m kafka.Message) {
	e := &entry{msg: m, fetched: time.Now()}
	e.key, e.reason, e.keyErr = p.route.IdempotencyKey(m)
	switch {
	case p.c.config.Ordering == ByPartition:
		e.order = ""
	case len(m.Key) > 0:
		e.order = "k" + string(m.Key)
	case e.keyErr == nil:
		e.order = "i" + e.key
	default:
		e.order = "o" + strconv.FormatInt(m.Offset, 10) // its own: it is dead-lettered, in any order
	}
	if p.committed < 0 {
		p.committed = m.Offset // the partition starts here: what came before is not this run's
	}
	p.window = append(p.window, e)
	p.unstarted++
	p.guard.fetched(ctx, e)
}

// addMore takes in whatever else was fetched already, so that one schedule covers it all.
func (p *partition) addMore(ctx context.Context, fetched <-chan kafka.Message) {
	for len(p.window) < p.c.config.MaxInFlight {
		select {
		case m := <-fetched:
			p.add(ctx, m)
		default:
			return
		}
	}
}
