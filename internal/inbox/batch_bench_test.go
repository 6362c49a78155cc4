package inbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// benchBatchSize is the consumer's default batch size.
const benchBatchSize = 256

// noopBatch is a batch effect that does nothing.
func noopBatch(_ context.Context, _ pgx.Tx, claimed []int) []error {
	return make([]error, len(claimed))
}

// BenchmarkProcessBatch processes batches of new messages one after another: one claim statement
// for the batch, an effect that does nothing, committed. Compare its msgs/s with BenchmarkProcess's.
func BenchmarkProcessBatch(b *testing.B) {
	e := setup(b, inbox.Config{})
	ctx := context.Background()
	msgs := make([]inbox.Message, benchBatchSize)
	for i := range msgs {
		msgs[i] = message("k")
	}
	b.ReportAllocs()
	next := 0
	for b.Loop() {
		for i := range msgs {
			next++
			msgs[i].Key = strconv.Itoa(next)
		}
		outcomes, err := e.store.ProcessBatch(ctx, msgs, noopBatch)
		if err != nil || outcomes[len(outcomes)-1] != inbox.Applied {
			b.Fatalf("ProcessBatch = %v, %v", outcomes, err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatchSize)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkProcessBatchDuplicate processes one batch over and over: the cost of a redelivered batch
// (a claim that conflicts on every key and a read of the stored fingerprints).
func BenchmarkProcessBatchDuplicate(b *testing.B) {
	e := setup(b, inbox.Config{})
	ctx := context.Background()
	msgs := make([]inbox.Message, benchBatchSize)
	for i := range msgs {
		msgs[i] = message(strconv.Itoa(i))
	}
	if _, err := e.store.ProcessBatch(ctx, msgs, noopBatch); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		outcomes, err := e.store.ProcessBatch(ctx, msgs, noopBatch)
		if err != nil || outcomes[0] != inbox.Duplicate {
			b.Fatalf("ProcessBatch = %v, %v", outcomes, err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatchSize)/b.Elapsed().Seconds(), "msgs/s")
}
