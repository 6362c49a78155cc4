package fault_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a goroutine is still running after the tests: fault starts none, and
// its tests (the network timeouts among them) must leave none behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
