// Package startup connects the worker's commands to Postgres and Kafka: it waits up to a timeout
// for each to answer, says which setting to fix when one does not (its errors begin with the
// setting's name: DATABASE_URL, KAFKA_BROKERS, ...), and warns about topics that do not exist or
// keep messages longer than their inbox keeps keys. It holds the Kafka admin client the commands
// share and the rule for topic names.
//
// It does not read the configuration (package cli does), migrate, consume or produce.
package startup

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/internal/wait"
)

// waitFor calls try until it succeeds or timeout passes, with a growing pause between attempts, and
// returns the last error. Each attempt gets the time that is left. An error wrapped in giveUp ends
// the wait at once.
func waitFor(ctx context.Context, timeout time.Duration, logger *slog.Logger, what string,
	try func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pauses := wait.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 1; ; attempt++ {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if g, ok := errors.AsType[giveUp](err); ok {
			return g
		}
		if attempt == 1 {
			logger.InfoContext(ctx, "waiting for "+what, slog.String("err", err.Error()))
		}
		if wait.Sleep(ctx, pauses.Delay(attempt)) != nil {
			return err
		}
	}
}

// giveUp is an error that waiting will not cure.
type giveUp struct{ error }
