package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestSlotFreedBeforeAwait: a route with one slot, held by a message of partition 0 while partition
// 1's messages want it. The slot is freed right after partition 1 found none and before it waits:
// it must still wake and apply its messages. (It once took the slot's signal only as it began to
// wait, missed one freed in between, and, the route's last, stalled for good: TestRebalance's
// last message on a busy machine.)
func TestSlotFreedBeforeAwait(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 2)
	held, rest := onPartition(0, 1), onPartition(1, 5)
	hold := make(chan struct{})
	var holding atomic.Bool
	h := &recorder{fail: func(d inbox.Delivery) error {
		if d.Key == held[0] {
			holding.Store(true)
			<-hold
		}
		return nil
	}}
	config := e.config(h)
	config.Routes[0].Concurrency = 1
	c, err := consumer.New(config)
	if err != nil {
		t.Fatal(err)
	}
	var release sync.Once
	free := func() { release.Do(func() { close(hold) }) }
	consumer.SetBeforeAwait(c, func(partition int, wantsSlot bool, untilFree func()) {
		if partition == 1 && wantsSlot && holding.Load() {
			free()
			untilFree() // freed after partition 1 looked for a slot, before it waits for one
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		free() // a failed test never leaves the handler waiting
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// The held message first: partition 1's come while it holds the route's only slot.
	e.produceOrdered("order-"+held[0], held[0])
	e.waitFor("the first message to hold the slot", holding.Load)
	for _, k := range rest {
		e.produceOrdered("order-"+k, k)
	}
	e.waitFor("every message applied", func() bool { return len(e.effects()) == 1+len(rest) })
}

// onPartition returns n idempotency keys whose messages, keyed "order-"+key, go to partition p of
// two.
func onPartition(p, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("w%d-%d", p, i)
		if (&kafka.Hash{}).Balance(kafka.Message{Key: []byte("order-" + k)}, 0, 1) == p {
			out = append(out, k)
		}
	}
	return out
}
