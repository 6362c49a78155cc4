package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/inboxworker/inboxworker/deploy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAlertRules checks the alert rules and runs their unit tests with promtool, and that every
// alert has a unit test.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it): the alert rules are not tested")
	}
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(deploy.AlertRules)},
		{"test", "rules", filepath.Base(deploy.AlertRuleTests)},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Dir(deploy.AlertRules)
		out, err := cmd.CombinedOutput()
		t.Logf("promtool %v:\n%s", args, out)
		if err != nil {
			t.Errorf("promtool %v: %v", args, err)
		}
	}

	rules := read(t, deploy.AlertRules)
	tests := read(t, deploy.AlertRuleTests)
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllStringSubmatch(rules, -1)
	if len(alerts) == 0 {
		t.Fatal("no alert found in the rules")
	}
	for _, a := range alerts {
		if !regexp.MustCompile(`(?m)^\s*alertname: ` + a[1] + `\s*$`).MatchString(tests) {
			t.Errorf("alert %s has no unit test", a[1])
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// selector is a metric of the worker in a PromQL expression, with its label matchers if any.
var selector = regexp.MustCompile(`\b((?:inboxworker|go|process)_[a-zA-Z0-9_]+)\b(\{[^}]*\})?`)

// jobMatcher is the dashboard's job variable, as every selector of its queries must carry it.
const jobMatcher = `job=~"$job"`

// dashboard is what the tests read of the Grafana dashboard.
type dashboard struct {
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		GridPos struct {
			X, Y, W, H int
		} `json:"gridPos"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboard checks the dashboard's panels: each has a query, each query selects the job of the
// $job variable on every metric it names, ids are unique and panels do not overlap; every metric
// the alert rules name is on a panel, and so are the park, the paused routes and the stored dead
// letters.
func TestDashboard(t *testing.T) {
	t.Parallel()
	var d dashboard
	if err := json.Unmarshal([]byte(read(t, deploy.Dashboard)), &d); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			found := selector.FindAllStringSubmatch(target.Expr, -1)
			if len(found) == 0 {
				t.Errorf("panel %q: %q names none of the worker's metrics", p.Title, target.Expr)
			}
			for _, m := range found {
				shown[m[1]] = true
				if !strings.Contains(m[2], jobMatcher) {
					t.Errorf("panel %q: %s in %q does not select %s", p.Title, m[1], target.Expr, jobMatcher)
				}
			}
		}
		for _, q := range d.Panels[:i] {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
	}
	checkQueries(t, d)
	want := []string{"inboxworker_parked_messages", "inboxworker_parked_oldest_seconds",
		"inboxworker_route_paused", "inboxworker_dead_letters_stored_total"}
	for _, m := range selector.FindAllStringSubmatch(read(t, deploy.AlertRules), -1) {
		want = append(want, m[1])
	}
	slices.Sort(want)
	for _, m := range slices.Compact(want) {
		if !shown[m] {
			t.Errorf("no panel of the dashboard shows %s", m)
		}
	}
}

// checkQueries parses every query of the dashboard with promtool, as recording rules of a rule
// file of their own, $job standing for any job.
func checkQueries(t *testing.T, d dashboard) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed: the dashboard's queries are not parsed")
		return
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for _, p := range d.Panels {
		for i, target := range p.Targets {
			expr, err := json.Marshal(strings.ReplaceAll(target.Expr, "$job", ".*"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&rules, "      - record: panel_%d_%d\n        expr: %s\n", p.ID, i, expr)
		}
	}
	file := filepath.Join(t.TempDir(), "dashboard.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules, the dashboard's queries: %v\n%s", err, out)
	}
}
