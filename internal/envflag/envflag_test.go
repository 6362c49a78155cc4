package envflag

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

type config struct {
	Wait    time.Duration
	Verbose bool
	Name    string
}

func vars() []*Var[config] {
	return []*Var[config]{
		{Env: "WAIT", Flag: "wait", Default: "1s", Meta: "DURATION",
			Set: func(c *config, v string) error { return PositiveDuration(&c.Wait, v) }},
		{Env: "TOKEN", Flag: "token", Meta: "SECRET", Shown: func(v string) string { return "masked:" + v },
			Set: func(c *config, v string) error { return nil }},
		{Flag: "verbose", Default: "false",
			Set: func(c *config, v string) error { return Bool(&c.Verbose, v) }},
	}
}

// TestResolve checks the order of the sources (flag, environment, default), that a bad value is
// named by where it came from, that flags and positional arguments mix, and what is shown.
func TestResolve(t *testing.T) {
	t.Parallel()
	env := map[string]string{"WAIT": "2s", "TOKEN": "t0k"}
	getenv := func(k string) string { return env[k] }
	tests := []struct {
		name       string
		args       []string
		env        func(string) string
		wantWait   time.Duration
		wantArgs   int
		wantErr    string
		wantExplic bool
	}{
		{"Default", nil, func(string) string { return "" }, time.Second, 0, "", false},
		{"Env", nil, getenv, 2 * time.Second, 0, "", true},
		{"FlagWins", []string{"a", "--wait=3s", "b", "--verbose"}, getenv, 3 * time.Second, 2, "", true},
		{"BadEnv", nil, func(k string) string { return map[string]string{"WAIT": "x"}[k] }, 0, 0, `WAIT: invalid duration "x"`, false},
		{"BadFlag", []string{"--wait", "-1s"}, getenv, 0, 0, `--wait: must be positive, got "-1s"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := vars()
			s := NewSet("cmd", vs)
			positional, err := s.Parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			var c config
			r, err := s.Resolve(&c, vs, tt.env)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("got error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Wait != tt.wantWait || len(positional) != tt.wantArgs || r.Explicit["WAIT"] != tt.wantExplic {
				t.Errorf("wait %s, positional %q, explicit %v", c.Wait, positional, r.Explicit["WAIT"])
			}
			if tt.env("TOKEN") != "" && r.Shown["TOKEN"] != "masked:t0k" {
				t.Errorf("TOKEN shown as %q", r.Shown["TOKEN"])
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		"--nope": "unknown flag --nope",
		"--wait": "--wait: missing value",
	} {
		_, err := NewSet("cmd", vars()).Parse([]string{args})
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %q", args, err, want)
		}
	}
	if _, err := NewSet("cmd", vars()).Parse([]string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: got %v, want flag.ErrHelp", err)
	}
}

// TestBound checks that a bound is checked once the value's form is accepted, that unset is within
// it, and that the help gives it.
func TestBound(t *testing.T) {
	t.Parallel()
	type conf struct {
		Every time.Duration
		N     int
	}
	vs := []*Var[conf]{
		{Env: "EVERY", Flag: "every", Default: "5s", Meta: "DURATION", Bound: Durations(100*time.Millisecond, 10*time.Minute),
			Set: func(c *conf, v string) error { return OptionalDuration(&c.Every, v) }},
		{Env: "N", Flag: "n", Default: "256", Meta: "N", Bound: Counts(1, 10000),
			Set: func(c *conf, v string) error { return Limit(&c.N, v) }},
	}
	for _, tt := range []struct {
		env     map[string]string
		wantErr string
	}{
		{map[string]string{"EVERY": "100ms", "N": "10000"}, ""},
		{map[string]string{"EVERY": "10m"}, ""},
		{map[string]string{"EVERY": "1ns"}, `EVERY: must be from 100ms to 10m, got "1ns"`},
		{map[string]string{"EVERY": "10m0.001s"}, `EVERY: must be from 100ms to 10m, got "10m0.001s"`},
		{map[string]string{"EVERY": "soon"}, `EVERY: invalid duration "soon"`},
		{map[string]string{"N": "10001"}, `N: must be from 1 to 10000, got "10001"`},
	} {
		s := NewSet("cmd", vs)
		var c conf
		_, err := s.Resolve(&c, vs, func(k string) string { return tt.env[k] })
		if got := fmt.Sprint(err); (tt.wantErr == "" && err != nil) || (tt.wantErr != "" && got != tt.wantErr) {
			t.Errorf("%v: got %v, want %q", tt.env, err, tt.wantErr)
		}
	}
	// Unset, for a setting that may be: within the bound.
	s := NewSet("cmd", vs)
	if _, err := s.Parse([]string{"--every=", "--n="}); err != nil {
		t.Fatal(err)
	}
	var c conf
	if _, err := s.Resolve(&c, vs, func(string) string { return "" }); err != nil || c.Every != 0 || c.N != 0 {
		t.Errorf("unset: %+v, %v", c, err)
	}
	var help strings.Builder
	PrintHelp(&help, vs, nil)
	if !strings.Contains(help.String(), `(env EVERY, default "5s", from 100ms to 10m)`) {
		t.Errorf("the help does not give the bound:\n%s", help.String())
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 10 * time.Minute: "10m", 90 * time.Minute: "1h30m", 500 * time.Millisecond: "500ms",
		87600 * time.Hour: "87600h", 61 * time.Second: "1m1s", 0: "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%s) = %q, want %q", d, got, want)
		}
	}
}
