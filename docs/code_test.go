package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// sourceFile is one parsed Go file of the module.
type sourceFile struct {
	path string // relative to the module's root, with slashes
	test bool
	ast  *ast.File
}

// packageIndex is what a package declares at its top level, by name.
type packageIndex struct {
	names   map[string]bool            // funcs, types, vars, consts
	members map[string]map[string]bool // a type's methods and fields (interface methods included)
	embeds  map[string][]string        // the types a type embeds, by name
	aliases map[string]string          // a type alias's target, "pkg.Type" or "Type"
	consts  map[string]string          // string constants' values
}

// module is the parsed source of the whole module.
type module struct {
	fset     *token.FileSet
	files    []sourceFile
	packages map[string]*packageIndex // by package name (names shared by two packages are merged)
	tests    map[string]bool          // Test, Benchmark, Fuzz and Example functions
}

var (
	parseOnce sync.Once
	parsed    *module
	parseErr  error
)

// parseModule parses every Go file of the module once per test binary.
func parseModule(t *testing.T) *module {
	t.Helper()
	parseOnce.Do(func() { parsed, parseErr = loadModule() })
	if parseErr != nil {
		t.Fatal(parseErr)
	}
	return parsed
}

func loadModule() (*module, error) {
	fset := token.NewFileSet()
	m := &module{fset: fset, packages: map[string]*packageIndex{}, tests: map[string]bool{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		sf := sourceFile{path: filepath.ToSlash(rel), test: strings.HasSuffix(name, "_test.go"), ast: f}
		m.files = append(m.files, sf)
		m.index(sf)
		return nil
	})
	return m, err
}

func (m *module) index(sf sourceFile) {
	if sf.test {
		for _, d := range sf.ast.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && isTestName(fn.Name.Name) {
				m.tests[fn.Name.Name] = true
			}
		}
		if strings.HasSuffix(sf.ast.Name.Name, "_test") {
			return
		}
	}
	pkg := m.packages[sf.ast.Name.Name]
	if pkg == nil {
		pkg = &packageIndex{names: map[string]bool{}, members: map[string]map[string]bool{},
			embeds: map[string][]string{}, aliases: map[string]string{}, consts: map[string]string{}}
		m.packages[sf.ast.Name.Name] = pkg
	}
	for _, d := range sf.ast.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				pkg.names[d.Name.Name] = true
			} else if recv := receiverType(d.Recv.List[0].Type); recv != "" {
				pkg.member(recv, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				pkg.spec(s)
			}
		}
	}
}

func (pkg *packageIndex) member(typ, name string) {
	if pkg.members[typ] == nil {
		pkg.members[typ] = map[string]bool{}
	}
	pkg.members[typ][name] = true
}

func (pkg *packageIndex) spec(s ast.Spec) {
	switch s := s.(type) {
	case *ast.ValueSpec:
		for i, n := range s.Names {
			pkg.names[n.Name] = true
			if i < len(s.Values) {
				if lit, ok := s.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					pkg.consts[n.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	case *ast.TypeSpec:
		name := s.Name.Name
		pkg.names[name] = true
		if s.Assign.IsValid() {
			pkg.aliases[name] = exprName(s.Type)
		}
		switch typ := s.Type.(type) {
		case *ast.StructType:
			pkg.fieldList(name, typ.Fields)
		case *ast.InterfaceType:
			pkg.fieldList(name, typ.Methods)
		}
	}
}

func (pkg *packageIndex) fieldList(typ string, fields *ast.FieldList) {
	for _, f := range fields.List {
		if len(f.Names) == 0 { // embedded
			embedded := exprName(f.Type)
			pkg.embeds[typ] = append(pkg.embeds[typ], embedded)
			pkg.member(typ, embedded[strings.LastIndex(embedded, ".")+1:])
		}
		for _, n := range f.Names {
			pkg.member(typ, n.Name)
		}
	}
}

// receiverType is the name of a method's receiver type: T of T, *T, T[P] and *T[P].
func receiverType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverType(e.X)
	case *ast.IndexExpr:
		return receiverType(e.X)
	case *ast.IndexListExpr:
		return receiverType(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// exprName is a type expression as "Name" or "pkg.Name", pointers and type arguments dropped.
func exprName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return exprName(e.X)
	case *ast.IndexExpr:
		return exprName(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			return x.Name + "." + e.Sel.Name
		}
	}
	return ""
}

var testName = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)([A-Z_]\w*)?$`)

func isTestName(name string) bool { return testName.MatchString(name) }

// hasMember reports whether type typ of package pkg has a method or field name, through aliases
// and embedded types.
func (m *module) hasMember(pkg, typ, name string, depth int) bool {
	idx := m.packages[pkg]
	if idx == nil || depth > 5 {
		return false
	}
	if idx.members[typ][name] {
		return true
	}
	targets := idx.embeds[typ]
	if alias, ok := idx.aliases[typ]; ok {
		targets = append(targets, alias)
	}
	for _, target := range targets {
		tp, tt := pkg, target
		if i := strings.Index(target, "."); i >= 0 {
			tp, tt = target[:i], target[i+1:]
		}
		if m.hasMember(tp, tt, name, depth+1) {
			return true
		}
	}
	return false
}

// nonTestFiles returns the paths of the module's Go files that are not tests.
func (m *module) nonTestFiles() []string {
	var out []string
	for _, f := range m.files {
		if !f.test {
			out = append(out, f.path)
		}
	}
	return out
}

func TestHasMember(t *testing.T) {
	t.Parallel()
	m := parseModule(t)
	for _, c := range []struct {
		pkg, typ, name string
		want           bool
	}{
		{"inbox", "Store", "Process", true},             // a method
		{"inbox", "Store", "claim", true},               // an unexported method
		{"inbox", "Message", "Key", true},               // a field
		{"inboxworker", "Delivery", "Key", true},        // a field, through an alias to another package
		{"inboxworker", "BatchHandler", "Handle", true}, // an embedded interface's method
		{"inbox", "Store", "NoSuchMethod", false},
		{"nosuchpackage", "Store", "Process", false},
	} {
		if got := m.hasMember(c.pkg, c.typ, c.name, 0); got != c.want {
			t.Errorf("hasMember(%s.%s.%s) = %v, want %v", c.pkg, c.typ, c.name, got, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root is not %s: %v", root, err)
	}
}
