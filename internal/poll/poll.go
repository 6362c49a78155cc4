// Package poll is the tests' one way to wait for something to happen: a check polled until it
// holds, the test failed with what was still wrong once Timeout has passed. The timeout is a guard
// against a hang, not a limit on speed: no test asserts how soon anything happens.
package poll

import (
	"testing"
	"time"
)

// Timeout is how long Until polls before it gives up: long enough for a machine several times
// slower than a developer's, with another process busy, since only a hang should reach it.
const Timeout = 3 * time.Minute

// interval is the pause between two checks.
const interval = 10 * time.Millisecond

// Until calls check until it returns "", and fails tb with its last answer if that has not
// happened within Timeout. check says what is still wrong ("2 of 3 committed"), for the failure.
func Until(tb testing.TB, check func() string) {
	tb.Helper()
	deadline := time.Now().Add(Timeout)
	for {
		problem := check()
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("gave up after %s: %s", Timeout, problem)
		}
		time.Sleep(interval)
	}
}

// For is Until for a condition that says only whether it holds: it fails tb with "waiting for
// what".
func For(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Until(tb, func() string {
		if cond() {
			return ""
		}
		return "waiting for " + what
	})
}
