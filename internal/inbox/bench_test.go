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
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	msg := message("k")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		msg.Key = strconv.Itoa(i)
		if outcome, err := e.store.Process(ctx, msg, noop); err != nil || outcome != inbox.Applied {
			b.Fatalf("Process = %q, %v", outcome, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkProcessParallel is BenchmarkProcess from 4×GOMAXPROCS goroutines at once, each message
// still its own transaction: the inbox's throughput when commits overlap, as with several
// partitions in flight.
func BenchmarkProcessParallel(b *testing.B) {
	e := setup(b, inbox.Config{})
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	var next atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		msg := message("k")
		for pb.Next() {
			msg.Key = strconv.FormatInt(next.Add(1), 10)
			if outcome, err := e.store.Process(ctx, msg, noop); err != nil || outcome != inbox.Applied {
				b.Errorf("Process = %q, %v", outcome, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
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
