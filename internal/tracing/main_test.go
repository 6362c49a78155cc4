package tracing_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a goroutine is still running after the tests: a span processor or an
// exporter that Shutdown did not stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
