package inbox_test

import (
	"context"
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
	benchNewMessages(b, func(ctx context.Context, msg inbox.Message) (inbox.Outcome, error) {
		return e.store.ProcessCall(ctx, msg, noopCall)
	})
}

// BenchmarkProcessCallParallel is BenchmarkProcessCall from 4×GOMAXPROCS goroutines on a pool of
// 4 connections, as many calls of a worker complete at once.
func BenchmarkProcessCallParallel(b *testing.B) {
	e := setup(b, inbox.Config{})
	pool, _ := e.newPool(b, 4, nil)
	store := e.newStore(b, pool, inbox.Config{})
	benchNewMessagesParallel(b, func(ctx context.Context, msg inbox.Message) (inbox.Outcome, error) {
		return store.ProcessCall(ctx, msg, noopCall)
	})
}
