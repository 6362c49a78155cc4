package inboxworker

import (
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/gate"
)

// TestKillSwitchCircuit: a kill switch's After counts both the failures in a row and the fewest a
// minute needs, from 3 keys, and its zero fields take the circuit's defaults.
func TestKillSwitchCircuit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   KillSwitch
		want gate.CircuitConfig
	}{
		{KillSwitch{}, gate.CircuitConfig{}},
		{KillSwitch{After: 5, Rate: 0.2, MaxProbeInterval: time.Minute},
			gate.CircuitConfig{ConsecutiveFailures: 5, MinFailures: 5, FailureRate: 0.2, MaxProbeInterval: time.Minute}},
	} {
		got, err := tt.in.circuit()
		if err != nil || got.MinKeys != 3 || got.ConsecutiveFailures != tt.want.ConsecutiveFailures || got.MinFailures != tt.want.MinFailures ||
			got.FailureRate != tt.want.FailureRate || got.MaxProbeInterval != tt.want.MaxProbeInterval {
			t.Errorf("%+v.circuit() = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}
