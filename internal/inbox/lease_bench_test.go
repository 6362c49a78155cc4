package inbox_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// noopCall is a call that returns at once and records nothing but the key.
var noopCall = inbox.Call{Lease: testLease, Run: func(context.Context, int) (inbox.Effect, error) {
	return func(context.Context, pgx.Tx) error { return nil }, nil
}}

// BenchmarkProcessCall runs new messages' calls one after another: the claim's transaction (the
// lease) and the completion's (the inbox row, the lease's release), with a call that takes no time.
// It measures what the three steps cost the database per message; BenchmarkProcess is the cost of
// one transaction.
func BenchmarkProcessCall(b *testing.B) {
	e := setup(b, inbox.Config{})
	ctx := context.Background()
	msg := message("k")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		msg.Key = strconv.Itoa(i)
		if outcome, err := e.store.ProcessCall(ctx, msg, noopCall); err != nil || outcome != inbox.Applied {
			b.Fatalf("ProcessCall = %q, %v", outcome, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkProcessCallParallel is BenchmarkProcessCall from 4×GOMAXPROCS goroutines on a pool of
// 4 connections, as many calls of a worker complete at once.
func BenchmarkProcessCallParallel(b *testing.B) {
	e := setup(b, inbox.Config{})
	pool, _ := e.newPool(b, 4, nil)
	store := e.newStore(b, pool, inbox.Config{})
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		msg := message("k")
		for pb.Next() {
			msg.Key = strconv.FormatInt(next.Add(1), 10)
			if outcome, err := store.ProcessCall(ctx, msg, noopCall); err != nil || outcome != inbox.Applied {
				b.Errorf("ProcessCall = %q, %v", outcome, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
