package wait_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inboxworker/inboxworker/internal/wait"
)

func TestBackoffDelay(t *testing.T) {
	b := wait.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, b.Delay(n))
	}
	ms := time.Millisecond
	if want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}; !slices.Equal(got, want) {
		t.Errorf("Delay(1..6) = %v, want %v", got, want)
	}
	if d := b.Delay(1_000_000); d != time.Second {
		t.Errorf("Delay(1e6) = %s, want the maximum, 1s", d)
	}
	b.Jitter = 0.5
	for range 100 {
		if d := b.Delay(3); d < 200*ms || d > 600*ms {
			t.Fatalf("Delay(3) with jitter 0.5 = %s, want 200ms to 600ms", d)
		}
	}
}

func TestSleep(t *testing.T) {
	if err := wait.Sleep(context.Background(), 0); err != nil {
		t.Errorf("Sleep(0) = %v", err)
	}
	stopped := errors.New("stopped")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(stopped)
	if err := wait.Sleep(ctx, time.Hour); !errors.Is(err, stopped) {
		t.Errorf("Sleep(cancelled, 1h) = %v, want the context's cause", err)
	}
	woke := make(chan struct{})
	close(woke)
	if err := wait.Sleep(context.Background(), time.Hour, nil, woke); err != nil {
		t.Errorf("Sleep(1h) woken = %v, want nil", err)
	}
}

// TestEvery: the refresh runs at once, then every interval until ctx is done; a failed one is
// logged at debug as "cannot" and what, and the next comes at its time.
func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var at []time.Duration
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			wait.Every(ctx, time.Second, log, "read the gauge", func(context.Context) error {
				at = append(at, time.Since(start))
				if len(at) == 2 {
					return errors.New("the database is down")
				}
				return nil
			})
		}()
		time.Sleep(2500 * time.Millisecond)
		cancel()
		<-done
		if want := []time.Duration{0, time.Second, 2 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("refreshed at %v, want %v", at, want)
		}
		if got := strings.Count(logs.String(), `level=DEBUG msg="cannot read the gauge" error="the database is down"`); got != 1 {
			t.Errorf("logged %q, want the one failure", logs.String())
		}
	})
}

// TestSleepOrStop: the sleep ends with ErrStopping once stopping closes, even woken at the same
// time; woken or timed out before, it ends with nil.
func TestSleepOrStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stopping, wake := make(chan struct{}), make(chan struct{})
		if err := wait.SleepOrStop(t.Context(), time.Second, stopping, wake); err != nil {
			t.Errorf("timed out: %v, want nil", err)
		}
		go func() { time.Sleep(time.Second); close(wake) }()
		if err := wait.SleepOrStop(t.Context(), time.Hour, stopping, wake); err != nil {
			t.Errorf("woken: %v, want nil", err)
		}
		go func() { time.Sleep(time.Second); close(stopping) }()
		if err := wait.SleepOrStop(t.Context(), time.Hour, stopping, nil); !errors.Is(err, wait.ErrStopping) {
			t.Errorf("stopping: %v, want ErrStopping", err)
		}
		if err := wait.SleepOrStop(t.Context(), time.Hour, stopping, wake); !errors.Is(err, wait.ErrStopping) {
			t.Errorf("stopped and woken: %v, want ErrStopping", err)
		}
	})
}
