package inbox_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// BenchmarkProcess processes new messages one after another: a claim and an effect that does
// nothing, committed. It measures the inbox's own cost per message: one transaction, one insert.
func BenchmarkProcess(b *testing.B) {
	e := setup(b, inbox.Config{})
	noop := func(context.Context, pgx.Tx) error { return nil }
	benchNewMessages(b, func(ctx context.Context, msg inbox.Message) (inbox.Outcome, error) {
		return e.store.Process(ctx, msg, noop)
	})
}

// benchNewMessages runs process for new messages, each with a key of its own, one after another,
// and reports msgs/s; every one must be applied.
func benchNewMessages(b *testing.B, process func(context.Context, inbox.Message) (inbox.Outcome, error)) {
	ctx := context.Background()
	msg := message("k")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		msg.Key = strconv.Itoa(i)
		if outcome, err := process(ctx, msg); err != nil || outcome != inbox.Applied {
			b.Fatalf("message %d: %q, %v; want applied", i, outcome, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// benchNewMessagesParallel is benchNewMessages from 4×GOMAXPROCS goroutines at once.
func benchNewMessagesParallel(b *testing.B, process func(context.Context, inbox.Message) (inbox.Outcome, error)) {
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		msg := message("k")
		for pb.Next() {
			msg.Key = strconv.FormatInt(next.Add(1), 10)
			if outcome, err := process(ctx, msg); err != nil || outcome != inbox.Applied {
				b.Errorf("message %s: %q, %v; want applied", msg.Key, outcome, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkProcessParallel is BenchmarkProcess from 4×GOMAXPROCS goroutines at once, each message
// still its own transaction: the inbox's throughput when commits overlap, as with several
// partitions in flight.
func BenchmarkProcessParallel(b *testing.B) {
	e := setup(b, inbox.Config{})
	noop := func(context.Context, pgx.Tx) error { return nil }
	benchNewMessagesParallel(b, func(ctx context.Context, msg inbox.Message) (inbox.Outcome, error) {
		return e.store.Process(ctx, msg, noop)
	})
}

// BenchmarkProcessDuplicate processes one message over and over: the cost of a redelivery.
func BenchmarkProcessDuplicate(b *testing.B) {
	e := setup(b, inbox.Config{})
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	msg := message("k")
	if _, err := e.store.Process(ctx, msg, noop); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if outcome, err := e.store.Process(ctx, msg, noop); err != nil || outcome != inbox.Duplicate {
			b.Fatalf("Process = %q, %v", outcome, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
