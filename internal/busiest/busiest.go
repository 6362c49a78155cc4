// Package busiest counts the most events that fall within one window of time: how a rate limit's
// tests and its benchmark read the calls a provider saw ("the busiest second").
package busiest

import (
	"slices"
	"time"
)

// Within returns the most of times within any window of d: times less than d apart from the first
// of them. times need not be in order, and are not changed.
func Within(times []time.Time, d time.Duration) int {
	sorted := slices.SortedFunc(slices.Values(times), time.Time.Compare)
	most := 0
	for i, j := 0, 0; j < len(sorted); j++ {
		for sorted[j].Sub(sorted[i]) >= d {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}
