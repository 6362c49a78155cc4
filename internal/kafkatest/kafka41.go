package kafkatest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// VersionRange is the versions of one API's request a broker accepts, both ends included.
type VersionRange struct{ Min, Max int16 }

func (r VersionRange) String() string {
	if r.Min == r.Max {
		return fmt.Sprint(r.Min)
	}
	return fmt.Sprintf("%d–%d", r.Min, r.Max)
}

// produceKey is Produce's API key: the one API whose advertised range differs from its served one.
const produceKey = 0

// kafka41 is what an Apache Kafka 4.1.0 broker listener serves, by API key: the validVersions of
// each request schema in clients/src/main/resources/common/message/*Request.json at the 4.1.0 tag,
// less the versions that release marks latestVersionUnstable (OffsetCommit 10, OffsetFetch 10,
// InitProducerId 6, ...), which a broker advertises only with unstable.api.versions.enable.
//
// The floors are KIP-896's (Kafka 4.0 removed every version older than Kafka 2.1: Produce 0–2,
// Fetch 0–3, ListOffsets 0, OffsetCommit 0–1, OffsetFetch 0, CreateTopics 0–1, DeleteTopics 0,
// DescribeConfigs 0, OffsetForLeaderEpoch 0–1, the ACL and delegation-token APIs' 0, ...), with
// JoinGroup 0–1 put back in 4.0.1 and 4.1.0 (KAFKA-19444), and the share-group APIs released at 1.
// The same table, key by key with the commit of each change, is franz-go's kversion.V4_1_0 (pkg/kversion/requests.go,
// releases b40 and b41); TestKafka41MatchesKversion holds this one to it.
//
// Produce alone is advertised from 0 although 0–2 are refused: librdkafka needs the 0 in the
// ApiVersions answer (KAFKA-18659, ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION).
var kafka41 = map[int16]VersionRange{
	0:  {3, 13}, // Produce
	1:  {4, 18}, // Fetch
	2:  {1, 10}, // ListOffsets
	3:  {0, 13}, // Metadata
	8:  {2, 9},  // OffsetCommit
	9:  {1, 9},  // OffsetFetch
	10: {0, 6},  // FindCoordinator
	11: {0, 9},  // JoinGroup
	12: {0, 4},  // Heartbeat
	13: {0, 5},  // LeaveGroup
	14: {0, 5},  // SyncGroup
	15: {0, 6},  // DescribeGroups
	16: {0, 5},  // ListGroups
	17: {0, 1},  // SaslHandshake
	18: {0, 4},  // ApiVersions
	19: {2, 7},  // CreateTopics
	20: {1, 6},  // DeleteTopics
	21: {0, 2},  // DeleteRecords
	22: {0, 5},  // InitProducerId
	23: {2, 4},  // OffsetForLeaderEpoch
	24: {0, 5},  // AddPartitionsToTxn
	25: {0, 4},  // AddOffsetsToTxn
	26: {0, 5},  // EndTxn
	27: {1, 1},  // WriteTxnMarkers
	28: {0, 5},  // TxnOffsetCommit
	29: {1, 3},  // DescribeAcls
	30: {1, 3},  // CreateAcls
	31: {1, 3},  // DeleteAcls
	32: {1, 4},  // DescribeConfigs
	33: {0, 2},  // AlterConfigs
	34: {1, 2},  // AlterReplicaLogDirs
	35: {1, 4},  // DescribeLogDirs
	36: {0, 2},  // SaslAuthenticate
	37: {0, 3},  // CreatePartitions
	38: {1, 3},  // CreateDelegationToken
	39: {1, 2},  // RenewDelegationToken
	40: {1, 2},  // ExpireDelegationToken
	41: {1, 3},  // DescribeDelegationToken
	42: {0, 2},  // DeleteGroups
	43: {0, 2},  // ElectLeaders
	44: {0, 1},  // IncrementalAlterConfigs
	45: {0, 1},  // AlterPartitionReassignments
	46: {0, 0},  // ListPartitionReassignments
	47: {0, 0},  // OffsetDelete
	48: {0, 1},  // DescribeClientQuotas
	49: {0, 1},  // AlterClientQuotas
	50: {0, 0},  // DescribeUserScramCredentials
	51: {0, 0},  // AlterUserScramCredentials
	55: {0, 2},  // DescribeQuorum
	57: {0, 2},  // UpdateFeatures
	60: {0, 2},  // DescribeCluster
	61: {0, 0},  // DescribeProducers
	64: {0, 0},  // UnregisterBroker
	65: {0, 0},  // DescribeTransactions
	66: {0, 2},  // ListTransactions
	68: {0, 1},  // ConsumerGroupHeartbeat
	69: {0, 1},  // ConsumerGroupDescribe
	71: {0, 0},  // GetTelemetrySubscriptions
	72: {0, 0},  // PushTelemetry
	74: {0, 1},  // ListConfigResources
	75: {0, 0},  // DescribeTopicPartitions
	76: {1, 1},  // ShareGroupHeartbeat
	77: {1, 1},  // ShareGroupDescribe
	78: {1, 1},  // ShareFetch
	79: {1, 1},  // ShareAcknowledge
	80: {0, 0},  // AddRaftVoter
	81: {0, 0},  // RemoveRaftVoter
	83: {0, 0},  // InitializeShareGroupState
	84: {0, 0},  // ReadShareGroupState
	85: {0, 0},  // WriteShareGroupState
	86: {0, 0},  // DeleteShareGroupState
	87: {0, 0},  // ReadShareGroupStateSummary
	90: {0, 0},  // DescribeShareGroupOffsets
	91: {0, 0},  // AlterShareGroupOffsets
	92: {0, 0},  // DeleteShareGroupOffsets
}

// Kafka41 returns the versions of the API key's request a Kafka 4.1 broker serves, and false if it
// serves none (an unknown key, or one of the controller's).
func Kafka41(key int16) (VersionRange, bool) {
	r, ok := kafka41[key]
	return r, ok
}

// advertised41 is the range a Kafka 4.1 broker lists for key in its ApiVersions answer.
func advertised41(key int16) (VersionRange, bool) {
	r, ok := kafka41[key]
	if key == produceKey {
		r.Min = 0 // KAFKA-18659
	}
	return r, ok
}

// VersionTable renders requests as a Markdown table, one row per API in key order: the versions
// sent, the client IDs that sent them, and the versions Kafka 4.1 serves. A version outside those
// is marked "(outside)"; an ApiVersions above them, a newer client's first question (KIP-511),
// "(negotiated)".
func VersionTable(reqs []Request) string {
	type row struct {
		versions []int16
		clients  []string
	}
	rows := map[int16]*row{}
	for _, r := range reqs {
		if rows[r.Key] == nil {
			rows[r.Key] = &row{}
		}
		rw := rows[r.Key]
		if !slices.Contains(rw.versions, r.Version) {
			rw.versions = append(rw.versions, r.Version)
		}
		if !slices.Contains(rw.clients, r.ClientID) {
			rw.clients = append(rw.clients, r.ClientID)
		}
	}
	var b strings.Builder
	b.WriteString("| API | key | versions sent | sent by | Kafka 4.1 serves |\n|---|---:|---|---|---|\n")
	for _, key := range slices.Sorted(maps.Keys(rows)) {
		rw := rows[key]
		slices.Sort(rw.versions)
		slices.Sort(rw.clients)
		served, ok := kafka41[key]
		var versions []string
		for _, v := range rw.versions {
			s := fmt.Sprint(v)
			switch {
			case ok && key == apiVersionsKey && v > served.Max:
				s += " (negotiated)"
			case !ok || v < served.Min || v > served.Max:
				s += " (outside)"
			}
			versions = append(versions, s)
		}
		serves := "none"
		if ok {
			serves = served.String()
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", kmsg.NameForKey(key), key, strings.Join(versions, ", "),
			strings.Join(rw.clients, ", "), serves)
	}
	return b.String()
}
