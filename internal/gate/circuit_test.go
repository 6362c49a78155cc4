package gate

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// circuitEnv is a circuit, with the changes of state it reported. Its tests run in a synctest
// bubble, whose clock moves only when they sleep: the circuit reads time.Now.
type circuitEnv struct {
	*circuit
	mu  sync.Mutex
	log []string // "from→to"
	// causes are the causes OnChange was told, in order.
	causes []string
}

// newCircuitEnv returns a circuit of config that logs its changes of state, each of which must
// have a reason. Call it in a synctest bubble.
func newCircuitEnv(t *testing.T, config CircuitConfig) *circuitEnv {
	t.Helper()
	e := &circuitEnv{}
	config.OnChange = func(from, to RouteState, cause, why string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.log = append(e.log, from.String()+"→"+to.String())
		e.causes = append(e.causes, cause)
		if why == "" {
			t.Errorf("change %s→%s without a reason", from, to)
		}
	}
	c, err := newCircuit(config)
	if err != nil {
		t.Fatal(err)
	}
	e.circuit = c
	return e
}

// run starts a message of key and records res, and fails the test unless it may start.
func (e *circuitEnv) run(t *testing.T, key string, res Signal) {
	t.Helper()
	p, ok := e.Allow()
	if !ok {
		t.Fatalf("a message of %s may not start; the route is %v", key, e.state)
	}
	e.Record(p, key, res)
}

func (e *circuitEnv) changes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.log)
}

func (e *circuitEnv) assertState(t *testing.T, want RouteState) {
	t.Helper()
	if got, _ := e.State(); got != want {
		t.Fatalf("route %v, want %v", got, want)
	}
}

// trip pauses the route: 10 failures in a row, of keys k0 to k9.
func (e *circuitEnv) trip(t *testing.T) {
	t.Helper()
	for i := range 10 {
		e.run(t, fmt.Sprint("k", i), SignalFailed)
	}
}

// probe waits out the probe interval, takes the probe and records res.
func (e *circuitEnv) probe(t *testing.T, res Signal) {
	t.Helper()
	e.probeOf(t, "probe", res)
}

// probeOf is probe with a message of key.
func (e *circuitEnv) probeOf(t *testing.T, key string, res Signal) {
	t.Helper()
	state, at := e.State()
	if state != RoutePaused {
		t.Fatalf("route %v, want paused", state)
	}
	time.Sleep(time.Until(at))
	p, ok := e.Allow()
	if !ok || !p.Probe() {
		t.Fatalf("Allow at the probe time = %+v, %t; want the probe", p, ok)
	}
	e.Record(p, key, res)
}

// TestCircuitSuspects: the keys whose failures tripped the circuit are suspects. While no probe of
// another key has failed, a suspect's failed probe proves no outage — keys failing on their own
// look the same — and the route opens again, so that they spend their budgets. Once a probe of
// another key failed, the outage is confirmed, and a suspect's failed probe keeps the route paused.
func TestCircuitSuspects(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newCircuitEnv(t, CircuitConfig{})
		trip := func() {
			t.Helper()
			for i := range 10 {
				e.run(t, fmt.Sprint("k", i%3), SignalFailed)
			}
			e.assertState(t, RoutePaused)
		}
		trip()
		if !e.Tripped("k1") || e.Tripped("fresh") {
			t.Errorf("Tripped k1 %t, fresh %t; want k1 only", e.Tripped("k1"), e.Tripped("fresh"))
		}
		e.probeOf(t, "k1", SignalFailed)
		e.assertState(t, RouteOpen)
		if e.Tripped("k1") {
			t.Error("k1 is a suspect of an open route")
		}

		trip()
		e.probeOf(t, "fresh", SignalFailed) // confirms the outage
		e.assertState(t, RoutePaused)
		e.probeOf(t, "k2", SignalFailed)
		e.assertState(t, RoutePaused)
		e.probeOf(t, "k2", SignalAnswered)
		e.assertState(t, RouteOpen)
		want := []string{"open→paused", "paused→probing", "probing→open", "open→paused", "paused→probing",
			"probing→paused", "paused→probing", "probing→paused", "paused→probing", "probing→open"}
		if got := e.changes(); !slices.Equal(got, want) {
			t.Errorf("changes %q\nwant    %q", got, want)
		}
	})
}

func TestCircuitTrips(t *testing.T) {
	t.Parallel()

	t.Run("ConsecutiveFailuresAcrossKeys", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			for i := range 9 {
				e.run(t, fmt.Sprint("k", i%3), SignalFailed)
			}
			e.assertState(t, RouteOpen)
			e.run(t, "k0", SignalFailed)
			e.assertState(t, RoutePaused)
			if got := e.changes(); !slices.Equal(got, []string{"open→paused"}) {
				t.Errorf("changes %q", got)
			}
			if _, ok := e.Allow(); ok {
				t.Error("a message may start on a paused route")
			}
		})
	})

	t.Run("AnswerBreaksTheRun", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{FailureRate: 1})
			for i := range 100 {
				e.run(t, fmt.Sprint("k", i%5), SignalFailed)
				if i%9 == 8 {
					e.run(t, "good", SignalAnswered)
				}
			}
			e.assertState(t, RouteOpen)
		})
	})

	// One key that always fails, or two, are not an outage, however often they fail.
	t.Run("FewKeysNever", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			for i := range 1000 {
				e.run(t, fmt.Sprint("poison", i%2), SignalFailed)
				time.Sleep(100 * time.Millisecond)
			}
			e.assertState(t, RouteOpen)
			if got := e.Paused(); got != 0 {
				t.Errorf("Paused() = %s, want 0", got)
			}
		})
	})

	t.Run("Inconclusive", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			for i := range 100 {
				e.run(t, fmt.Sprint("k", i), SignalNone)
			}
			e.assertState(t, RouteOpen)
		})
	})

	t.Run("FailureRate", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			// 2 failures for 3 answers: 40%, from many keys, over and over; no trip.
			for i := range 200 {
				key := fmt.Sprint("k", i)
				switch i % 5 {
				case 0, 1:
					e.run(t, key, SignalFailed)
				default:
					e.run(t, key, SignalAnswered)
				}
				time.Sleep(100 * time.Millisecond)
			}
			e.assertState(t, RouteOpen)
			// Then 3 failures for 2 answers: the rate reaches 50% in the window once the 40% has aged.
			tripped := -1
			for i := range 2000 {
				key := fmt.Sprint("j", i)
				if i%5 < 3 {
					e.run(t, key, SignalFailed)
				} else {
					e.run(t, key, SignalAnswered)
				}
				if state, _ := e.State(); state == RoutePaused {
					tripped = i
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if tripped < 0 {
				t.Fatal("a 60% failure rate did not trip the circuit")
			}
			if tripped < 100 || tripped > 600 {
				t.Errorf("tripped after %d runs (%s), want once the window is over half failures", tripped,
					time.Duration(tripped)*100*time.Millisecond)
			}
		})
	})

	// Failures that leave the window are forgotten, keys included.
	t.Run("WindowForgets", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{ConsecutiveFailures: 1000})
			for i := range 9 {
				e.run(t, fmt.Sprint("k", i), SignalFailed)
			}
			time.Sleep(time.Minute)
			e.run(t, "k9", SignalFailed) // 10 failures from 10 keys, but only 1 in the window
			e.assertState(t, RouteOpen)
			for range 9 {
				e.run(t, "k10", SignalFailed)
				time.Sleep(time.Second)
			}
			e.assertState(t, RouteOpen) // 10 failures in the window, from 2 keys only
			e.run(t, "k11", SignalFailed)
			e.assertState(t, RoutePaused)
		})
	})
}

func TestCircuitProbes(t *testing.T) {
	t.Parallel()

	t.Run("GrowingIntervalCapped", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			e.trip(t)
			var intervals []time.Duration
			for range 8 {
				state, at := e.State()
				if state != RoutePaused {
					t.Fatalf("route %v, want paused", state)
				}
				intervals = append(intervals, time.Until(at))
				// Not a moment before its time.
				time.Sleep(time.Until(at) - time.Millisecond)
				if _, ok := e.Allow(); ok {
					t.Fatal("a message started before the probe was due")
				}
				e.probe(t, SignalFailed)
			}
			want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
			for i := range want {
				want[i] *= time.Second
			}
			if !slices.Equal(intervals, want) {
				t.Errorf("probe intervals %v, want %v", intervals, want)
			}
		})
	})

	t.Run("OneProbeAtATime", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			e.trip(t)
			_, at := e.State()
			time.Sleep(time.Until(at))
			probe, ok := e.Allow()
			if !ok || !probe.Probe() {
				t.Fatal("no probe")
			}
			e.assertState(t, RouteProbing)
			time.Sleep(time.Hour)
			if _, ok := e.Allow(); ok {
				t.Fatal("a second message started while the probe runs")
			}
			e.Record(probe, "k", SignalAnswered)
			e.assertState(t, RouteOpen)
			if got, want := e.changes(), []string{"open→paused", "paused→probing", "probing→open"}; !slices.Equal(got, want) {
				t.Errorf("changes %q, want %q", got, want)
			}
		})
	})

	// Once open again the failures before the pause are forgotten, and the probe interval starts
	// over.
	t.Run("ResumeForgets", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			e.trip(t)
			e.probe(t, SignalFailed)
			e.probe(t, SignalAnswered)
			e.assertState(t, RouteOpen)
			for i := range 9 {
				e.run(t, fmt.Sprint("k", i), SignalFailed)
			}
			e.assertState(t, RouteOpen)
			e.run(t, "k9", SignalFailed)
			if _, at := e.State(); time.Until(at) != time.Second {
				t.Errorf("first probe in %s after a resume, want 1s", time.Until(at))
			}
		})
	})

	t.Run("InconclusiveProbe", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			e.trip(t)
			e.probe(t, SignalFailed) // next in 2s
			e.probe(t, SignalNone)
			state, at := e.State()
			if state != RoutePaused || time.Until(at) != 2*time.Second {
				t.Errorf("after an inconclusive probe: %v, next in %s; want paused, next in 2s", state, time.Until(at))
			}
		})
	})

	// A probe its handler declined without a call (an expired SMS) is followed by another at
	// once, and resumes nothing: a backlog of expired messages drains while the provider is down.
	t.Run("ProbeNotCalled", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			e.trip(t)
			e.probe(t, SignalFailed) // next in 2s
			for range 3 {
				e.probe(t, SignalNotCalled)
				state, at := e.State()
				if state != RoutePaused || at.After(time.Now()) {
					t.Fatalf("after a probe that called nothing: %v, next in %s; want paused, next now", state, time.Until(at))
				}
			}
			p, ok := e.Allow()
			if !ok || !p.Probe() {
				t.Fatal("no probe at once after a probe that called nothing")
			}
			e.Record(p, "k", SignalFailed)
			// The probes after one that called nothing are not announced: its start and the end of the
			// last are.
			want := []string{"open→paused", "paused→probing", "probing→paused", "paused→probing", "probing→paused"}
			if got := e.changes(); !slices.Equal(got, want) {
				t.Errorf("changes %q, want %q", got, want)
			}
			if _, at := e.State(); time.Until(at) != 4*time.Second {
				t.Errorf("next probe in %s after a failed one, want 4s: a probe that called nothing changes no interval", time.Until(at))
			}
		})
	})

	// Runs that started before the pause finish after it: they neither resume the route nor count.
	t.Run("StaleResults", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newCircuitEnv(t, CircuitConfig{})
			var inFlight []Permit
			for range 3 {
				p, _ := e.Allow()
				inFlight = append(inFlight, p)
			}
			e.trip(t)
			e.Record(inFlight[0], "late", SignalAnswered)
			e.assertState(t, RoutePaused)
			e.probe(t, SignalAnswered)
			e.Record(inFlight[1], "late", SignalFailed)
			e.Record(inFlight[2], "late", SignalFailed)
			for i := range 9 {
				e.run(t, fmt.Sprint("k", i), SignalFailed)
			}
			e.assertState(t, RouteOpen) // 9 failures since the resume, not 11
		})
	})
}

// The time the route is not open is what no message's retry budget is charged.
func TestCircuitPaused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newCircuitEnv(t, CircuitConfig{})
		time.Sleep(time.Hour)
		if got := e.Paused(); got != 0 {
			t.Fatalf("Paused() = %s while open, want 0", got)
		}
		e.trip(t)
		time.Sleep(500 * time.Millisecond)
		if got := e.Paused(); got != 500*time.Millisecond {
			t.Errorf("Paused() = %s, want 500ms", got)
		}
		e.probe(t, SignalFailed)     // at 1s
		e.probe(t, SignalAnswered)   // at 3s
		time.Sleep(10 * time.Minute) // open: not counted
		if got := e.Paused(); got != 3*time.Second {
			t.Errorf("Paused() = %s after resuming, want 3s", got)
		}
	})
}

func TestCircuitChanged(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newCircuitEnv(t, CircuitConfig{})
		changed := e.Changed()
		for i := range 9 {
			e.run(t, fmt.Sprint("k", i), SignalFailed)
		}
		select {
		case <-changed:
			t.Fatal("Changed closed without a change")
		default:
		}
		e.run(t, "k9", SignalFailed)
		select {
		case <-changed:
		default:
			t.Fatal("Changed not closed by the pause")
		}
		if next := e.Changed(); next == changed {
			t.Error("Changed returned the closed channel again")
		}
	})
}

func TestNewCircuitValidates(t *testing.T) {
	t.Parallel()
	for _, config := range []CircuitConfig{
		{ConsecutiveFailures: -1},
		{Window: time.Millisecond},
		{FailureRate: 1.5},
		{FailureRate: -0.1},
		{MinFailures: -1},
		{MinKeys: -1},
		{MinKeys: 1000},
		{ProbeInterval: -time.Second},
		{ProbeInterval: time.Minute, MaxProbeInterval: time.Second},
	} {
		if _, err := newCircuit(config); err == nil {
			t.Errorf("newCircuit(%+v) succeeded, want an error", config)
		}
	}
	c, err := newCircuit(CircuitConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := CircuitConfig{ConsecutiveFailures: 10, Window: time.Minute, FailureRate: 0.5, MinFailures: 10,
		MinKeys: 3, ProbeInterval: time.Second, MaxProbeInterval: 30 * time.Second}
	if got := c.config; fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
}

// TestCircuitForgetsOldFailures: the failure rate looks back one Window only. Failures older than
// that no longer count, even in a slice of the window that nothing has written to since, so that a
// route's failures long ago and a few now do not add up to an outage.
func TestCircuitForgetsOldFailures(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// 9 failures from 3 keys, an answer after each: no run of failures in a row, and one
		// failure short of MinFailures.
		failEach := func(e *circuitEnv, keys ...string) {
			for _, k := range keys {
				e.run(t, k, SignalFailed)
				e.run(t, "fine", SignalAnswered)
			}
		}
		nine := []string{"a", "b", "c", "a", "b", "c", "a", "b", "c"}

		recent := newCircuitEnv(t, CircuitConfig{})
		failEach(recent, nine...)
		time.Sleep(30 * time.Second)
		recent.run(t, "a", SignalFailed)
		recent.assertState(t, RoutePaused) // 10 failures of 19 within the minute: the rate trips it

		old := newCircuitEnv(t, CircuitConfig{})
		failEach(old, nine...)
		time.Sleep(time.Minute + 2*time.Second) // past the window, into another of its slices
		failEach(old, "a", "b")
		old.run(t, "c", SignalFailed)
		old.assertState(t, RouteOpen) // 3 failures within the minute: the 9 before are forgotten
	})
}

// TestCircuitRefusals: refusals that would meet any message (the kill switch) trip the circuit as
// failures do when they are of one class, and the pause says so (its cause is PausedFailing): a run
// of refusals of one class that another class interrupts starts again. A probe that gets through
// opens the route, and the next trip by failures is an outage's again.
func TestCircuitRefusals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The rate over the window left out: a minimum of failures it never reaches.
		e := newCircuitEnv(t, CircuitConfig{MinFailures: 1000})
		refuse := func(key, class string) {
			t.Helper()
			p, ok := e.Allow()
			if !ok {
				t.Fatalf("a message of %s may not start; the route is %v", key, e.state)
			}
			e.RecordRefused(p, key, class)
		}
		for i := range 9 {
			refuse(fmt.Sprint("k", i), "SQLSTATE 42501")
		}
		refuse("k9", "SQLSTATE 42P01") // another class: the run starts again
		e.assertState(t, RouteOpen)
		for i := range 9 {
			refuse(fmt.Sprint("m", i), "SQLSTATE 42P01")
		}
		e.assertState(t, RoutePaused)
		if got := e.changes(); len(got) != 1 || e.causes[0] != PausedFailing {
			t.Fatalf("changes %v with causes %v, want open→paused for %s", got, e.causes, PausedFailing)
		}
		e.probeOf(t, "fresh", SignalAnswered)
		e.assertState(t, RouteOpen)
		e.trip(t)
		if last := e.causes[len(e.causes)-1]; last != PausedOutage {
			t.Errorf("a trip by failures after refusals: cause %s, want %s", last, PausedOutage)
		}
	})
}
