package consumer

import (
	"testing"
	"time"
)

// TestRejoinDelay: generations that end at once are free three in a row (a rolling deploy's
// rebalances), then the join waits, doubling to 10s; a generation that lasted starts the count again.
func TestRejoinDelay(t *testing.T) {
	t.Parallel()
	c := &Consumer{}
	var got []time.Duration
	for range 10 {
		got = append(got, c.rejoinDelay(10*time.Millisecond))
	}
	want := []time.Duration{0, 0, 0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
		2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	if d := c.rejoinDelay(time.Minute); d != 0 {
		t.Errorf("after a generation of a minute: %s, want 0", d)
	}
	if d := c.rejoinDelay(10 * time.Millisecond); d != 0 {
		t.Errorf("the first short generation after a long one: %s, want 0", d)
	}
}
