package envflag

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Common parsers for Var.Set. Their errors do not name the setting: Resolve does.

// NonEmpty accepts any text but blanks.
func NonEmpty(dst *string, v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("must not be empty")
	}
	*dst = v
	return nil
}

// PositiveDuration accepts a duration above zero.
func PositiveDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q", v)
	}
	if d <= 0 {
		return fmt.Errorf("must be positive, got %q", v)
	}
	*dst = d
	return nil
}

// OptionalDuration is PositiveDuration, with "" for 0: not set.
func OptionalDuration(dst *time.Duration, v string) error {
	if v == "" {
		*dst = 0
		return nil
	}
	return PositiveDuration(dst, v)
}

// Limit accepts a positive count, or nothing for no limit (0).
func Limit(dst *int, v string) error {
	if v == "" {
		*dst = 0
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("must be a positive number, got %q", v)
	}
	*dst = n
	return nil
}

// Positive accepts a count above zero.
func Positive(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("must be a positive number, got %q", v)
	}
	*dst = n
	return nil
}

// Bool accepts what strconv.ParseBool does.
func Bool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("invalid boolean %q (use true or false)", v)
	}
	*dst = b
	return nil
}

// Addr accepts host:port, with a port from 0 to 65535.
func Addr(dst *string, v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("invalid address %q (use host:port)", v)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("invalid port in %q", v)
	}
	*dst = v
	return nil
}

// AddrList accepts a comma-separated list of at least one host:port, blanks ignored.
func AddrList(dst *[]string, v string) error {
	var out []string
	for a := range strings.SplitSeq(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := Addr(&a, a); err != nil {
			return err
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return errors.New("must list at least one broker (host:port)")
	}
	*dst = out
	return nil
}

// OneOf accepts one of choices, what the setting names (an ordering, a scheme).
func OneOf(dst *string, v, what string, choices ...string) error {
	if slices.Contains(choices, v) {
		*dst = v
		return nil
	}
	return fmt.Errorf("unknown %s %q (use %s or %s)", what, v, strings.Join(choices[:len(choices)-1], ", "),
		choices[len(choices)-1])
}
