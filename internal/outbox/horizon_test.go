package outbox

import "testing"

// TestHorizonObserve: the horizon moves to a last position once the emitters read after it have
// all ended, at once when there were none, and never back.
func TestHorizonObserve(t *testing.T) {
	t.Parallel()
	type reading struct {
		last     int64
		emitters []string
		want     int64 // the horizon after it
	}
	for _, tc := range []struct {
		name     string
		readings []reading
	}{
		{"NoEmitters", []reading{{10, nil, 10}, {12, nil, 12}}},
		{"EmittersEnd", []reading{{10, []string{"3/1"}, 0}, {11, []string{"3/1", "4/7"}, 0}, {12, []string{"4/7"}, 10},
			{13, []string{"4/7", "5/2"}, 10}, {13, []string{"5/2"}, 12}, {14, nil, 14}}},
		{"OneStaysOpen", []reading{{5, []string{"3/1", "4/1"}, 0}, {9, []string{"3/1"}, 0}, {20, []string{"3/1", "6/1"}, 0},
			{21, []string{"6/1"}, 5}}},
		{"NeverBack", []reading{{10, nil, 10}, {8, nil, 10}, {9, []string{"3/1"}, 10}, {9, nil, 10}}},
		{"NothingDrawn", []reading{{0, []string{"3/1"}, 0}, {0, nil, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h horizon
			for i, r := range tc.readings {
				h.observe(r.last, r.emitters)
				if h.at != r.want {
					t.Fatalf("after reading %d (%d, %v): horizon %d, want %d", i+1, r.last, r.emitters, h.at, r.want)
				}
			}
		})
	}
}
