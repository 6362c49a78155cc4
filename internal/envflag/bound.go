package envflag

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A Bound is the range of values a setting accepts: what lies outside it no deployment means, and
// would only hurt (a worker spinning on a 1ns interval, say). Resolve checks it after Var.Set
// accepted the value's form, so that a value of the wrong form is reported as such.
type Bound interface {
	// Check says why raw, a value Set accepted, is out of bounds. The empty value, "unset" for the
	// settings that allow it, is within.
	Check(raw string) error
	// String describes the range, for the help and the errors: "100ms to 10m".
	String() string
}

// Durations bounds a duration setting to [least, most].
func Durations(least, most time.Duration) Bound { return durations{least, most} }

type durations struct{ least, most time.Duration }

func (b durations) Check(raw string) error {
	if raw == "" {
		return nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < b.least || d > b.most {
		return fmt.Errorf("must be from %s, got %q", b, raw)
	}
	return nil
}

func (b durations) String() string {
	return FormatDuration(b.least) + " to " + FormatDuration(b.most)
}

// Counts bounds a count setting to [least, most].
func Counts(least, most int) Bound { return counts{least, most} }

type counts struct{ least, most int }

func (b counts) Check(raw string) error {
	if raw == "" {
		return nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < b.least || n > b.most {
		return fmt.Errorf("must be from %s, got %q", b, raw)
	}
	return nil
}

func (b counts) String() string { return strconv.Itoa(b.least) + " to " + strconv.Itoa(b.most) }

// FormatDuration writes d as a person would give it: 1h rather than 1h0m0s, 10m rather than 10m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
