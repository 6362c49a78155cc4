package payment_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestNeverDeclines: a payment that happened is applied however late, and never held back by a
// limit: the payment handler never returns inboxworker.Expired or inboxworker.Suppressed, nor
// declines a message through package inbox.
func TestNeverDeclines(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && (pkg.Name == "inboxworker" && (sel.Sel.Name == "Expired" || sel.Sel.Name == "Suppressed") ||
				pkg.Name == "inbox" && sel.Sel.Name == "Decline") {
				t.Errorf("%s: the payment handler uses %s.%s: a payment is never declined", name, pkg.Name, sel.Sel.Name)
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source file of the payment package found")
	}
}
