package kafkatest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
)

// TestKafka41MatchesKversion holds the floor's table to franz-go's record of Kafka 4.1.0's broker
// versions, minimum and maximum of every key (Produce listed from 0, as 4.1 advertises it).
func TestKafka41MatchesKversion(t *testing.T) {
	t.Parallel()
	resp := kmsg.NewPtrApiVersionsResponse()
	for key := range int16(1000) {
		r, ok := kafkatest.Kafka41(key)
		if !ok {
			continue
		}
		if key == 0 {
			r.Min = 0 // KAFKA-18659
		}
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = key, r.Min, r.Max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	if got, want := kversion.FromApiVersionsResponse(resp), kversion.V4_1_0(); !got.Equal(want) {
		t.Errorf("the floor's table differs from kversion.V4_1_0:\n%s\nwant\n%s", got, want)
	}
	for key, want := range map[int16]string{0: "3–13", 1: "4–18", 2: "1–10", 8: "2–9", 9: "1–9", 11: "0–9",
		19: "2–7", 20: "1–6", 22: "0–5", 32: "1–4", 12: "0–4", 13: "0–5", 14: "0–5", 10: "0–6"} {
		if r, _ := kafkatest.Kafka41(key); r.String() != want {
			t.Errorf("%s: %s, want %s", kmsg.NameForKey(key), r, want)
		}
	}
}

// TestFloorPassesKafkaGo runs kafka-go's producer, reader and consumer group through the floor:
// every request is inside 4.1's versions and recorded with its client ID.
func TestFloorPassesKafkaGo(t *testing.T) {
	t.Parallel()
	c := kafkatest.StartKafka41(t, 2, "t")
	c.Produce(t, "t", kafka.Message{Key: []byte("k"), Value: []byte("v")})
	if n := len(c.ReadAll(t, "t", 0)) + len(c.ReadAll(t, "t", 1)); n != 1 {
		t.Fatalf("read %d messages, want 1", n)
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: "g", Brokers: []string{c.Addr}, Topics: []string{"t"},
		Dialer:         &kafka.Dialer{ClientID: "floor-test", Timeout: 10 * time.Second},
		SessionTimeout: time.Second, HeartbeatInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gen, err := group.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{"t": {0: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := c.CommittedOffset(t, "g", "t", 0); got != 1 {
		t.Errorf("committed offset %d, want 1", got)
	}
	served := c.Floor.Served()
	t.Logf("requests served:\n%s", kafkatest.VersionTable(served))
	for _, want := range []kafkatest.Request{
		{ClientID: "floor-test", Key: 11, Version: 2}, // JoinGroup, hard-coded by kafka-go
		{ClientID: "floor-test", Key: 8, Version: 2},  // OffsetCommit, on 4.1's floor
	} {
		if !slices.Contains(served, want) {
			t.Errorf("%+v not among the requests served:\n%s", want, kafkatest.VersionTable(served))
		}
	}
	if outside := c.Floor.Outside(); len(outside) > 0 {
		t.Errorf("requests outside 4.1's versions: %v", outside)
	}
}

// errorsTB records the errors reported to it instead of failing the test.
type errorsTB struct {
	testing.TB
	errors []string
}

func (tb *errorsTB) Errorf(format string, args ...any) {
	tb.errors = append(tb.errors, fmt.Sprintf(format, args...))
}

// TestFloorRefusesWhat41Refuses sends requests as a client of an older Kafka would: a Fetch of
// version 3 has its connection closed, an ApiVersions of version 5 is answered UNSUPPORTED_VERSION
// with ApiVersions' range and the connection kept (KIP-511's negotiation, which a client newer than
// the broker goes through: not outside); version 3 then lists 4.1's ranges. When the test ends, the
// floor reports the Fetch outside 4.1's versions, with the table.
func TestFloorRefusesWhat41Refuses(t *testing.T) {
	t.Parallel()
	reported := &errorsTB{TB: t}
	t.Cleanup(func() { // runs after the floor's own cleanup
		if len(reported.errors) != 1 || !strings.Contains(reported.errors[0], "| Fetch | 1 | 3 (outside) | old-client | 4–18 |") ||
			!strings.Contains(reported.errors[0], "| ApiVersions | 18 | 3, 5 (negotiated) | old-client | 0–4 |") {
			t.Errorf("the floor reported %q; want the Fetch v3 outside 4.1's versions, and ApiVersions v5 served, in a table", reported.errors)
		}
	})
	c := kafkatest.StartKafka41(reported, 1, "t")

	conn := dial(t, c.Addr)
	fetch := kmsg.NewPtrFetchRequest()
	fetch.SetVersion(3)
	send(t, conn, 1, fetch)
	if _, err := readFrame(conn); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Fetch v3: read %v, want the connection closed", err)
	}

	conn = dial(t, c.Addr)
	versions := kmsg.NewPtrApiVersionsRequest()
	versions.SetVersion(5)
	send(t, conn, 2, versions)
	resp := kmsg.NewPtrApiVersionsResponse() // version 0
	receive(t, conn, 2, resp)
	if resp.ErrorCode != 35 || len(resp.ApiKeys) != 1 || resp.ApiKeys[0].ApiKey != 18 || resp.ApiKeys[0].MaxVersion != 4 {
		t.Errorf("ApiVersions v5: error %d, keys %+v; want 35 with ApiVersions 0–4", resp.ErrorCode, resp.ApiKeys)
	}

	versions.SetVersion(3)
	versions.ClientSoftwareName, versions.ClientSoftwareVersion = "old-client", "1"
	send(t, conn, 3, versions)
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(3)
	receive(t, conn, 3, resp)
	advertised := map[int16]string{}
	for _, k := range resp.ApiKeys {
		advertised[k.ApiKey] = fmt.Sprintf("%d–%d", k.MinVersion, k.MaxVersion)
		if r, ok := kafkatest.Kafka41(k.ApiKey); !ok || k.MaxVersion > r.Max || (k.ApiKey != 0 && k.MinVersion < r.Min) {
			t.Errorf("ApiVersions lists %s %d–%d; 4.1 serves %v", kmsg.NameForKey(k.ApiKey), k.MinVersion, k.MaxVersion, r)
		}
	}
	for key, want := range map[int16]string{0: "0–13", 1: "4–18", 2: "1–10", 8: "2–9", 9: "1–9", 11: "0–9", 19: "2–7"} {
		if advertised[key] != want {
			t.Errorf("ApiVersions lists %s %q, want %s", kmsg.NameForKey(key), advertised[key], want)
		}
	}
}

// TestFloorRefuse refuses OffsetCommit on demand: with an error code, the client gets that error;
// with the connection closed, a connection error; once allowed again, the commit goes through.
func TestFloorRefuse(t *testing.T) {
	t.Parallel()
	c := kafkatest.StartKafka41(t, 1, "t")
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: "g", Brokers: []string{c.Addr}, Topics: []string{"t"},
		SessionTimeout: time.Second, HeartbeatInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gen, err := group.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	offsets := map[string]map[int]int64{"t": {0: 1}}

	c.Floor.Refuse(8, kafkatest.CommitError(30))
	if err := gen.CommitOffsets(offsets); !errors.Is(err, kafka.GroupAuthorizationFailed) {
		t.Errorf("commit refused with 30: %v, want Group Authorization Failed", err)
	}
	c.Floor.Refuse(8, nil)
	if err := gen.CommitOffsets(offsets); err == nil {
		t.Error("commit refused by a closed connection: no error")
	}
	c.Floor.Allow(8)
	if got := c.CommittedOffset(t, "g", "t", 0); got != -1 {
		t.Errorf("committed offset %d after refusals, want none", got)
	}
	// kafka-go's group may need a new generation after its connection was closed.
	for attempt := 0; ; attempt++ {
		if err = gen.CommitOffsets(offsets); err == nil || attempt == 3 {
			break
		}
		if gen, err = group.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err != nil {
		t.Fatalf("commit once allowed: %v", err)
	}
	if got := c.CommittedOffset(t, "g", "t", 0); got != 1 {
		t.Errorf("committed offset %d once allowed, want 1", got)
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	return conn
}

// send writes req with a request header carrying corr and the client ID "old-client".
func send(t *testing.T, conn net.Conn, corr int32, req kmsg.Request) {
	t.Helper()
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, uint16(len("old-client")))
	b = append(b, "old-client"...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

// receive reads the response to corr into resp (ApiVersions: no header tags).
func receive(t *testing.T, conn net.Conn, corr int32, resp kmsg.Response) {
	t.Helper()
	frame, err := readFrame(conn)
	if err != nil {
		t.Fatal(err)
	}
	if got := int32(binary.BigEndian.Uint32(frame[:4])); got != corr {
		t.Fatalf("correlation ID %d, want %d", got, corr)
	}
	if err := resp.ReadFrom(frame[4:]); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads one response frame without its size.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	frame := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(r, frame)
	return frame, err
}
