package docs_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// seeRef is a comment's "(see X)": X a name of the comment's package (a function, a type, a
// variable, Type.Member), or of another package (pkg.Name); a file (schedule.go) is not checked.
var seeRef = regexp.MustCompile(`\(see ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*){0,2})\)`)

// TestCommentSymbols resolves the names the module's comments cite, as TestSymbols does for the
// docs: every pkg.Name and pkg.Type.Member of a package of the module, and every "(see X)", must
// name something the module declares, so that a comment does not point at what was renamed or
// deleted.
func TestCommentSymbols(t *testing.T) {
	t.Parallel()
	m := parseModule(t)
	checked := 0
	for _, f := range m.files {
		if f.test {
			continue
		}
		pkg := f.ast.Name.Name
		for _, group := range f.ast.Comments {
			text := group.Text()
			where := fmt.Sprintf("%s:%d", f.path, m.fset.Position(group.Pos()).Line)
			for _, sm := range goSelector.FindAllStringSubmatch(text, -1) {
				if m.packages[sm[1]] != nil {
					checked += m.checkSymbol(t, where, sm[0], sm[1], sm[2], sm[3], false)
				}
			}
			for _, sm := range seeRef.FindAllStringSubmatch(text, -1) {
				checked++
				if !m.resolves(pkg, sm[1]) {
					t.Errorf("%s: (see %s): no such name in package %s or the module", where, sm[1], pkg)
				}
			}
		}
	}
	t.Logf("%d names in comments checked", checked)
	if checked < 100 {
		t.Errorf("only %d names found in comments: the extraction is broken", checked)
	}
}

// resolves reports whether ref, as a comment of package pkg writes it, names something: Name (a
// method or field of one of its types included), Type.Member or pkg.Name(.Member) of another
// package.
func (m *module) resolves(pkg, ref string) bool {
	parts := strings.Split(ref, ".")
	idx := m.packages[pkg]
	switch {
	case len(parts) == 1 && idx != nil:
		return idx.names[parts[0]] || idx.anyMember(parts[0])
	case idx != nil && idx.names[parts[0]] && len(parts) == 2 && m.hasMember(pkg, parts[0], parts[1], 0):
		return true
	case parts[1] == "go":
		return true // a file
	}
	other := m.packages[parts[0]]
	switch {
	case other == nil || !other.names[parts[1]]:
		return false
	case len(parts) == 3:
		return m.hasMember(parts[0], parts[1], parts[2], 0)
	}
	return true
}

// anyMember reports whether a type of pkg has a method or field name.
func (pkg *packageIndex) anyMember(name string) bool {
	for _, members := range pkg.members {
		if members[name] {
			return true
		}
	}
	return false
}
