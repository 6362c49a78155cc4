// Package promtest reads the tests' Prometheus registries.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counters returns the counter name of reg, summed by the value of its label: every series there
// is, those at 0 included. A label that a series lacks counts as "".
func Counters(tb testing.TB, reg prometheus.Gatherer, name, label string) map[string]float64 {
	tb.Helper()
	families, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			value := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					value = l.GetValue()
				}
			}
			out[value] += m.GetCounter().GetValue()
		}
	}
	return out
}
