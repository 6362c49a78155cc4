package wait_test

import (
	"context"
	"errors"
	"slices"
	"testing"
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
