package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// The bounds of a function of production code: its lines, from func to its closing brace, and its
// cyclomatic complexity, as gocyclo counts it.
const (
	maxFuncLines      = 70
	maxFuncComplexity = 15
)

// TestFunctionSize holds every function of the module's production code (its files that are not
// tests) to maxFuncLines lines and a cyclomatic complexity of maxFuncComplexity: a longer one is
// split into steps with names of their own.
func TestFunctionSize(t *testing.T) {
	m := parseModule(t)
	for _, f := range m.files {
		for _, d := range f.ast.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || f.test {
				continue
			}
			start, end := m.fset.Position(fn.Pos()), m.fset.Position(fn.End())
			name := funcName(fn)
			if lines := end.Line - start.Line + 1; lines > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines, more than %d", f.path, start.Line, name, lines, maxFuncLines)
			}
			if c := complexity(fn); c > maxFuncComplexity {
				t.Errorf("%s:%d: %s has a cyclomatic complexity of %d, more than %d", f.path, start.Line, name, c, maxFuncComplexity)
			}
		}
	}
}

// TestComplexity checks complexity against gocyclo's counts of a few functions.
func TestComplexity(t *testing.T) {
	for _, tt := range []struct {
		body string
		want int
	}{
		{"", 1},
		{"if a && b || c { return }", 4},
		{"for range x { if a { } else if b { } }", 4},
		{"switch x { case 1, 2: case 3: default: }", 3},
		{"select { case <-c: case d <- 1: default: }", 3},
		{"f := func() { if a { } }; _ = f", 2},
	} {
		src := "package p\nfunc f() {" + tt.body + "}"
		file, err := parseSource(src)
		if err != nil {
			t.Fatal(err)
		}
		if got := complexity(file.Decls[0].(*ast.FuncDecl)); got != tt.want {
			t.Errorf("complexity of %q = %d, want %d", tt.body, got, tt.want)
		}
	}
}

// complexity is fn's cyclomatic complexity as gocyclo counts it: 1, plus one for each if, for,
// case and select case but the default, && and ||, function literals included.
func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// funcName is fn's name, with its receiver's type.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil {
		return fn.Name.Name
	}
	return fmt.Sprintf("(%s).%s", receiverType(fn.Recv.List[0].Type), fn.Name.Name)
}

func parseSource(src string) (*ast.File, error) {
	return parser.ParseFile(token.NewFileSet(), "p.go", src, parser.SkipObjectResolution)
}
