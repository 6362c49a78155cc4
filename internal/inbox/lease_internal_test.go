package inbox

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// BenchmarkClaim measures step 1 of ProcessCall alone, a claim transaction that takes a new key's
// lease, with the claim's commit waiting for its WAL flush (synchronous_commit=on) and not (off, as
// the worker runs it): one after another, and from 16 goroutines on 8 connections, where commits that
// wait share flushes.
func BenchmarkClaim(b *testing.B) {
	for _, commit := range []string{"on", "off"} {
		for _, parallel := range []bool{false, true} {
			name := "synchronous_commit=" + commit
			if parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				defer func(was string) { leaseSynchronousCommit = was }(leaseSynchronousCommit)
				leaseSynchronousCommit = commit
				db := pgtest.Schema(b)
				store, err := NewStore(db.Pool, Config{})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				call := Call{Lease: time.Minute}
				var next atomic.Int64
				claim := func() {
					msg := Message{Handler: "h", Key: strconv.FormatInt(next.Add(1), 10)}
					if outcome, err := store.lease(ctx, &lease{msg: msg, holder: "bench"}, call); err != nil || outcome != "" {
						b.Errorf("lease = %q, %v", outcome, err)
					}
				}
				if !parallel {
					for b.Loop() {
						claim()
					}
				} else {
					b.SetParallelism(8)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							claim()
						}
					})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
			})
		}
	}
}
