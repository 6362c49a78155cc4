package consumer

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPauseSeriesAtStart: route_paused and route_pauses_total have a series for every topic and
// every reason a route is paused (gate.PauseReasons) from the start, at 0.
func TestPauseSeriesAtStart(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	m.initSeries([]string{"a", "b"})
	if n := testutil.CollectAndCount(m.Paused); n != 8 {
		t.Errorf("route_paused has %d series at start, want one per topic and reason", n)
	}
	if n := testutil.CollectAndCount(m.Pauses); n != 8 {
		t.Errorf("route_pauses_total has %d series at start, want one per topic and reason", n)
	}
}
