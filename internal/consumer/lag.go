package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// lagReporter keeps, for every partition of the consumed topics, the consumer_lag gauge (the
// partition's end offset less the group's committed offset, or less its first offset while nothing
// is committed) and the consumer_stalled_seconds gauge, owned by this member or not. A partition
// held by a member that does not consume it (a hung process that still heartbeats) is the one an
// operator most needs to see, and no owner would report it.
//
// Every instance reports the same group-level figures: three small requests per LagInterval
// (metadata, the group's committed offsets, the end offsets), whatever the number of instances, and
// no election to lose or to get wrong during the very rebalances and hangs the gauges are for.
// Queries aggregate with max by (topic, partition).
//
// Stalled follows Burrow's evaluation rules without their window: a partition is fine as long as
// its committed offset moves or its lag is 0 (Burrow: any zero lag in the window is OK); it stalls
// while its committed offset stays put with lag (Burrow's STALL: the offset does not change while
// lag is fixed or growing; and STOPPED: no commit for longer than the window). The gauge is how long
// that has been true, as seen by this instance since it started; an alert's threshold plays the part
// of Burrow's window. The other Burrow rule, lag growing while offsets move (WARNING), is read from
// the lag gauge itself: see the alert rules in deploy/.
type lagReporter struct {
	c      *Consumer
	client *kafka.Client

	// seen is what the last refreshes saw of each partition. Only run's goroutine touches it.
	seen map[topicPartition]*progress
}

type topicPartition struct {
	topic     string
	partition int
}

// progress is how a partition's committed offset has moved.
type progress struct {
	committed int64     // the committed offset last seen; -1 for none
	since     time.Time // when it last moved, or the partition last had no lag
}

func newLagReporter(c *Consumer) *lagReporter {
	return &lagReporter{
		c:      c,
		client: &kafka.Client{Addr: kafka.TCP(c.config.Brokers...), Transport: c.transport, Timeout: 10 * time.Second},
		seen:   make(map[topicPartition]*progress),
	}
}

// run refreshes the gauges at once, then every LagInterval until ctx is done.
func (l *lagReporter) run(ctx context.Context) {
	if l.c.metrics == nil {
		return
	}
	t := time.NewTicker(l.c.config.LagInterval)
	defer t.Stop()
	for {
		if err := l.refresh(ctx, time.Now()); err != nil && ctx.Err() == nil {
			l.c.log.DebugContext(ctx, "cannot refresh the consumer lag", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *lagReporter) refresh(ctx context.Context, now time.Time) error {
	meta, err := l.client.Metadata(ctx, &kafka.MetadataRequest{Topics: l.c.topics()})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	partitions := make(map[string][]int)
	ends := make(map[string][]kafka.OffsetRequest)
	for _, t := range meta.Topics {
		if t.Error != nil {
			continue // not created yet, or deleted: its series go below
		}
		for _, p := range t.Partitions {
			partitions[t.Name] = append(partitions[t.Name], p.ID)
			ends[t.Name] = append(ends[t.Name], kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
		}
	}
	offsets := &kafka.ListOffsetsResponse{}
	committed := make(map[topicPartition]int64)
	if len(partitions) > 0 { // an empty OffsetFetch would ask for every topic of the group
		if committed, err = l.committed(ctx, partitions); err != nil {
			return err
		}
		if offsets, err = l.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: ends}); err != nil {
			return fmt.Errorf("list offsets: %w", err)
		}
	}

	present := make(map[topicPartition]bool)
	for topic, pos := range offsets.Topics {
		for _, po := range pos {
			if po.Error != nil {
				continue
			}
			tp := topicPartition{topic, po.Partition}
			present[tp] = true
			c, ok := committed[tp]
			if !ok {
				c = -1
			}
			next := po.FirstOffset
			if c >= 0 {
				next = c
			}
			lag := max(po.LastOffset-next, 0)
			pr := l.seen[tp]
			if pr == nil {
				pr = &progress{committed: c, since: now}
				l.seen[tp] = pr
			}
			if c != pr.committed || lag == 0 {
				pr.committed, pr.since = c, now
			}
			l.c.metrics.setLag(topic, po.Partition, lag, now.Sub(pr.since))
		}
	}
	for tp := range l.seen {
		if !present[tp] && !listed(partitions, tp) {
			delete(l.seen, tp)
			l.c.metrics.deleteLag(tp.topic, tp.partition)
		}
	}
	return nil
}

// committed returns the group's committed offsets of partitions; a partition without one is absent.
func (l *lagReporter) committed(ctx context.Context, partitions map[string][]int) (map[topicPartition]int64, error) {
	out := make(map[topicPartition]int64)
	resp, err := l.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: l.c.config.GroupID, Topics: partitions})
	if err == nil {
		err = resp.Error
	}
	if errors.Is(err, kafka.GroupIdNotFound) {
		return out, nil // the group has never committed
	}
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	for topic, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error == nil && p.CommittedOffset >= 0 {
				out[topicPartition{topic, p.Partition}] = p.CommittedOffset
			}
		}
	}
	return out, nil
}

// listed reports whether the metadata listed tp: a partition whose offsets could not be read this
// time keeps its series.
func listed(partitions map[string][]int, tp topicPartition) bool {
	for _, p := range partitions[tp.topic] {
		if p == tp.partition {
			return true
		}
	}
	return false
}
