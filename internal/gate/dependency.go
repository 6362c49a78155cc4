package gate

import (
	"context"
	"time"

	"github.com/inboxworker/inboxworker/internal/wait"
)

// DependencyCircuit is a route's outage circuit (see CircuitConfig) for a dependency the worker
// calls outside any route: reconciliation's payment status endpoint. Its calls' failures, from
// several keys, pause the calls, and one probe at a time goes out, at a doubling interval, until
// one is answered; a key that fails alone never pauses the others. It is safe for concurrent use.
type DependencyCircuit struct{ c *circuit }

// NewDependencyCircuit returns an open circuit of config.
func NewDependencyCircuit(config CircuitConfig) (*DependencyCircuit, error) {
	c, err := newCircuit(config)
	if err != nil {
		return nil, err
	}
	return &DependencyCircuit{c: c}, nil
}

// Allow returns leave for a call now, if the circuit gives it: any while it is open, the probe once
// it is due while it is paused. Every permit goes back through Answered, Failed or Unused.
func (d *DependencyCircuit) Allow() (Permit, bool) { return d.c.Allow() }

// Wait waits for leave to make a call. It fails only when ctx is done.
func (d *DependencyCircuit) Wait(ctx context.Context) (Permit, error) {
	for {
		if p, ok := d.c.Allow(); ok {
			return p, nil
		}
		if err := wait.Sleep(ctx, max(d.c.notYet(), time.Millisecond), d.c.Changed()); err != nil {
			return Permit{}, err
		}
	}
}

// Tripped reports whether key failed before the circuit paused: a probe of another key tells more
// of the dependency.
func (d *DependencyCircuit) Tripped(key string) bool { return d.c.Tripped(key) }

// Answered records that the call of key that p let out was answered, whatever the answer.
func (d *DependencyCircuit) Answered(p Permit, key string) { d.c.Record(p, key, SignalAnswered) }

// Failed records that the call of key that p let out failed as an outage would make it fail.
func (d *DependencyCircuit) Failed(p Permit, key string) { d.c.Record(p, key, SignalFailed) }

// Unused gives p back: no call was made with it.
func (d *DependencyCircuit) Unused(p Permit) { d.c.Record(p, "", SignalNone) }
