package docs_test

import (
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// logCall is a message the code logs: a pattern (its literal parts, a variable part matching any
// text) and its level ("" when the level is not known from the call).
type logCall struct {
	pattern *regexp.Regexp
	level   string
	at      string // file:line
}

// slogMethods are slog's logging methods: the index of the message argument, and the level.
var slogMethods = map[string]struct {
	msg   int
	level string
}{
	"Debug": {0, "debug"}, "Info": {0, "info"}, "Warn": {0, "warn"}, "Error": {0, "error"},
	"DebugContext": {1, "debug"}, "InfoContext": {1, "info"}, "WarnContext": {1, "warn"}, "ErrorContext": {1, "error"},
	"Log": {2, ""}, "LogAttrs": {2, ""},
}

// slogLevels are slog's level constants.
var slogLevels = map[string]string{"LevelDebug": "debug", "LevelInfo": "info", "LevelWarn": "warn", "LevelError": "error"}

// logWrapper is a function of the module that logs its msg argument at its level argument
// (payment's logAfterCommit): calls to it are log calls too.
type logWrapper struct{ msg, level int }

// logCalls returns the messages logged by the module's non-test code.
func (m *module) logCalls() []logCall {
	wrappers := m.logWrappers()
	var out []logCall
	for _, f := range m.files {
		if f.test {
			continue
		}
		pkg := m.packages[f.ast.Name.Name]
		ast.Inspect(f.ast, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			msg, level, ok := logArgs(call, wrappers)
			if !ok {
				return true
			}
			parts := m.fold(pkg, msg)
			if lc, ok := newLogCall(parts, level); ok {
				lc.at = f.path + ":" + strconv.Itoa(m.fset.Position(call.Pos()).Line)
				out = append(out, lc)
			}
			return true
		})
	}
	return out
}

// logArgs returns a log call's message argument and its level, if call is one.
func logArgs(call *ast.CallExpr, wrappers map[string]logWrapper) (msg ast.Expr, level string, ok bool) {
	var name string
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		name = fn.Sel.Name
	case *ast.Ident:
		name = fn.Name
	default:
		return nil, "", false
	}
	levelAt := -1
	if sm, isSlog := slogMethods[name]; isSlog {
		if sm.msg >= len(call.Args) {
			return nil, "", false
		}
		msg, level = call.Args[sm.msg], sm.level
		if level == "" {
			levelAt = 1
		}
	} else if h, isWrapper := wrappers[name]; isWrapper && h.msg < len(call.Args) {
		msg, levelAt = call.Args[h.msg], h.level
	} else {
		return nil, "", false
	}
	if levelAt >= 0 && levelAt < len(call.Args) {
		if sel, ok := call.Args[levelAt].(*ast.SelectorExpr); ok {
			level = slogLevels[sel.Sel.Name]
		}
	}
	return msg, level, true
}

// logWrappers finds the module's functions with a string parameter msg and a slog.Level parameter.
func (m *module) logWrappers() map[string]logWrapper {
	out := map[string]logWrapper{}
	for _, f := range m.files {
		for _, d := range f.ast.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			h := logWrapper{msg: -1, level: -1}
			i := 0
			for _, field := range fn.Type.Params.List {
				for _, n := range field.Names {
					switch {
					case n.Name == "msg" && exprName(field.Type) == "string":
						h.msg = i
					case exprName(field.Type) == "slog.Level":
						h.level = i
					}
					i++
				}
			}
			if h.msg >= 0 && h.level >= 0 {
				out[fn.Name.Name] = h
			}
		}
	}
	return out
}

// fold returns the parts of a message expression: its string literals and the values of string
// constants, and "" for a part only known when it runs.
func (m *module) fold(pkg *packageIndex, e ast.Expr) []*string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return []*string{&s}
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return append(m.fold(pkg, e.X), m.fold(pkg, e.Y)...)
		}
	case *ast.Ident:
		if s, ok := pkg.consts[e.Name]; ok {
			return []*string{&s}
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && m.packages[x.Name] != nil {
			if s, ok := m.packages[x.Name].consts[e.Sel.Name]; ok {
				return []*string{&s}
			}
		}
	case *ast.CallExpr:
		if fn, ok := e.Fun.(*ast.SelectorExpr); ok && fn.Sel.Name == "Sprintf" && len(e.Args) > 0 {
			if lit, ok := e.Args[0].(*ast.BasicLit); ok {
				format, _ := strconv.Unquote(lit.Value)
				var parts []*string
				for i, piece := range regexp.MustCompile(`%[a-z]`).Split(format, -1) {
					if i > 0 {
						parts = append(parts, nil)
					}
					parts = append(parts, &piece)
				}
				return parts
			}
		}
	}
	return []*string{nil}
}

// newLogCall makes the pattern of a message's parts (nil: any text). A message with no literal
// text at all (a variable, another library's message) is no message to document.
func newLogCall(parts []*string, level string) (logCall, bool) {
	var re strings.Builder
	literal := 0
	for _, p := range parts {
		if p == nil {
			re.WriteString(".+")
			continue
		}
		literal += len(strings.TrimSpace(*p))
		re.WriteString(regexp.QuoteMeta(*p))
	}
	if literal < 8 {
		return logCall{}, false
	}
	return logCall{pattern: regexp.MustCompile("^" + re.String() + "$"), level: level}, true
}

// quotedLog is a log message quoted in prose: a code span right after "log" or a word like it,
// with the spans listed after it (`a`, `b` or `c`).
var (
	quotedLog  = regexp.MustCompile("(?i)\\b(?:log|logs|logged|log lines?|the warning|the error log|the warn log|the info log)(?:\\s+for)?\\s+`([^`]+)`")
	listedSpan = regexp.MustCompile("^(?:,|,?\\s+and|,?\\s+or)\\s+`([^`]+)`")
)

// proseLogs returns the log messages quoted in text.
func proseLogs(text string) []string {
	var out []string
	for _, idx := range quotedLog.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, strings.Join(strings.Fields(text[idx[2]:idx[3]]), " "))
		rest := text[idx[1]:]
		for {
			m := listedSpan.FindStringSubmatchIndex(rest)
			if m == nil {
				break
			}
			out = append(out, strings.Join(strings.Fields(rest[m[2]:m[3]]), " "))
			rest = rest[m[1]:]
		}
	}
	return out
}

// documentedLog is a row of the log table of operations.md.
type documentedLog struct{ level, message string }

func logTable(t *testing.T) []documentedLog {
	t.Helper()
	ops := readPage(t, "docs/operations.md")
	var out []documentedLog
	for _, tb := range tables(ops.section(t, "Logs")) {
		lc, mc := tb.column("level"), tb.column("message")
		if lc < 0 || mc < 0 {
			continue
		}
		for _, row := range tb.rows {
			if s := spans(row[mc]); len(s) == 1 {
				out = append(out, documentedLog{level: row[lc], message: s[0]})
			} else {
				t.Errorf("docs/operations.md, Logs: row %q has no message in one code span", row)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/operations.md, Logs: no table with a level and a message column")
	}
	return out
}

// logged returns the calls that log message, at level unless level is "".
func logged(calls []logCall, message, level string) []logCall {
	var out []logCall
	for _, c := range calls {
		if c.pattern.MatchString(message) && (level == "" || c.level == "" || c.level == level) {
			out = append(out, c)
		}
	}
	return out
}

// TestLogLines checks the log messages the docs quote against the messages the code logs: the
// log table of operations.md with their levels, and those quoted in prose; and that every warning
// and error of the worker has a row in the table.
func TestLogLines(t *testing.T) {
	t.Parallel()
	calls := parseModule(t).logCalls()
	if len(calls) < 50 {
		t.Fatalf("only %d log calls found in the code: the extraction is broken", len(calls))
	}
	table := logTable(t)
	for _, row := range table {
		if len(logged(calls, row.message, row.level)) == 0 {
			t.Errorf("docs/operations.md, Logs: the code logs no %s %q", row.level, row.message)
		}
	}
	quoted := 0
	for _, p := range pages(t) {
		for _, msg := range proseLogs(p.text()) {
			quoted++
			if len(logged(calls, msg, "")) == 0 {
				t.Errorf("%s: the log %q is not a message the code logs", p.path, msg)
			}
		}
	}
	t.Logf("%d log calls in the code, %d rows in the log table, %d messages quoted in prose", len(calls), len(table), quoted)
	for _, c := range calls {
		if c.level != "warn" && c.level != "error" || !workerCode(c.at) {
			continue
		}
		documented := false
		for _, row := range table {
			documented = documented || (c.level == row.level && c.pattern.MatchString(row.message))
		}
		if !documented {
			t.Errorf("%s logs the %s %s, which docs/operations.md, Logs, does not list", c.at, c.level, c.pattern)
		}
	}
}

// workerCode reports whether path is the worker's code, whose warnings an operator sees: not the
// bench command, nor a support package of the tests.
func workerCode(path string) bool {
	for _, prefix := range []string{"cmd/bench/", "internal/pgtest/", "internal/kafkatest/", "internal/testlog/", "internal/notify/notifytest/"} {
		if strings.HasPrefix(path, prefix) {
			return false
		}
	}
	return true
}

func TestProseLogs(t *testing.T) {
	t.Parallel()
	got := proseLogs("the warn log `a b`, then logs for `c\n  d`, `e` or `f` (with `g`) and log lines `h` and `i`; not `j`")
	want := []string{"a b", "c d", "e", "f", "h", "i"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("proseLogs = %q, want %q", got, want)
	}
}
