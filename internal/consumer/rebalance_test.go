package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// slowRecorder records like recorder, taking a moment per message so that rebalances happen while
// messages are in flight.
type slowRecorder struct{ recorder }

func (h *slowRecorder) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	time.Sleep(2 * time.Millisecond)
	return h.recorder.Handle(ctx, tx, d)
}

func (h *slowRecorder) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	return handleEach(ctx, tx, ds, h.Handle)
}

// TestRebalance runs two consumers in one group over a stream: the second joins mid-stream (taking
// partitions from the first while it works) and leaves mid-stream (handing them back). Nothing may
// be lost and no effect doubled. Run with -v to see how long each rebalance took (rebalance=…).
func TestRebalance(t *testing.T) {
	t.Parallel()
	forEachMode(t, testRebalance)
}

func testRebalance(t *testing.T, mode testMode) {
	e := setup(t, mode, 4)
	all := keys("r", 400)
	e.produce(all...)

	first, _ := e.start(e.config(&slowRecorder{}))
	e.waitFor("a quarter applied", func() bool { return len(e.effects()) >= len(all)/4 })

	second, stopSecond := e.start(e.config(&slowRecorder{}))
	e.waitFor("the second consumer to join", second.Ready)
	e.waitFor("half applied", func() bool { return len(e.effects()) >= len(all)/2 })

	stopped := time.Now()
	stopSecond()
	t.Logf("the second consumer left in %s", time.Since(stopped).Round(time.Millisecond))
	if second.Ready() {
		t.Error("Ready() = true after Run returned")
	}

	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	if !first.Ready() {
		t.Error("the first consumer is not ready")
	}
	checkOnce(t, e, all)
}
