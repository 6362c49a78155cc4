package kafkatest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProduceReadCommit(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, 2, "t")
	var msgs []kafka.Message
	for i := range 10 {
		msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
	}
	c.Produce(t, "t", msgs...)
	total := len(c.ReadAll(t, "t", 0)) + len(c.ReadAll(t, "t", 1))
	if total != 10 {
		t.Fatalf("read %d messages, want 10", total)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: "g", Brokers: []string{c.Addr}, Topics: []string{"t"},
		SessionTimeout: time.Second, HeartbeatInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	gen, err := group.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{"t": {0: 3}}); err != nil {
		t.Fatal(err)
	}
	if got := c.CommittedOffset(t, "g", "t", 0); got != 3 {
		t.Fatalf("committed offset = %d, want 3", got)
	}
}
