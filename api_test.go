package inboxworker_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite api/inboxworker.txt from the public packages")

// apiFile lists the public API, one declaration a line, as Go's own api/ files do: a change to it
// shows in review as a change to this file.
const apiFile = "api/inboxworker.txt"

// TestAPI holds the public packages to the listing in apiFile, so that a change to the public API
// is deliberate: it fails on any exported name added, removed or changed until the listing is
// rewritten (go test -run TestAPI -update-api .) and the change is reviewed with it.
func TestAPI(t *testing.T) {
	var got []string
	for _, pkg := range []struct{ name, dir string }{{"inboxworker", "."}, {"inboxtype", "inboxtype"}} {
		lines, err := apiOf(pkg.name, pkg.dir)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, lines...)
	}
	listing := strings.Join(got, "\n") + "\n"
	if *updateAPI {
		if err := os.WriteFile(apiFile, []byte(listing), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatalf("%v; write it with go test -run TestAPI -update-api .", err)
	}
	want := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("public API: new, not in %s: %s", apiFile, l)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("public API: gone, still in %s: %s", apiFile, l)
		}
	}
	if t.Failed() {
		t.Logf("a deliberate change: go test -run TestAPI -update-api . and review %s with it", apiFile)
	}
}

// TestAPIListsChanges makes sure the listing sees what a change to the API is: a field's type, a
// method of an interface, a parameter, a constant's value.
func TestAPIListsChanges(t *testing.T) {
	before := `package p
type T struct{ A int; b int }
type I interface{ M(x int) error }
func F(a, b string) (int, error) { return 0, nil }
func (t *T) N() {}
const C = 1
var V = 2
`
	for _, change := range []struct{ name, from, to string }{
		{"field type", "A int", "A int64"},
		{"interface method", "M(x int) error", "M(x int) (int, error)"},
		{"parameter", "F(a, b string)", "F(a string, b []byte)"},
		{"receiver", "(t *T) N()", "(t T) N()"},
		{"constant", "C = 1", "C = 2"},
		{"new name", "var V = 2", "var V, W = 2, 3"},
	} {
		after := strings.Replace(before, change.from, change.to, 1)
		a, b := apiOfSource(t, before), apiOfSource(t, after)
		if slices.Equal(a, b) {
			t.Errorf("%s: the listing does not change from %q to %q", change.name, change.from, change.to)
		}
	}
	if got := apiOfSource(t, strings.Replace(before, "b int", "c string", 1)); !slices.Equal(got, apiOfSource(t, before)) {
		t.Errorf("an unexported field changed the listing")
	}
}

func apiOfSource(t *testing.T, src string) []string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/p.go", []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	lines, err := apiOf("p", dir)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// apiOf lists the exported declarations of package name in dir, its tests left out, sorted.
func apiOf(name, dir string) ([]string, error) {
	fset := token.NewFileSet()
	l := &apiLister{fset: fset, prefix: "pkg " + name + ", "}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if f.Name.Name != name {
			return nil, fmt.Errorf("%s: package %s, want %s", path, f.Name.Name, name)
		}
		for _, d := range f.Decls {
			l.decl(d)
		}
	}
	slices.Sort(l.lines)
	return l.lines, nil
}

type apiLister struct {
	fset   *token.FileSet
	prefix string
	lines  []string
}

func (l *apiLister) add(format string, args ...any) {
	l.lines = append(l.lines, l.prefix+fmt.Sprintf(format, args...))
}

func (l *apiLister) decl(d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return
		}
		if d.Recv == nil {
			l.add("func %s%s", d.Name.Name, l.signature(d.Type))
			return
		}
		recv := d.Recv.List[0].Type
		if !ast.IsExported(strings.TrimPrefix(l.expr(recv), "*")) {
			return
		}
		l.add("method (%s) %s%s", l.expr(recv), d.Name.Name, l.signature(d.Type))
	case *ast.GenDecl:
		for _, s := range d.Specs {
			l.spec(d.Tok, s)
		}
	}
}

func (l *apiLister) spec(tok token.Token, s ast.Spec) {
	switch s := s.(type) {
	case *ast.ValueSpec:
		for i, n := range s.Names {
			if !n.IsExported() {
				continue
			}
			line := tok.String() + " " + n.Name
			if s.Type != nil {
				line += " " + l.expr(s.Type)
			}
			if i < len(s.Values) {
				line += " = " + l.expr(s.Values[i])
			}
			l.add("%s", line)
		}
	case *ast.TypeSpec:
		if s.Name.IsExported() {
			l.typeSpec(s)
		}
	}
}

func (l *apiLister) typeSpec(s *ast.TypeSpec) {
	name := s.Name.Name
	if s.Assign.IsValid() {
		l.add("type %s = %s", name, l.expr(s.Type))
		return
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		l.add("type %s struct", name)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				l.add("type %s struct, embedded %s", name, l.expr(f.Type))
			}
			for _, n := range f.Names {
				if n.IsExported() {
					l.add("type %s struct, %s %s", name, n.Name, l.expr(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		l.add("type %s interface", name)
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				l.add("type %s interface, embedded %s", name, l.expr(m.Type))
			}
			for _, n := range m.Names {
				l.add("type %s interface, %s%s", name, n.Name, l.signature(m.Type.(*ast.FuncType)))
			}
		}
	default:
		l.add("type %s %s", name, l.expr(s.Type))
	}
}

// signature is ft without its parameters' names, as they are no part of the API.
func (l *apiLister) signature(ft *ast.FuncType) string {
	s := "(" + l.types(ft.Params) + ")"
	switch results := l.types(ft.Results); {
	case ft.Results == nil || len(ft.Results.List) == 0:
	case len(ft.Results.List) == 1 && len(ft.Results.List[0].Names) <= 1:
		s += " " + results
	default:
		s += " (" + results + ")"
	}
	return s
}

func (l *apiLister) types(fields *ast.FieldList) string {
	if fields == nil {
		return ""
	}
	var types []string
	for _, f := range fields.List {
		for range max(1, len(f.Names)) {
			types = append(types, l.expr(f.Type))
		}
	}
	return strings.Join(types, ", ")
}

func (l *apiLister) expr(e ast.Expr) string {
	if ft, ok := e.(*ast.FuncType); ok {
		return "func" + l.signature(ft) // a func-typed field or parameter, its parameters' names left out
	}
	var b bytes.Buffer
	if err := printer.Fprint(&b, l.fset, e); err != nil {
		panic(err)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}
