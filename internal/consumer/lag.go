package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/describegroups"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/internal/wait"
)

// lagReporter keeps, for every partition of the consumed topics, the consumer_lag gauge (the
// partition's last stable offset, its end as a read_committed consumer reads it, less the group's
// committed offset, or less its first offset while nothing is committed), the
// consumer_stalled_seconds gauge and the consumer_transaction_open_seconds gauge (how long a
// transaction left open upstream has held the partition), owned by this member or not. A partition
// held by a member that does not consume it (a hung process that still heartbeats) is the one an
// operator most needs to see, and no owner would report it.
//
// Every instance reports the same group-level figures: five small requests per LagInterval
// (metadata, the group's committed offsets, the end offsets read_uncommitted and read_committed,
// the group's description), whatever the
// number of instances, and no election to lose or to get wrong during the very rebalances and hangs
// the gauges are for. Queries aggregate with max by (topic, partition).
//
// The group's description (DescribeGroups) names the member holding each partition: the
// partition_owner gauge, with its member id, client id and host, which the stall alert quotes, so
// that a partition held by a hung process or by another application's consumer is found at once.
// It also tells a member that holds no partition why (warnIdle).
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

	// seen is what the last refreshes saw of each partition, and owners who held each partition,
	// by the group's last description. Only run's goroutine touches them.
	seen   map[topicPartition]*progress
	owners map[topicPartition]owner
}

type topicPartition struct {
	topic     string
	partition int
}

// progress is how a partition's committed offset has moved.
type progress struct {
	committed int64     // the committed offset last seen; -1 for none
	since     time.Time // when it last moved, or the partition last had no lag
	// stable is the last stable offset last seen; stableSince, when it last moved or was the end
	// of the partition (no transaction open).
	stable      int64
	stableSince time.Time
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
	wait.Every(ctx, l.c.config.LagInterval, l.c.log, "refresh the consumer lag", func(ctx context.Context) error {
		return l.refresh(ctx, time.Now())
	})
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
	offsets, stable := &kafka.ListOffsetsResponse{}, &kafka.ListOffsetsResponse{}
	committed := make(map[topicPartition]int64)
	if len(partitions) > 0 { // an empty OffsetFetch would ask for every topic of the group
		if committed, err = l.committed(ctx, partitions); err != nil {
			return err
		}
		// The end offsets as a read_uncommitted consumer sees them (the high watermark) and as
		// the worker reads, read_committed (the last stable offset): below the high watermark
		// while a transaction is open.
		if offsets, err = l.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: ends}); err != nil {
			return fmt.Errorf("list offsets: %w", err)
		}
		if stable, err = l.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: ends, IsolationLevel: kafka.ReadCommitted}); err != nil {
			return fmt.Errorf("list the last stable offsets: %w", err)
		}
	}
	present := l.setLag(offsets, stable, committed, now)
	for tp := range l.seen {
		if !present[tp] && !listed(partitions, tp) {
			delete(l.seen, tp)
			l.c.metrics.deleteLag(tp.topic, tp.partition)
		}
	}
	group, err := l.describe(ctx)
	if err != nil {
		return err
	}
	l.setOwners(group)
	return nil
}

// setLag sets the lag, stall and open-transaction gauges of every partition offsets (the high
// watermarks) and stable (the last stable offsets) list, and returns them. Lag is counted to the
// last stable offset: records of a transaction still open are not there to read yet.
func (l *lagReporter) setLag(offsets, stable *kafka.ListOffsetsResponse, committed map[topicPartition]int64, now time.Time) map[topicPartition]bool {
	lso := make(map[topicPartition]int64)
	for topic, pos := range stable.Topics {
		for _, po := range pos {
			if po.Error == nil {
				lso[topicPartition{topic, po.Partition}] = po.LastOffset
			}
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
			end, ok := lso[tp]
			if !ok {
				end = po.LastOffset
			}
			lag := max(end-next, 0)
			pr := l.seen[tp]
			if pr == nil {
				pr = &progress{committed: c, since: now, stable: end, stableSince: now}
				l.seen[tp] = pr
			}
			if c != pr.committed || lag == 0 {
				pr.committed, pr.since = c, now
			}
			if end != pr.stable || end >= po.LastOffset {
				pr.stable, pr.stableSince = end, now
			}
			l.c.metrics.setLag(topic, po.Partition, lag, now.Sub(pr.since), now.Sub(pr.stableSince))
		}
	}
	return present
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

// groupMember is a member of the consumer group as the group's description tells it.
type groupMember struct {
	ID, ClientID, Host string
	// Topics are the topics it subscribed to, as its metadata says; nil when the metadata is in a
	// format of the consumer protocol this worker cannot read.
	Topics []string
	// Assigned are the partitions the group's leader gave it, by topic.
	Assigned map[string][]int32
}

// groupDescription is what a DescribeGroups of the consumer group says of it.
type groupDescription struct {
	State   string // Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
	Members []groupMember
}

// describe asks the group's coordinator for the group's description: one request. The members'
// metadata and assignments are decoded with franz-go's kmsg, which reads every version of the
// consumer protocol (kafka-go's DescribeGroups refuses the whole group when one member's metadata
// is of a version it does not know, as that of a newer Java or franz-go client is).
func (l *lagReporter) describe(ctx context.Context) (groupDescription, error) {
	ctx, cancel := context.WithTimeout(ctx, l.client.Timeout)
	defer cancel()
	msg, err := l.c.transport.RoundTrip(ctx, l.client.Addr, &describegroups.Request{Groups: []string{l.c.config.GroupID}})
	if err != nil {
		return groupDescription{}, fmt.Errorf("describe the group: %w", err)
	}
	resp, ok := msg.(*describegroups.Response)
	if !ok || len(resp.Groups) != 1 {
		return groupDescription{}, fmt.Errorf("describe the group: unexpected answer %T", msg)
	}
	g := resp.Groups[0]
	if g.ErrorCode != 0 {
		return groupDescription{}, fmt.Errorf("describe the group: %w", kafka.Error(g.ErrorCode))
	}
	d := groupDescription{State: g.GroupState}
	for _, m := range g.Members {
		member := groupMember{ID: m.MemberID, ClientID: m.ClientID, Host: memberHost(m.ClientHost), Assigned: map[string][]int32{}}
		var meta kmsg.ConsumerMemberMetadata
		if len(m.MemberMetadata) > 0 && meta.ReadFrom(m.MemberMetadata) == nil {
			member.Topics = meta.Topics
		}
		var assignment kmsg.ConsumerMemberAssignment
		if len(m.MemberAssignment) > 0 && assignment.ReadFrom(m.MemberAssignment) == nil {
			for _, t := range assignment.Topics {
				member.Assigned[t.Topic] = t.Partitions
			}
		}
		d.Members = append(d.Members, member)
	}
	return d, nil
}

// owner is who holds a partition: the labels of its inboxworker_partition_owner series.
type owner struct {
	memberID, clientID, host string
}

// setOwners sets the partition_owner gauge from the group's description: a series at 1 for each
// partition of the consumed topics that a member holds, naming it. While the group is not stable
// the coordinator does not say who holds what, and no partition has an owner series.
func (l *lagReporter) setOwners(g groupDescription) {
	now := make(map[topicPartition]owner)
	if g.State == "Stable" {
		consumed := make(map[string]bool)
		for _, t := range l.c.topics() {
			consumed[t] = true
		}
		for _, m := range g.Members {
			for topic, ps := range m.Assigned {
				for _, p := range ps {
					if consumed[topic] {
						now[topicPartition{topic, int(p)}] = owner{m.ID, m.ClientID, m.Host}
					}
				}
			}
		}
	}
	for tp, o := range l.owners {
		if now[tp] != o {
			l.c.metrics.deleteOwner(tp.topic, tp.partition, o)
		}
	}
	for tp, o := range now {
		l.c.metrics.setOwner(tp.topic, tp.partition, o)
	}
	l.owners = now
}

// Why a member holds no partition, as idleMembers tells from the group's description.
const (
	// idleAssignedNone: the leader assigned it nothing, though partitions are free or held by
	// workers (a leader that cannot read its metadata, a rebalance that went wrong).
	idleAssignedNone = iota
	// idleForeign: members of another client hold the partitions.
	idleForeign
	// idleTooMany: the group has more members than partitions, all held by workers.
	idleTooMany
)

// idleMembers tells why member holds no partition of topics, from the group's description d, and
// returns the group's members as log attributes.
func idleMembers(d groupDescription, member, clientID string, topics []string) (int, []any) {
	consumed := make(map[string]bool)
	for _, t := range topics {
		consumed[t] = true
	}
	var foreign []string
	held, holders := 0, 0
	var members []any
	for _, m := range d.Members {
		n := 0
		var parts []string
		for topic, ps := range m.Assigned {
			if consumed[topic] {
				n += len(ps)
				parts = append(parts, fmt.Sprintf("%s%v", topic, ps))
			}
		}
		held += n
		if n > 0 {
			holders++
		}
		if n > 0 && m.ClientID != clientID {
			foreign = append(foreign, m.ClientID)
		}
		slices.Sort(parts)
		members = append(members, slog.Group("member_"+strconv.Itoa(len(members)), "member_id", m.ID,
			"client_id", m.ClientID, "host", m.Host, "this", m.ID == member, "partitions", strings.Join(parts, " ")))
	}
	attrs := append([]any{"group_state", d.State, "members", len(d.Members), "partitions_held", held}, members...)
	switch {
	case len(foreign) > 0:
		slices.Sort(foreign)
		return idleForeign, append(attrs, "foreign_client_ids", strings.Join(slices.Compact(foreign), ","))
	case holders > 0 && len(d.Members) > held:
		return idleTooMany, attrs
	}
	return idleAssignedNone, attrs
}

// warnIdle runs in a generation that gave member no partition: if the generation still runs a
// session timeout later (a rebalance would have ended it by then), it describes the group and
// logs why the member holds none, with the group's members. It returns once the generation ends,
// as kafka-go ends a generation when a function it started returns.
func (l *lagReporter) warnIdle(genCtx context.Context, member string) {
	defer func() { <-genCtx.Done() }()
	t := time.NewTimer(l.c.config.SessionTimeout)
	defer t.Stop()
	select {
	case <-genCtx.Done():
		return
	case <-t.C:
	}
	d, err := l.describe(genCtx)
	switch {
	case genCtx.Err() != nil:
		return // rebalanced meanwhile
	case err != nil:
		l.c.log.WarnContext(genCtx, "holding no partitions, and cannot describe the group to say why",
			"member", member, "error", err)
		return
	}
	why, attrs := idleMembers(d, member, l.c.config.ClientID, l.c.topics())
	attrs = append([]any{"member", member}, attrs...)
	switch why {
	case idleForeign:
		l.c.log.WarnContext(genCtx, "holding no partitions: members of another client hold them", attrs...)
	case idleTooMany:
		l.c.log.InfoContext(genCtx, "holding no partitions: the group has more members than the topics have partitions", attrs...)
	default:
		l.c.log.WarnContext(genCtx, "holding no partitions: the group's leader assigned this member none", attrs...)
	}
}

// memberHost is the address of a member's host as a group's description gives it, without the
// leading slash Kafka writes and without the port of the member's connection, which changes at each
// reconnection and names no instance: "/10.0.0.7" and "10.0.0.7:56662" are "10.0.0.7".
func memberHost(clientHost string) string {
	h := strings.TrimPrefix(clientHost, "/")
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}
