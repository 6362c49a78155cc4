package consumer_test

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// foreignClient is the client id of the foreign member of the tests.
const foreignClient = "billing-exporter"

// joinForeign makes a member of the test group that is not a worker: another application's
// consumer, with the client id foreignClient, whose subscription metadata kafka-go cannot read (it
// is of the consumer protocol's version 3, as newer Java and franz-go clients send). It joins
// first, so that it leads the group, assigns every partition to itself and none to the others,
// heartbeats, rejoins on every rebalance, and never reads a message: a member that does not
// consume. It speaks the group protocol through franz-go's raw requests (kafka-go's Client reads
// a heartbeat's answer with its error code and throttle time swapped).
func joinForeign(t *testing.T, broker string, partitions int) {
	t.Helper()
	client, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ClientID(foreignClient))
	if err != nil {
		t.Fatal(err)
	}
	all := make([]int32, partitions)
	for i := range all {
		all[i] = int32(i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	joined := make(chan struct{})
	var once sync.Once
	var memberID string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			gen, err := foreignGeneration(ctx, client, &memberID, all)
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			once.Do(func() { close(joined) })
			foreignHeartbeats(ctx, client, memberID, gen)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		leave := kmsg.NewPtrLeaveGroupRequest()
		leave.Group, leave.MemberID = group, memberID
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID = memberID
		leave.Members = []kmsg.LeaveGroupRequestMember{m}
		_, _ = leave.RequestWith(context.Background(), client)
		client.Close()
	})
	select {
	case <-joined:
	case <-time.After(30 * time.Second):
		t.Fatal("the foreign member did not join the group")
	}
}

// foreignGeneration joins the group as the foreign member and, as its leader, assigns it all, and
// the other members nothing. It returns the generation.
func foreignGeneration(ctx context.Context, client *kgo.Client, memberID *string, all []int32) (int32, error) {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version, meta.Topics = 3, []string{topic}
	owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
	owned.Topic, owned.Partitions = topic, all
	meta.OwnedPartitions = []kmsg.ConsumerMemberMetadataOwnedPartition{owned}
	proto := kmsg.NewJoinGroupRequestProtocol()
	proto.Name, proto.Metadata = "range", meta.AppendTo(nil)
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = group, 6000, 6000
	join.ProtocolType, join.Protocols = "consumer", []kmsg.JoinGroupRequestProtocol{proto}
	var resp *kmsg.JoinGroupResponse
	for {
		join.MemberID = *memberID
		var err error
		if resp, err = join.RequestWith(ctx, client); err != nil {
			return 0, err
		}
		*memberID = resp.MemberID
		if resp.ErrorCode != kerr.MemberIDRequired.Code {
			break
		}
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, err
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID = group, resp.Generation, resp.MemberID
	sync.ProtocolType, sync.Protocol = resp.ProtocolType, resp.Protocol
	if resp.LeaderID == resp.MemberID {
		for _, m := range resp.Members {
			assignment := kmsg.NewConsumerMemberAssignment()
			if m.MemberID == resp.MemberID {
				t := kmsg.NewConsumerMemberAssignmentTopic()
				t.Topic, t.Partitions = topic, all
				assignment.Topics = []kmsg.ConsumerMemberAssignmentTopic{t}
			}
			a := kmsg.NewSyncGroupRequestGroupAssignment()
			a.MemberID, a.MemberAssignment = m.MemberID, assignment.AppendTo(nil)
			sync.GroupAssignment = append(sync.GroupAssignment, a)
		}
	}
	synced, err := sync.RequestWith(ctx, client)
	if err == nil {
		err = kerr.ErrorForCode(synced.ErrorCode)
	}
	return resp.Generation, err
}

// foreignHeartbeats heartbeats the generation until the group rebalances or ctx is done.
func foreignHeartbeats(ctx context.Context, client *kgo.Client, memberID string, gen int32) {
	for ctx.Err() == nil {
		hb := kmsg.NewPtrHeartbeatRequest()
		hb.Group, hb.Generation, hb.MemberID = group, gen, memberID
		resp, err := hb.RequestWith(ctx, client)
		if err != nil || resp.ErrorCode != 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestHoldingNoPartitions runs a consumer in a group whose leader, another application's
// consumer, keeps every partition for itself: the consumer says so in a warning naming the members
// and their client ids, its assigned_partitions gauge stays at 0 (from before it joins), and the
// partition_owner gauge names the foreign member as the holder of every partition.
func TestHoldingNoPartitions(t *testing.T) {
	t.Parallel()
	const partitions = 3
	e := setup(t, testMode{tx: consumer.PerBatch}, partitions)
	joinForeign(t, e.kafka.Addr, partitions)

	config := e.config(&recorder{})
	config.LagInterval = 50 * time.Millisecond
	reg := prometheus.NewRegistry()
	config.Metrics = consumer.NewMetrics(reg)
	if got := testutil.ToFloat64(config.Metrics.Assigned.WithLabelValues(topic)); got != 0 {
		t.Errorf("assigned_partitions before the consumer runs: %v, want 0", got)
	}
	e.start(config)

	warning := e.waitLog("a warning that the consumer holds no partitions", func(r testlog.Record) bool {
		return r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "holding no partitions")
	})
	if warning.Message != "holding no partitions: members of another client hold them" ||
		warning.Attrs["foreign_client_ids"].String() != foreignClient {
		t.Errorf("the warning %q, %v does not name the foreign client", warning.Message, warning.Attrs)
	}
	var clients []string
	for k, v := range warning.Attrs {
		if strings.HasSuffix(k, ".client_id") {
			clients = append(clients, v.String())
		}
	}
	slices.Sort(clients)
	if !slices.Equal(clients, []string{foreignClient, "inboxworker"}) {
		t.Errorf("the warning names the members' clients %v, want %s and inboxworker: %v", clients, foreignClient, warning.Attrs)
	}
	if got := testutil.ToFloat64(config.Metrics.Assigned.WithLabelValues(topic)); got != 0 {
		t.Errorf("assigned_partitions: %v, want 0", got)
	}
	e.waitFor("every partition's owner to be the foreign member", func() bool {
		owners := owners(t, reg)
		return len(owners) == partitions && !slices.ContainsFunc(slices.Collect(maps.Values(owners)),
			func(o map[string]string) bool { return o["client_id"] != foreignClient || o["member_id"] == "" })
	})
}

// TestPartitionOwner checks that the partition_owner gauge names the member holding each
// partition, with its client id and host, and follows a rebalance: two consumers share the
// partitions, then one stops and the other holds them all.
func TestPartitionOwner(t *testing.T) {
	t.Parallel()
	const partitions = 4
	e := setup(t, testMode{tx: consumer.PerBatch}, partitions)
	var regs []*prometheus.Registry
	var metrics []*consumer.Metrics
	var stops []func()
	for range 2 {
		config := e.config(&recorder{})
		config.LagInterval = 50 * time.Millisecond
		reg := prometheus.NewRegistry()
		config.Metrics = consumer.NewMetrics(reg)
		_, stop := e.start(config)
		regs, metrics, stops = append(regs, reg), append(metrics, config.Metrics), append(stops, stop)
	}
	assigned := func(i int) float64 { return testutil.ToFloat64(metrics[i].Assigned.WithLabelValues(topic)) }
	members := func(owners map[int]map[string]string) map[string]int {
		out := map[string]int{}
		for _, o := range owners {
			if o["client_id"] != "inboxworker" || o["host"] == "" {
				return nil
			}
			out[o["member_id"]]++
		}
		return out
	}
	e.waitFor("both consumers to hold two partitions each, by the owner gauge of both", func() bool {
		for _, reg := range regs {
			o := owners(t, reg)
			if m := members(o); len(o) != partitions || len(m) != 2 {
				return false
			}
		}
		return assigned(0) == 2 && assigned(1) == 2
	})
	stops[0]()
	e.waitFor("the other consumer to hold them all", func() bool {
		o := owners(t, regs[1])
		return len(o) == partitions && len(members(o)) == 1 && assigned(1) == partitions
	})
}

// waitLog waits for a record of e's logs that matches, and returns it.
func (e *env) waitLog(what string, matches func(testlog.Record) bool) testlog.Record {
	e.t.Helper()
	var found testlog.Record
	e.waitFor(what, func() bool {
		i := slices.IndexFunc(e.logs.All(), matches)
		if i >= 0 {
			found = e.logs.All()[i]
		}
		return i >= 0
	})
	return found
}

// owners returns the labels of the partition_owner series of topic in reg, by partition.
func owners(t *testing.T, reg *prometheus.Registry) map[int]map[string]string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]map[string]string{}
	for _, f := range families {
		if f.GetName() != "inboxworker_partition_owner" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] != topic || m.GetGauge().GetValue() != 1 {
				continue
			}
			p, _ := strconv.Atoi(labels["partition"])
			if _, twice := out[p]; twice {
				t.Errorf("partition %d has two owner series", p)
			}
			out[p] = labels
		}
	}
	return out
}
