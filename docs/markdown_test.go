package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// root is the module's root, seen from this directory.
const root = ".."

// page is one Markdown page of the documentation.
type page struct {
	path  string // relative to the module's root
	lines []string
	// prose is the page with its fenced code blocks blanked out (line for line), code holds the
	// fenced blocks, each with its info string (the language).
	prose []string
	code  []codeBlock
}

type codeBlock struct {
	lang string
	text string
}

// pages returns the README and every page of docs/.
func pages(t *testing.T) []*page {
	t.Helper()
	paths := []string{"README.md"}
	matches, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range matches {
		rel, _ := filepath.Rel(root, m)
		paths = append(paths, filepath.ToSlash(rel))
	}
	var out []*page
	for _, p := range paths {
		out = append(out, readPage(t, p))
	}
	return out
}

func readPage(t *testing.T, path string) *page {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	p := &page{path: path, lines: strings.Split(string(b), "\n")}
	var block *codeBlock
	for _, line := range p.lines {
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		switch {
		case block == nil && fence:
			block = &codeBlock{lang: strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "```"))}
			p.prose = append(p.prose, "")
		case block != nil && fence:
			p.code = append(p.code, *block)
			block = nil
			p.prose = append(p.prose, "")
		case block != nil:
			block.text += line + "\n"
			p.prose = append(p.prose, "")
		default:
			p.prose = append(p.prose, line)
		}
	}
	return p
}

// text is the page's prose, code blocks left out.
func (p *page) text() string { return strings.Join(p.prose, "\n") }

// codeSpan is a Markdown code span; a span may run over a line break, which reads as a space.
var codeSpan = regexp.MustCompile("`([^`]+)`")

// spans returns the code spans of s, white space runs made one space.
func spans(s string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(s, -1) {
		out = append(out, strings.Join(strings.Fields(m[1]), " "))
	}
	return out
}

// heading is a Markdown heading of a page.
type heading struct {
	level int
	text  string
	line  int
}

var headingLine = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*#*\s*$`)

// headings returns the page's headings, code blocks left out.
func (p *page) headings() []heading {
	var out []heading
	for i, line := range p.prose {
		if m := headingLine.FindStringSubmatch(line); m != nil {
			out = append(out, heading{level: len(m[1]), text: m[2], line: i})
		}
	}
	return out
}

// anchors returns the anchors GitHub gives the page's headings.
func (p *page) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range p.headings() {
		slug := slugify(h.text)
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slugify is GitHub's anchor of a heading: its text as rendered (code spans, emphasis and links
// reduced to their text), lower case, every character but letters, digits, spaces, hyphens and
// underscores dropped, spaces made hyphens.
func slugify(text string) string {
	text = inlineLink.ReplaceAllString(text, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// section returns the lines of the page's section under the heading whose text is title, up to the
// next heading of the same level or higher. It fails the test if there is none.
func (p *page) section(t *testing.T, title string) []string {
	t.Helper()
	hs := p.headings()
	for i, h := range hs {
		if h.text != title {
			continue
		}
		end := len(p.prose)
		for _, next := range hs[i+1:] {
			if next.level <= h.level {
				end = next.line
				break
			}
		}
		return p.prose[h.line+1 : end]
	}
	t.Fatalf("%s has no section %q", p.path, title)
	return nil
}

// table is a Markdown table: its header cells and its rows' cells.
type table struct {
	header []string
	rows   [][]string
}

// column returns the index of the header cell named name, or -1.
func (tb table) column(name string) int {
	for i, h := range tb.header {
		if strings.EqualFold(strings.TrimSpace(h), name) {
			return i
		}
	}
	return -1
}

// tables returns the tables among lines.
func tables(lines []string) []table {
	var out []table
	for i := 0; i+1 < len(lines); i++ {
		if !isRow(lines[i]) || !strings.Contains(lines[i+1], "---") || !isRow(lines[i+1]) {
			continue
		}
		tb := table{header: cells(lines[i])}
		i += 2
		for ; i < len(lines) && isRow(lines[i]); i++ {
			tb.rows = append(tb.rows, cells(lines[i]))
		}
		out = append(out, tb)
	}
	return out
}

func isRow(line string) bool { return strings.HasPrefix(strings.TrimSpace(line), "|") }

// cells splits a table row on its unescaped pipes.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var out []string
	var cell strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case line[i] == '|':
			out = append(out, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(line[i])
		}
	}
	return append(out, strings.TrimSpace(cell.String()))
}

func TestSlugify(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ heading, want string }{
		{"Payments: the order state machine", "payments-the-order-state-machine"},
		{"Throughput: `cmd/bench`", "throughput-cmdbench"},
		{"Calls: claim, call, complete", "calls-claim-call-complete"},
		{"A stuck message, a provider down, Postgres down", "a-stuck-message-a-provider-down-postgres-down"},
		{"InboxworkerDeadLetters", "inboxworkerdeadletters"},
		{"Scaling to N instances", "scaling-to-n-instances"},
		{"The gate: outage pauses", "the-gate-outage-pauses"},
		{"max_in_flight and **more**", "max_in_flight-and-more"},
	} {
		if got := slugify(c.heading); got != c.want {
			t.Errorf("slugify(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}
