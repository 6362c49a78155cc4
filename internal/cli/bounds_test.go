package cli

import (
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestEveryNumberIsBounded checks that every duration and count setting has a bound: an absurd
// value (MAX_IN_FLIGHT=100000000, LAG_INTERVAL=1ns) is refused at start rather than run with.
func TestEveryNumberIsBounded(t *testing.T) {
	t.Parallel()
	for _, s := range settingsOf(bundledRoutes) {
		if (s.Meta == "DURATION" || s.Meta == "N" || s.Meta == "PERCENT") && s.Bound == nil {
			t.Errorf("%s (--%s) has no Bound", s.Env, s.Flag)
		}
	}
}

// edges are the least and the most value of a bound, and the values just outside it.
type edges struct{ least, most, below, above string }

// edgesOf reads a bound's edges from its description ("100ms to 10m", "1 to 10000").
func edgesOf(t *testing.T, b envflag.Bound) edges {
	t.Helper()
	least, most, ok := strings.Cut(b.String(), " to ")
	if !ok {
		t.Fatalf("bound %q: not LEAST to MOST", b)
	}
	if lo, err := strconv.Atoi(least); err == nil {
		hi, err := strconv.Atoi(most)
		if err != nil {
			t.Fatalf("bound %q: %v", b, err)
		}
		return edges{least, most, strconv.Itoa(lo - 1), strconv.Itoa(hi + 1)}
	}
	lo, err1 := time.ParseDuration(least)
	hi, err2 := time.ParseDuration(most)
	if err1 != nil || err2 != nil {
		t.Fatalf("bound %q: %v, %v", b, err1, err2)
	}
	return edges{least, most, (lo - time.Nanosecond).String(), (hi + time.Nanosecond).String()}
}

// compatible are values of the settings checked against one another that let either edge of the
// other pass.
var compatible = map[string]string{"RETRY_INITIAL_INTERVAL": "10ms", "RETRY_MAX_INTERVAL": "1h",
	"RECONCILE_AFTER": "1s", "RECONCILE_MAX_AGE": "8760h"}

// commandOf is a command that reads s.
func commandOf(t *testing.T, s *settings.Var) string {
	t.Helper()
	for _, c := range commands() {
		if s.Use&c.use != 0 {
			return c.name
		}
	}
	t.Fatalf("no command reads %s", s.Env)
	return ""
}

// TestBounds checks every bound from both sides, through the environment as an operator sets it:
// its edges are accepted, the values just outside are refused naming the setting and the range.
func TestBounds(t *testing.T) {
	t.Parallel()
	for _, s := range settingsOf(bundledRoutes) {
		if s.Bound == nil {
			continue
		}
		t.Run(s.Env, func(t *testing.T) {
			t.Parallel()
			e := edgesOf(t, s.Bound)
			command := commandOf(t, s)
			for _, v := range []string{e.least, e.most} {
				env := maps.Clone(compatible)
				env[s.Env] = v
				parseConfig(t, env, command)
			}
			for _, v := range []string{e.below, e.above} {
				env := maps.Clone(compatible)
				env[s.Env] = v
				fs := envflag.NewSet(command, findCommand(command).selected(settingsOf(bundledRoutes)))
				_, err := resolve(fs, func(k string) string { return env[k] }, bundledRoutes, settingsOf(bundledRoutes))
				want := s.Env + ": must be from " + s.Bound.String() + `, got "` + v + `"`
				if v == "0" || strings.HasPrefix(v, "-") {
					want = s.Env + `: must be a positive number, got "` + v + `"` // the form's error comes first
				}
				if err == nil || err.Error() != want {
					t.Errorf("%s=%s: got %v, want %q", s.Env, v, err, want)
				}
			}
		})
	}
}

// TestBoundsPassTheWorker checks that whatever the bounds allow, the worker accepts: its own
// validation names its fields (Config.SessionTimeout), which mean nothing to an operator, so it must
// never be what refuses a setting. Each bounded setting is tried at both edges, the others at
// their defaults.
func TestBoundsPassTheWorker(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	logger := testlog.New(t)
	for _, s := range settingsOf(bundledRoutes) {
		if s.Bound == nil || s.Use&settings.UseWorker == 0 {
			continue
		}
		e := edgesOf(t, s.Bound)
		for _, v := range []string{e.least, e.most} {
			env := maps.Clone(compatible)
			env[s.Env] = v
			cfg := parseConfig(t, env, "run")
			routes, err := cfg.workerRoutes(routeDeps{logger: logger})
			if err != nil {
				t.Fatalf("%s=%s: %v", s.Env, v, err)
			}
			w := &worker{cfg: cfg, logger: logger, pool: db.Pool}
			if _, err := inboxworker.New(w.workerConfig(routes, nil, nil)); err != nil {
				t.Errorf("%s=%s: the worker refuses it: %v", s.Env, v, err)
			}
		}
	}
}
