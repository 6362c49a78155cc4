package poll_test

import (
	"fmt"
	"testing"

	"github.com/inboxworker/inboxworker/internal/poll"
)

func TestUntil(t *testing.T) {
	t.Parallel()
	calls := 0
	poll.Until(t, func() string {
		if calls++; calls < 3 {
			return fmt.Sprintf("%d calls", calls)
		}
		return ""
	})
	if calls != 3 {
		t.Errorf("check called %d times, want 3: until it returned \"\"", calls)
	}
	n := 0
	poll.For(t, "the third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
}
