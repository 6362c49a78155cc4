package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// lagReporter keeps the consumer_lag gauge of the partitions this member owns: the partition's end
// offset less the group's committed offset (from the partition's first offset when nothing is
// committed yet). Every LagInterval it asks the brokers for both, in two requests for all owned
// partitions. kafka-go's Reader.Stats().Lag is not per partition for groups, hence this.
type lagReporter struct {
	c      *Consumer
	client *kafka.Client

	mu    sync.Mutex
	owned map[string]map[int]bool // topic → partition
}

func newLagReporter(c *Consumer) *lagReporter {
	return &lagReporter{
		c:      c,
		client: &kafka.Client{Addr: kafka.TCP(c.config.Brokers...), Transport: c.transport, Timeout: 10 * time.Second},
		owned:  make(map[string]map[int]bool),
	}
}

func (l *lagReporter) track(topic string, partition int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owned[topic] == nil {
		l.owned[topic] = make(map[int]bool)
	}
	l.owned[topic][partition] = true
}

// untrack forgets a partition this member no longer owns; its new owner reports its lag.
func (l *lagReporter) untrack(topic string, partition int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.owned[topic], partition)
	l.c.metrics.deleteLag(topic, partition)
}

// run refreshes the gauge every LagInterval until ctx is done.
func (l *lagReporter) run(ctx context.Context) {
	if l.c.metrics == nil {
		return
	}
	t := time.NewTicker(l.c.config.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := l.refresh(ctx); err != nil && ctx.Err() == nil {
				l.c.log.DebugContext(ctx, "cannot refresh the consumer lag", "error", err)
			}
		}
	}
}

func (l *lagReporter) refresh(ctx context.Context) error {
	owned, ends := l.snapshot()
	if len(owned) == 0 {
		return nil
	}
	committed, err := l.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: l.c.config.GroupID, Topics: owned})
	if err == nil {
		err = committed.Error
	}
	if err != nil {
		return fmt.Errorf("fetch committed offsets: %w", err)
	}
	offsets, err := l.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: ends})
	if err != nil {
		return fmt.Errorf("list offsets: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for topic, partitions := range offsets.Topics {
		for _, po := range partitions {
			if po.Error != nil || !l.owned[topic][po.Partition] {
				continue
			}
			next := po.FirstOffset
			for _, c := range committed.Topics[topic] {
				if c.Partition == po.Partition && c.Error == nil && c.CommittedOffset >= 0 {
					next = c.CommittedOffset
				}
			}
			l.c.metrics.setLag(topic, po.Partition, max(po.LastOffset-next, 0))
		}
	}
	return nil
}

// snapshot returns the owned partitions as the two requests want them.
func (l *lagReporter) snapshot() (map[string][]int, map[string][]kafka.OffsetRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	owned := make(map[string][]int)
	ends := make(map[string][]kafka.OffsetRequest)
	for topic, partitions := range l.owned {
		for p := range partitions {
			owned[topic] = append(owned[topic], p)
			ends[topic] = append(ends[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
		}
	}
	return owned, ends
}
