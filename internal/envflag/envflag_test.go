package envflag

import (
	"errors"
	"flag"
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
