package notify_test

import (
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// TestLogSenderOneLinePerSMS: without a provider, each SMS is one log line, not a "not sent" line
// from the sender and a "sent" line from the handler.
func TestLogSenderOneLinePerSMS(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.newHandler(t, notify.NewLogSender())
	keys := []string{"k1", "k2", "k3"}
	for _, key := range keys {
		if outcome, err := e.process(t, h, key, testEvent, 1); err != nil || outcome != inbox.Applied {
			t.Fatalf("Process %s = %q, %v; want applied", key, outcome, err)
		}
	}
	lines := strings.Split(strings.TrimSpace(e.logs.String()), "\n")
	for _, key := range keys {
		var about []string
		for _, line := range lines {
			if strings.Contains(line, "key="+key+" ") {
				about = append(about, line)
			}
		}
		if len(about) != 1 {
			t.Errorf("%d log lines about %s, want 1:\n%s", len(about), key, strings.Join(about, "\n"))
		}
	}
}
