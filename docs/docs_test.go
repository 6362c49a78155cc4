package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/inboxworker/inboxworker/deploy"
	"github.com/inboxworker/inboxworker/internal/cli"
)

// externalPackages are the packages other than the module's that the docs may name as
// package.Symbol; their names are not checked. A package.Symbol of any other package fails, so
// that a renamed package of the module is not taken for someone else's.
var externalPackages = map[string]bool{
	"pgx": true, "pgxpool": true, "pgconn": true, "tracelog": true, "kafka": true, "kfake": true,
	"kgo": true, "kmsg": true, "slog": true, "json": true, "http": true, "time": true, "context": true,
	"fmt": true, "errors": true, "os": true, "backoff": true, "goose": true, "prometheus": true,
	"testing": true, "synctest": true, "sync": true, "strings": true, "sql": true, "io": true,
}

// symbolSpan is a code span that reads as a Go name with its package: pkg.Name, pkg.Type.Member,
// optionally followed by a call's parentheses or a composite literal's braces.
var symbolSpan = regexp.MustCompile(`^([a-z][a-z0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?(?:\(.*\)|\{.*\})?$`)

// goSelector is pkg.Name in a Go code block.
var goSelector = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?`)

// fileExtensions are what a span like payment.go ends with: a file name, not a symbol.
var fileExtensions = map[string]bool{"go": true, "md": true, "yml": true, "yaml": true, "json": true, "sql": true}

// spanAttribute says whether a span matched by symbolSpan is a span attribute of the worker's
// (inboxworker.outcome): the package inboxworker's own names in the docs are its exported ones.
func spanAttribute(sm []string) bool {
	return sm[1] == "inboxworker" && sm[3] == "" && !unicode.IsUpper(rune(sm[2][0]))
}

// TestSymbols checks that every Go name the docs write with its package resolves in the module's
// source, and that every test function they name exists.
func TestSymbols(t *testing.T) {
	t.Parallel()
	m := parseModule(t)
	checked := 0
	for _, p := range pages(t) {
		for _, s := range spans(p.text()) {
			if sub := testName.FindStringSubmatch(strings.SplitN(s, "/", 2)[0]); sub != nil && s != sub[1] {
				checked++
				if !m.tests[sub[0]] {
					t.Errorf("%s: `%s`: no test function %s in the module", p.path, s, sub[0])
				}
				continue
			}
			if sm := symbolSpan.FindStringSubmatch(s); sm != nil && !fileExtensions[sm[2]] && !spanAttribute(sm) {
				checked += m.checkSymbol(t, p.path, s, sm[1], sm[2], sm[3], true)
			}
		}
		for _, b := range p.code {
			if b.lang != "go" {
				continue
			}
			for _, sm := range goSelector.FindAllStringSubmatch(b.text, -1) {
				checked += m.checkSymbol(t, p.path, sm[0], sm[1], sm[2], sm[3], false)
			}
		}
	}
	t.Logf("%d Go names and test functions checked", checked)
	if checked < 50 {
		t.Errorf("only %d names found in the docs: the extraction is broken", checked)
	}
}

// checkSymbol checks pkg.name(.member) as written in text on page. strict fails an unknown
// package whose name is capitalised like an exported Go name; in code, an unknown name is a
// variable. It returns 1 if the name was checked.
func (m *module) checkSymbol(t *testing.T, page, text, pkg, name, member string, strict bool) int {
	t.Helper()
	idx := m.packages[pkg]
	switch {
	case idx == nil && (externalPackages[pkg] || len(pkg) == 1): // another module's, or a variable (t.Log)
		return 0
	case idx == nil:
		if strict && name[0] >= 'A' && name[0] <= 'Z' {
			t.Errorf("%s: `%s`: no package %s in the module (add it to externalPackages if it is another module's)",
				page, text, pkg)
			return 1
		}
		return 0
	case !idx.names[name]:
		t.Errorf("%s: `%s`: package %s has no %s", page, text, pkg, name)
	case member != "" && !m.hasMember(pkg, name, member, 0):
		t.Errorf("%s: `%s`: %s.%s has no method or field %s", page, text, pkg, name, member)
	}
	return 1
}

// helpFlag is a flag line of `worker --help`: the flag, its variable if it has one, its default.
var helpFlag = regexp.MustCompile(`^\s+--([a-z0-9-]+)(?: [A-Z]+)?\s+\((?:env ([A-Z0-9_]+), )?default (unset|"([^"]*)")(?:, from (\S+ to \S+))?\)$`)

// helpSetting is a setting as `worker --help` prints it.
type helpSetting struct {
	flag, env string
	unset     bool
	value     string
	// bound is the range the help gives a duration or a count ("100ms to 10m"), else "".
	bound string
}

// helpSettings runs `worker --help` through cli.Main, the binary's own entry point, and returns
// the settings it lists.
func helpSettings(t *testing.T) []helpSetting {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := cli.Main(context.Background(), []string{"--help"}, func(string) string { return "" },
		&stdout, &stderr); code != 0 {
		t.Fatalf("worker --help: exit code %d\n%s%s", code, stdout.String(), stderr.String())
	}
	var out []helpSetting
	for line := range strings.Lines(stdout.String() + stderr.String()) {
		if m := helpFlag.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			out = append(out, helpSetting{flag: m[1], env: m[2], unset: m[3] == "unset", value: m[4], bound: m[5]})
		}
	}
	if len(out) < 20 {
		t.Fatalf("worker --help lists %d flags; is its format still `--flag META  (env VAR, default \"X\")`?\n%s",
			len(out), stdout.String())
	}
	return out
}

// documentedSetting is a setting's row in a docs table: its flag cell and default cell.
type documentedSetting struct {
	page, flag, def, accepts string
}

// settingRows returns the settings of every table with a "variable" and a "default" column
// among lines: a row may name several variables, with one default each (`a` / `b`) or one for all.
func settingRows(t *testing.T, page string, lines []string) map[string]documentedSetting {
	t.Helper()
	out := map[string]documentedSetting{}
	for _, tb := range tables(lines) {
		vc, dc, fc, ac := tb.column("variable"), tb.column("default"), tb.column("flag"), tb.column("accepts")
		if vc < 0 || dc < 0 {
			continue
		}
		for _, row := range tb.rows {
			vars, def := spans(row[vc]), row[dc]
			defaults := spans(def)
			for i, v := range vars {
				d := documentedSetting{page: page, def: def}
				if fc >= 0 {
					d.flag = row[fc]
				}
				if ac >= 0 {
					d.accepts = row[ac]
				}
				if !strings.HasPrefix(def, "unset") && len(defaults) == len(vars) && len(vars) > 1 {
					d.def = "`" + defaults[i] + "`"
				}
				out[v] = d
			}
		}
	}
	return out
}

// defaultMatches reports whether a documented default cell says what --help prints.
func defaultMatches(cell string, s helpSetting) bool {
	if s.unset {
		return strings.HasPrefix(cell, "unset")
	}
	got := spans(cell)
	return len(got) > 0 && got[0] == s.value
}

// TestSettingsDocumented checks every setting `worker --help` prints against the settings table
// of operations.md (its flag and its default), that table and the README's against --help, and
// that every flag without a variable is mentioned in operations.md.
func TestSettingsDocumented(t *testing.T) {
	t.Parallel()
	help := helpSettings(t)
	ops := readPage(t, "docs/operations.md")
	reference := settingRows(t, ops.path, ops.section(t, "Settings"))
	readme := readPage(t, "README.md")
	others := settingRows(t, readme.path, readme.prose)
	byEnv := map[string]helpSetting{}
	for _, s := range help {
		if s.env == "" {
			if !strings.Contains(ops.text(), "`--"+s.flag+"`") {
				t.Errorf("worker --help has --%s, which docs/operations.md does not mention as `--%s`", s.flag, s.flag)
			}
			continue
		}
		byEnv[s.env] = s
		row, ok := reference[s.env]
		switch {
		case !ok:
			t.Errorf("setting %s (--%s) has no row in docs/operations.md, Settings", s.env, s.flag)
		case row.flag != "`--"+s.flag+"`":
			t.Errorf("docs/operations.md: %s's flag is %s, worker --help says --%s", s.env, row.flag, s.flag)
		case !defaultMatches(row.def, s):
			t.Errorf("docs/operations.md: %s's default is %q, worker --help says %s", s.env, row.def, helpDefault(s))
		case s.bound != "" && !strings.Contains(row.accepts, s.bound):
			t.Errorf("docs/operations.md: %s accepts %q, worker --help gives the range %s", s.env, row.accepts, s.bound)
		}
	}
	for env, row := range others {
		reference[env+" (README)"] = row
		if s, ok := byEnv[env]; ok && !defaultMatches(row.def, s) {
			t.Errorf("%s: %s's default is %q, worker --help says %s", row.page, env, row.def, helpDefault(s))
		}
	}
	for env, row := range reference {
		if _, ok := byEnv[strings.TrimSuffix(env, " (README)")]; !ok {
			t.Errorf("%s documents a setting %s, which worker --help does not list", row.page, env)
		}
	}
}

func helpDefault(s helpSetting) string {
	if s.unset {
		return "unset"
	}
	return fmt.Sprintf("%q", s.value)
}

// runbookBase is where an alert's runbook_url must point: a section of operations.md, on GitHub.
const runbookBase = "https://github.com/inboxworker/inboxworker/blob/main/docs/operations.md#"

// TestAlertRunbooks checks that every alert carries a runbook_url pointing to its own section of
// operations.md, which says what the alert means, what to check and what to do, and that every
// runbook section is an alert's.
func TestAlertRunbooks(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "deploy", deploy.AlertRules))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("%s: %v", deploy.AlertRules, err)
	}
	ops := readPage(t, "docs/operations.md")
	anchors := ops.anchors()
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookBase)
			switch {
			case url == "":
				t.Errorf("alert %s has no runbook_url annotation", r.Alert)
			case !ok:
				t.Errorf("alert %s: runbook_url %q does not start with %s", r.Alert, url, runbookBase)
			case anchor != slugify(r.Alert):
				t.Errorf("alert %s: runbook_url anchor #%s, want its own section #%s", r.Alert, anchor, slugify(r.Alert))
			case !anchors[anchor]:
				t.Errorf("alert %s: docs/operations.md has no section #%s", r.Alert, anchor)
			default:
				checkRunbook(t, strings.Join(ops.section(t, r.Alert), "\n"), r.Alert)
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("no alert found in the rules")
	}
	for _, line := range ops.section(t, "Runbooks") {
		if name, ok := strings.CutPrefix(line, "### "); ok && !alerts[name] {
			t.Errorf("docs/operations.md has a runbook for %s, which is not an alert of %s", name, deploy.AlertRules)
		}
	}
}

func checkRunbook(t *testing.T, section, alert string) {
	t.Helper()
	for _, part := range []string{"**What it means.**", "**What to check.**", "**What to do.**"} {
		if !strings.Contains(section, part) {
			t.Errorf("docs/operations.md, runbook of %s: no %s", alert, part)
		}
	}
}

// mdLink is a Markdown link or image: its target, up to a space (a title) or the closing parenthesis.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestLinks checks that every relative link of the README and docs/ names a file that exists and,
// for a Markdown page, an anchor that one of its headings has.
func TestLinks(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, p := range pages(t) {
		text := codeSpan.ReplaceAllString(p.text(), "``")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			resolved := p.path
			if file != "" {
				resolved = path.Join(path.Dir(p.path), file)
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(resolved))); err != nil {
				t.Errorf("%s: link %s: no file %s", p.path, target, resolved)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(resolved, ".md") {
				t.Errorf("%s: link %s: an anchor into a file that is not a page", p.path, target)
			} else if !readPage(t, resolved).anchors()[anchor] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", p.path, target, resolved, anchor)
			}
		}
	}
	t.Logf("%d relative links checked", checked)
	if checked < 30 {
		t.Errorf("only %d relative links found: the extraction is broken", checked)
	}
}

// TestFileMap checks the File Map of design.md against the module's Go files that are not tests:
// one row each.
func TestFileMap(t *testing.T) {
	t.Parallel()
	design := readPage(t, "docs/design.md")
	rows := map[string]bool{}
	for _, tb := range tables(design.section(t, "File Map")) {
		for _, row := range tb.rows {
			if s := spans(row[0]); len(s) > 0 {
				if rows[s[0]] {
					t.Errorf("docs/design.md, File Map: %s has two rows", s[0])
				}
				rows[s[0]] = true
			}
		}
	}
	files := parseModule(t).nonTestFiles()
	for _, f := range files {
		if !rows[f] {
			t.Errorf("docs/design.md, File Map: no row for %s; add | `%s` | what it holds |", f, f)
		}
		delete(rows, f)
	}
	for f := range rows {
		t.Errorf("docs/design.md, File Map: a row for %s, which is not a Go file of the module (or is a test)", f)
	}
	if len(files) < 50 {
		t.Errorf("only %d Go files found", len(files))
	}
}

// TestReadmeTestCommand checks that CI runs the test command the README gives.
func TestReadmeTestCommand(t *testing.T) {
	t.Parallel()
	find := func(name, text string) []string {
		var cmds []string
		for line := range strings.Lines(text) {
			line = strings.TrimSpace(line)
			if cmd, _, _ := strings.Cut(line, "#"); strings.HasPrefix(line, "go test ") {
				cmds = append(cmds, strings.TrimSpace(cmd))
			}
		}
		if len(cmds) == 0 {
			t.Fatalf("%s has no go test command", name)
		}
		return cmds
	}
	readme := readPage(t, "README.md")
	var blocks strings.Builder
	for _, b := range readme.code {
		blocks.WriteString(b.text)
	}
	want := find("README.md", blocks.String())
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if got := find(".ci/run", string(ci)); !slices.Equal(got, want) {
		t.Errorf(".ci/run runs %q, the README says %q", got, want)
	}
}
