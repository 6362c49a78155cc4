package consumer

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newTestGate is a gate of route "b", of 2 slots, with metrics and a log to look at.
func newTestGate(t *testing.T, cc CircuitConfig) (*gate, *Metrics, *bytes.Buffer) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	m.initSeries([]string{"a", "b"})
	logs := &bytes.Buffer{}
	g, err := newGate(Route{Topic: "b", Concurrency: 2}, cc, nil, m, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return g, m, logs
}

func TestGateSeriesAtStart(t *testing.T) {
	t.Parallel()
	_, m, _ := newTestGate(t, CircuitConfig{})
	if n := testutil.CollectAndCount(m.Paused); n != 8 {
		t.Errorf("route_paused has %d series at start, want one per topic and reason", n)
	}
	if n := testutil.CollectAndCount(m.Pauses); n != 8 {
		t.Errorf("route_pauses_total has %d series at start, want one per topic and reason", n)
	}
}

// TestGateCircuitChanges: each change of the circuit's state is logged with the topic and why, and
// sets the route's outage gauge; a pause is counted once.
func TestGateCircuitChanges(t *testing.T) {
	t.Parallel()
	g, m, logs := newTestGate(t, CircuitConfig{})
	for _, c := range []struct {
		from, to RouteState
		paused   float64
		log      string
	}{
		{RouteOpen, RoutePaused, 1, "pausing the route"},
		{RoutePaused, RouteProbing, 1, "the route is probing"},
		{RouteProbing, RoutePaused, 1, "the route is paused"},
		{RoutePaused, RouteProbing, 1, "the route is probing"},
		{RouteProbing, RouteOpen, 0, "resuming the route"},
	} {
		logs.Reset()
		g.circuitChanged(c.from, c.to, pausedOutage, "because")
		if v := testutil.ToFloat64(m.Pauses.WithLabelValues("b", pausedOutage)); v != 1 {
			t.Errorf("%v→%v: route_pauses_total{b,outage} = %g, want the one pause", c.from, c.to, v)
		}
		if v := testutil.ToFloat64(m.Paused.WithLabelValues("b", pausedOutage)); v != c.paused {
			t.Errorf("%v→%v: route_paused{b,outage} = %g, want %g", c.from, c.to, v, c.paused)
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
		gauge := m.Paused.WithLabelValues("b", pausedRetryAfter)
		g.throttle(10 * time.Second)
		g.throttle(time.Second) // shorter: changes nothing
		if a, wait := g.admit(); a != admitNone || wait != 10*time.Second {
			t.Fatalf("admit = %v, %v; want none for 10s", a, wait)
		}
		if _, ok := g.allow(); ok {
			t.Fatal("allow while throttled")
		}
		if v := testutil.ToFloat64(gauge); v != 1 {
			t.Errorf("route_paused{retry_after} = %g while throttled, want 1", v)
		}
		time.Sleep(4 * time.Second)
		g.throttle(10 * time.Second) // longer: extends the span
		time.Sleep(14 * time.Second)
		synctest.Wait()
		if a, _ := g.admit(); a != admitAny {
			t.Fatalf("admit = %v after the throttle, want any", a)
		}
		if v := testutil.ToFloat64(gauge); v != 0 {
			t.Errorf("route_paused{retry_after} = %g after the throttle, want 0", v)
		}
		if got := g.paused(); got != 14*time.Second {
			t.Errorf("paused clock %v, want the 14s throttled", got)
		}
		if v := testutil.ToFloat64(m.Pauses.WithLabelValues("b", pausedRetryAfter)); v != 1 {
			t.Errorf("route_pauses_total{retry_after} = %g, want 1 for one span", v)
		}
	})
}
