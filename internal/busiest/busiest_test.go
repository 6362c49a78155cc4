package busiest_test

import (
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/busiest"
)

func TestWithin(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	for _, tt := range []struct {
		name  string
		times []time.Time
		want  int
	}{
		{"None", nil, 0},
		{"One", at(0), 1},
		{"ASecondApart", at(0, 1000, 2000), 1},
		{"JustUnderASecond", at(0, 999), 2},
		{"Burst", at(0, 100, 200, 1500, 1600), 3},
		{"OutOfOrder", at(1600, 0, 1500, 200, 100), 3},
		{"LaterBurst", at(0, 2000, 2100, 2200, 2300), 4},
	} {
		if got := busiest.Within(tt.times, time.Second); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
