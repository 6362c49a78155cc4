package inbox

import (
	"context"
	"fmt"
	"time"
)

// The schedule of a call route's rate limit for a whole consumer group: one row per group and
// handler in inbox_call_rates, the time up to which calls are booked. An instance about to call
// books its next calls (BookCalls), and makes each no sooner than its time: the group's calls are
// spaced by the rate however its traffic is spread over instances, and an instance that dies
// leaves only unused times behind, never a burst.

const bookCallsSQL = `
INSERT INTO inbox_call_rates AS r (consumer_group, handler, booked_until)
VALUES ($1, $2, clock_timestamp() + $3::int * $4::interval)
ON CONFLICT (consumer_group, handler) DO UPDATE
SET booked_until = greatest(r.booked_until, clock_timestamp()) + $3::int * $4::interval
RETURNING booked_until - $3::int * $4::interval - clock_timestamp()`

// BookCalls books n calls of handler's rate limit for group, every apart, after all those booked
// already, in one autocommit statement, and returns how long from now the first of them may go
// out (0 or less: at once); the others follow it every apart. Times are the database's: the
// instances' clocks need not agree, and a wait counted from the statement's return is, if anything,
// late.
func (s *Store) BookCalls(ctx context.Context, group, handler string, n int, every time.Duration) (time.Duration, error) {
	if n < 1 || every <= 0 {
		return 0, fmt.Errorf("inbox: book %d calls every %s: want at least one, spaced", n, every)
	}
	var first time.Duration
	err := s.pool.QueryRow(ctx, bookCallsSQL, group, handler, n, every).Scan(&first)
	if err != nil {
		return 0, Classify(fmt.Errorf("inbox: book calls of %s: %w", handler, err))
	}
	return first, nil
}
