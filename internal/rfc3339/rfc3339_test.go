package rfc3339_test

import (
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/rfc3339"
)

func TestParse(t *testing.T) {
	t.Parallel()
	want := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"2026-01-02T15:04:05Z", true},
		{"2026-01-02t15:04:05z", true}, // RFC 3339 5.6: "T" and "Z" may be lowercase
		{"2026-01-02T15:04:05.000Z", true},
		{"2026-01-02T16:04:05+01:00", true},
		{"2026-01-03T15:03:05+23:59", true},
		{"0001-01-01T00:00:00Z", false}, // an unset time.Time
		{"1969-12-31T23:59:59Z", false},
		{"2026-01-03T15:04:05+24:00", false}, // time-numoffset is at most 23:59
		{"2026-01-01T15:04:05-24:00", false},
		{"2026-01-02 15:04:05Z", false},
		{"2026-01-02T15:04:05", false}, // no zone
		{"", false},
	} {
		got, err := rfc3339.Parse(tt.in)
		switch {
		case tt.ok && err != nil:
			t.Errorf("Parse(%q) = %v", tt.in, err)
		case tt.ok && !got.Equal(want):
			t.Errorf("Parse(%q) = %v, want %v", tt.in, got, want)
		case !tt.ok && err == nil:
			t.Errorf("Parse(%q) = %v, want an error", tt.in, got)
		}
	}
}
