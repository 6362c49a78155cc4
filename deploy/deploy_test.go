package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
