package gate

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// newTestGate is a gate of route "b", of 2 slots, with metrics and a log to look at.
func newTestGate(t *testing.T, cc CircuitConfig) (*Gate, *recorded, *bytes.Buffer) {
	t.Helper()
	m := &recorded{paused: map[string]bool{}, pauses: map[string]int{}}
	logs := &bytes.Buffer{}
	g, err := New(Config{Topic: "b", Concurrency: 2, Circuit: cc, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return g, m, logs
}

// recorded is a gate's Metrics, kept by reason for the one topic "b".
type recorded struct {
	mu     sync.Mutex
	paused map[string]bool
	pauses map[string]int
}

func (m *recorded) SetPaused(topic, reason string, paused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if topic == "b" {
		m.paused[reason] = paused
	}
}

func (m *recorded) CountPause(topic, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if topic == "b" {
		m.pauses[reason]++
	}
}

func (m *recorded) isPaused(reason string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused[reason]
}

func (m *recorded) pausesOf(reason string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pauses[reason]
}

func (*recorded) WaitedForRate(string)       {}
func (*recorded) SetConcurrency(string, int) {}
func (*recorded) SetRate(string, float64)    {}

// TestGateCircuitChanges: each change of the circuit's state is logged with the topic and why, and
// sets the route's outage gauge; a pause is counted once.
func TestGateCircuitChanges(t *testing.T) {
	t.Parallel()
	g, m, logs := newTestGate(t, CircuitConfig{})
	for _, c := range []struct {
		from, to RouteState
		paused   bool
		log      string
	}{
		{RouteOpen, RoutePaused, true, "pausing the route"},
		{RoutePaused, RouteProbing, true, "the route is probing"},
		{RouteProbing, RoutePaused, true, "the route is paused"},
		{RoutePaused, RouteProbing, true, "the route is probing"},
		{RouteProbing, RouteOpen, false, "resuming the route"},
	} {
		logs.Reset()
		g.circuitChanged(c.from, c.to, PausedOutage, "because")
		if n := m.pausesOf(PausedOutage); n != 1 {
			t.Errorf("%v→%v: %d pauses counted, want the one pause", c.from, c.to, n)
		}
		if got := m.isPaused(PausedOutage); got != c.paused {
			t.Errorf("%v→%v: route_paused{outage} %v, want %v", c.from, c.to, got, c.paused)
		}
		if !strings.Contains(logs.String(), c.log) || !strings.Contains(logs.String(), "topic=b") ||
			!strings.Contains(logs.String(), "why=because") {
			t.Errorf("%v→%v logged %q, want %q with the topic and why", c.from, c.to, logs, c.log)
		}
	}
}

// TestGateThrottle: a Retry-After starts nothing of the route until it ends; a shorter one does
// not shorten a longer one; the time throttled is on the paused clock, once; the gauge is 1 for
// as long as the throttle holds.
func TestGateThrottle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g, m, _ := newTestGate(t, CircuitConfig{})
		g.Throttle(10 * time.Second)
		g.Throttle(time.Second) // shorter: changes nothing
		if a, wait := g.Admit(); a != AdmitNone || wait != 10*time.Second {
			t.Fatalf("admit = %v, %v; want none for 10s", a, wait)
		}
		if _, ok := g.allow(); ok {
			t.Fatal("allow while throttled")
		}
		if !m.isPaused(PausedRetryAfter) {
			t.Error("route_paused{retry_after} unset while throttled")
		}
		time.Sleep(4 * time.Second)
		g.Throttle(10 * time.Second) // longer: extends the span
		time.Sleep(14 * time.Second)
		synctest.Wait()
		if a, _ := g.Admit(); a != AdmitAny {
			t.Fatalf("admit = %v after the throttle, want any", a)
		}
		if m.isPaused(PausedRetryAfter) {
			t.Error("route_paused{retry_after} still set after the throttle")
		}
		if got := g.PausedTotal(); got != 14*time.Second {
			t.Errorf("paused clock %v, want the 14s throttled", got)
		}
		if n := m.pausesOf(PausedRetryAfter); n != 1 {
			t.Errorf("%d retry_after pauses counted, want 1 for one span", n)
		}
	})
}
