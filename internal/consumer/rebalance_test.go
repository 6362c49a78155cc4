package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/poll"
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
	rebalance(t, setup(t, mode, 4))
}

// rebalance runs the stream of TestRebalance through e.
func rebalance(t *testing.T, e *env) {
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

	poll.Until(t, func() string {
		if e.committed() == int64(len(all)) {
			return ""
		}
		return fmt.Sprintf("waiting for all offsets committed: %s; %d of %d applied", e.committedOffsets(),
			len(e.effects()), len(all))
	})
	// The first consumer may be joining the generation the second one's leaving started.
	e.waitFor("the first consumer ready", first.Ready)
	checkOnce(t, e, all)
}

// TestRebalanceCommitsFinishedOnly runs TestRebalance's stream while checking, before every offset
// commit, that every message below the offset is finished: its inbox row committed. Messages of
// different keys finish out of order; none may be committed over.
func TestRebalanceCommitsFinishedOnly(t *testing.T) {
	t.Parallel()
	for _, mode := range []testMode{{consumer.PerMessage, consumer.ByKey}, {consumer.PerBatch, consumer.ByKey}} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode, 4)
			var commits atomic.Int64
			e.beforeOffsetCommit = func(topic string, partition int, offset int64) {
				commits.Add(1)
				var finished int64
				err := e.db.Pool.QueryRow(context.Background(), `
					SELECT count(DISTINCT "offset") FROM inbox WHERE topic = $1 AND "partition" = $2 AND "offset" < $3`,
					topic, partition, offset).Scan(&finished)
				if err != nil {
					t.Errorf("check the commit of offset %d of partition %d: %v", offset, partition, err)
				} else if finished != offset {
					t.Errorf("partition %d: committing offset %d with %d messages below it finished", partition, offset, finished)
				}
			}
			rebalance(t, e)
			if commits.Load() == 0 {
				t.Error("no offset commit was checked")
			}
		})
	}
}
