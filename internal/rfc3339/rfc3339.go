// Package rfc3339 parses a time of a message's payload as RFC 3339 defines one, which Go's
// time.Parse does not quite: it refuses the lowercase "t" and "z" that RFC 3339 allows (section
// 5.6, note), and accepts offsets of 24 hours and more, which RFC 3339 does not (time-numoffset is
// at most 23:59). It also refuses a time before 1970: no payment was made, nor SMS due, then, and
// 0001-01-01T00:00:00Z is what a producer's unset time.Time turns into, which must not pass for a
// time (an SMS expiring then would never expire, its zero meaning "none").
package rfc3339

import (
	"errors"
	"strings"
	"time"
)

// Parse parses s, a date-time of RFC 3339, fractional seconds optional.
func Parse(s string) (time.Time, error) {
	if len(s) > 10 && s[10] == 't' {
		s = s[:10] + "T" + s[11:]
	}
	if strings.HasSuffix(s, "z") {
		s = s[:len(s)-1] + "Z"
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	if _, offset := t.Zone(); offset <= -24*60*60 || offset >= 24*60*60 {
		return time.Time{}, errOffset
	}
	if t.Before(epoch) {
		return time.Time{}, errBeforeEpoch
	}
	return t, nil
}

var (
	epoch          = time.Unix(0, 0)
	errOffset      = errors.New("rfc3339: a zone offset is at most 23:59")
	errBeforeEpoch = errors.New("rfc3339: a time before 1970 (0001-01-01 is an unset time)")
)
