// Package wait holds the worker's one backoff, for everything that tries again after a failure:
// a message's retries, the waits for the database, the outbox relay's failed rounds, start-up's
// waits for Kafka and Postgres. It is backoff/v4's exponential backoff, computed for the n-th
// failure in a row so that a caller keeps a count rather than a backoff's state. With it are the
// worker's one cancellable sleep (Sleep) and its one periodic loop (Every).
package wait

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff is an exponential backoff: Initial after the first failure, doubling after each next one,
// at most Max, each wait randomized by Jitter (0: none; 0.5: from half to one and a half of it).
type Backoff struct {
	Initial, Max time.Duration
	Jitter       float64
}

// Delay is the wait after the n-th failure in a row (n >= 1).
func (b Backoff) Delay(n int) time.Duration {
	e := &backoff.ExponentialBackOff{
		InitialInterval:     b.Initial,
		RandomizationFactor: b.Jitter,
		Multiplier:          2,
		MaxInterval:         b.Max,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	e.Reset()
	d := b.Initial
	for range min(n, maxDoublings) {
		d = e.NextBackOff()
	}
	return d
}

// maxDoublings is more doublings than any interval takes to reach its maximum.
const maxDoublings = 64

// Sleep waits d, or less when one of wake (at most two; a nil one never wakes) is closed or
// sent on, and returns nil; or until ctx is done, and returns its cause. It is every cancellable
// wait of the worker's loops.
func Sleep(ctx context.Context, d time.Duration, wake ...<-chan struct{}) error {
	var w1, w2 <-chan struct{}
	switch len(wake) {
	case 0:
	case 1:
		w1 = wake[0]
	case 2:
		w1, w2 = wake[0], wake[1]
	default:
		panic("wait.Sleep: more than two channels to wake on")
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
	case <-w1:
	case <-w2:
	}
	return nil
}

// ErrStopping is why a wait ended once its stopping channel was closed: the consumer began to
// stop, and waits for nothing more.
var ErrStopping = errors.New("consumer: stopping")

// Stopped is ErrStopping once stopping is closed, else nil.
func Stopped(stopping <-chan struct{}) error {
	select {
	case <-stopping:
		return ErrStopping
	default:
		return nil
	}
}

// SleepOrStop is Sleep that also ends when stopping is closed, and then fails with ErrStopping:
// the consumer's waits, which end when it begins to stop.
func SleepOrStop(ctx context.Context, d time.Duration, stopping, wake <-chan struct{}) error {
	if err := Sleep(ctx, d, wake, stopping); err != nil {
		return err
	}
	return Stopped(stopping)
}

// Every runs refresh at once, then every interval, until ctx is done: for the gauges the worker
// reads from its database or its brokers, and the purges. A failed refresh, unless ctx is done, is
// logged at debug as "cannot " + what, and the next one comes at its time: a gauge that cannot be
// read keeps its last value. (A purge logs what it did itself.)
func Every(ctx context.Context, interval time.Duration, log *slog.Logger, what string, refresh func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := refresh(ctx); err != nil && ctx.Err() == nil {
			log.DebugContext(ctx, "cannot "+what, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
