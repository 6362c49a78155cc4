package consumer

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// The topics the group consumes, as they come and go. kafka-go's group gets two things wrong when a
// subscribed topic is missing (deleted, or not created yet), and both are worked around here
// rather than in a fork:
//
//   - its leader reads every topic's partitions in one request and, one topic missing, assigns no
//     partition of any topic: the payments stop because the SMS topic is gone. The balancers here
//     (topicBalancer) read each topic's partitions again and assign those of every topic present.
//   - its partition watcher ends every generation at once while a topic is missing, and the member
//     rejoins at once: hundreds of rebalances a second, and a generation started as the topic
//     returns may hold none of its partitions for good. The watcher here (watchTopics) counts each
//     topic's partitions, a missing one as 0, against the counts read before the generation's join,
//     and ends the generation only when a count changed: a topic created, deleted or given
//     partitions is consumed again within partitionWatchInterval and a rebalance.
//
// A missing topic (or one not authorised) stops its own route only: an ERROR says so, and Ready is
// false until it can be read again.

// partitionWatchInterval is how often a generation's topics' partitions are counted.
const partitionWatchInterval = 2 * time.Second

// topicCounts is how many partitions each consumed topic has; 0 for a topic that does not exist.
type topicCounts map[string]int

// topicState is what the consumer last saw of its topics. It is safe for concurrent use.
type topicState struct {
	mu      sync.Mutex
	counts  topicCounts // read before the current generation's join; nil if unknown
	missing []string    // the consumed topics absent (missing, or not authorised), sorted
}

// readTopics reads the partitions of topics, in one request. A topic the brokers do not give —
// missing, or not authorised — is in absent, with why, and has no partitions to assign: the
// balancer and the watcher agree on what is there.
func (c *Consumer) readTopics(ctx context.Context, topics []string) (present map[string][]kafka.Partition, absent map[string]error, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.lag.client.Timeout)
	defer cancel()
	meta, err := c.lag.client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, nil, fmt.Errorf("metadata: %w", err)
	}
	present, absent = make(map[string][]kafka.Partition), make(map[string]error)
	for _, t := range meta.Topics {
		if t.Error != nil {
			absent[t.Name] = t.Error
			continue
		}
		for _, p := range t.Partitions {
			present[t.Name] = append(present[t.Name], kafka.Partition{Topic: t.Name, ID: p.ID, Leader: p.Leader})
		}
	}
	return present, absent, nil
}

// countPartitions reads how many partitions each consumed topic has (0 for one absent), and says
// once when a topic goes absent or comes back.
func (c *Consumer) countPartitions(ctx context.Context) (topicCounts, error) {
	present, absent, err := c.readTopics(ctx, c.topics())
	if err != nil {
		return nil, err
	}
	counts := make(topicCounts, len(c.routes))
	for _, topic := range c.topics() {
		counts[topic] = len(present[topic])
	}
	c.noteMissing(counts, absent)
	return counts, nil
}

// noteMissing records which consumed topics counts has no partitions of, and logs the change: why
// a topic is absent, from absent.
func (c *Consumer) noteMissing(counts topicCounts, absent map[string]error) {
	var missing []string
	for _, topic := range c.topics() {
		if counts[topic] == 0 {
			missing = append(missing, topic)
		}
	}
	slices.Sort(missing)
	c.topicState.mu.Lock()
	before := c.topicState.missing
	c.topicState.missing = missing
	c.topicState.mu.Unlock()
	for _, topic := range missing {
		if !slices.Contains(before, topic) {
			c.log.Error("a consumed topic cannot be read (deleted, not created yet, or not authorised): its route consumes nothing until it can",
				"topic", topic, "error", absent[topic])
		}
	}
	for _, topic := range before {
		if !slices.Contains(missing, topic) {
			c.log.Info("a consumed topic can be read again: its route is consumed once the group rebalances", "topic", topic)
		}
	}
}

// missingTopics returns the consumed topics last seen missing.
func (c *Consumer) missingTopics() []string {
	c.topicState.mu.Lock()
	defer c.topicState.mu.Unlock()
	return c.topicState.missing
}

// readCountsBeforeJoin reads the topics' partition counts that the next generation's watcher
// compares against. It runs before the join, so that a topic created while the group joins, after
// its leader assigned the partitions there were, ends that generation: at worst one rebalance too
// many, never a generation that holds none of a new topic's partitions for good.
func (c *Consumer) readCountsBeforeJoin(ctx context.Context) {
	counts, err := c.countPartitions(ctx)
	if err != nil {
		counts = nil // the watcher reads them itself
	}
	c.topicState.mu.Lock()
	c.topicState.counts = counts
	c.topicState.mu.Unlock()
}

// watchTopics runs in a generation (gen.Start) and returns, ending it, once a topic's partition
// count differs from the one read before the generation's join.
func (c *Consumer) watchTopics(genCtx context.Context) {
	c.topicState.mu.Lock()
	baseline := c.topicState.counts
	c.topicState.mu.Unlock()
	t := time.NewTicker(partitionWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-genCtx.Done():
			return
		case <-t.C:
		}
		counts, err := c.countPartitions(genCtx)
		switch {
		case err != nil: // the brokers will answer again; the generation goes on meanwhile
		case baseline == nil:
			baseline = counts
		case !maps.Equal(counts, baseline):
			c.log.Info("the consumed topics' partitions changed: rebalancing", "was", baseline, "now", counts)
			return
		}
	}
}

// topicBalancer is a kafka-go group balancer that assigns the partitions of every subscribed topic
// present, whichever is missing (see Consumer.watchTopics): it reads each topic's partitions again and gives them
// to the balancer it wraps, whose protocol name it keeps, so that members of earlier releases
// balance with it.
type topicBalancer struct {
	kafka.GroupBalancer
	c *Consumer
}

func (b topicBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	var topics []string
	for _, m := range members {
		for _, t := range m.Topics {
			if !slices.Contains(topics, t) {
				topics = append(topics, t)
			}
		}
	}
	present, _, err := b.c.readTopics(context.Background(), topics)
	if err != nil {
		b.c.log.Warn("cannot read the topics' partitions to assign them; assigning those kafka-go read",
			"topics", strings.Join(topics, ","), "error", err)
		return b.GroupBalancer.AssignGroups(members, partitions)
	}
	partitions = partitions[:0:0]
	for _, topic := range topics {
		partitions = append(partitions, present[topic]...) // an absent topic has none: the rest is assigned
	}
	return b.GroupBalancer.AssignGroups(members, partitions)
}
