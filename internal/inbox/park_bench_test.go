package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// BenchmarkDrainPark drains a park of 20,000 messages of one partition, as an outage of a day's
// provider leaves it, over 100 keys (the messages of a few busy senders) or 20,000 (one message per
// phone): each message taken with its key's head (TakeDue, 32 at a time), begun, and applied with
// its removal from the park in one transaction. msgs/s is the rate at which the park drains,
// Postgres's part of it.
func BenchmarkDrainPark(b *testing.B) {
	for _, keys := range []int{100, 20_000} {
		b.Run(fmt.Sprintf("Keys%d", keys), func(b *testing.B) {
			const parked = 20_000
			e := setup(b, inbox.Config{})
			ctx := context.Background()
			noop := func(context.Context, pgx.Tx) error { return nil }
			drained := 0
			for b.Loop() {
				b.StopTimer()
				e.exec(b, `DELETE FROM inbox_parked`)
				e.exec(b, `DELETE FROM inbox`)
				e.exec(b, `INSERT INTO inbox_parked (handler, topic, "partition", "offset", ordering_key, idempotency_key, value, fingerprint)
					SELECT 'h', 't', 0, g, convert_to('k' || (g % $1), 'UTF8'), 'key' || g, '\x00'::bytea,
						sha256(convert_to('key' || g, 'UTF8'))
					FROM generate_series(1, $2) g`, keys, parked)
				e.exec(b, `VACUUM ANALYZE inbox_parked`)
				b.StartTimer()
				for left := parked; left > 0; {
					taken, err := e.store.Park().TakeDue(ctx, "t", 0, "bench", time.Minute, 32)
					if err != nil || len(taken) == 0 {
						b.Fatalf("TakeDue = %d, %v with %d left", len(taken), err, left)
					}
					for _, p := range taken {
						if _, err := e.store.StartLog().RecordParked(ctx, p); err != nil {
							b.Fatal(err)
						}
						if outcome, err := e.store.Park().Process(ctx, p, noop); err != nil || outcome != inbox.Applied {
							b.Fatalf("ProcessParked = %q, %v", outcome, err)
						}
					}
					left -= len(taken)
				}
				drained += parked
			}
			b.ReportMetric(float64(drained)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
