package imports_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	_ "github.com/memwall/memwall/internal/longtest"
)

// rule is one row of the table: a package and what it may import.
type rule struct {
	pkg  string
	row  int             // 0 for the first row
	line int             // in DESIGN.md
	deps map[string]bool // memwall packages (module-relative) and other modules' packages (full paths)
}

// add adds the imports named on line n to the row.
func (r *rule) add(n int, deps []string) error {
	for _, d := range deps {
		if r.deps[d] {
			return fmt.Errorf("line %d: %s names %s twice", n, r.pkg, d)
		}
		r.deps[d] = true
	}
	return nil
}

// table is docs/DESIGN.md's import table.
type table struct {
	order []string // packages, bottom up
	rules map[string]*rule
}

// parseTable reads the fenced block whose info string is "imports": one row
// per package, bottom up, "pkg: dep dep ...", blank lines and lines starting
// with # ignored.
func parseTable(md []byte) (*table, error) {
	t := &table{rules: map[string]*rule{}}
	sc := bufio.NewScanner(bytes.NewReader(md))
	in, found, n := false, false, 0
	var last *rule
	for sc.Scan() {
		n++
		raw := sc.Text()
		line := strings.TrimSpace(raw)
		switch {
		case !in && line == "```imports":
			if found {
				return nil, fmt.Errorf("line %d: a second imports block", n)
			}
			in, found = true, true
			continue
		case !in:
			continue
		case line == "```":
			in = false
			continue
		case line == "" || strings.HasPrefix(line, "#"):
			last = nil
			continue
		case raw[0] == ' ' || raw[0] == '\t':
			if last == nil {
				return nil, fmt.Errorf("line %d: an indented line continues no row", n)
			}
			if err := last.add(n, strings.Fields(line)); err != nil {
				return nil, err
			}
			continue
		}
		pkg, deps, ok := strings.Cut(line, ":")
		pkg = strings.TrimSpace(pkg)
		if !ok || pkg == "" || strings.ContainsAny(pkg, " \t") {
			return nil, fmt.Errorf("line %d: %q is not \"package: imports...\"", n, line)
		}
		if _, dup := t.rules[pkg]; dup {
			return nil, fmt.Errorf("line %d: a second row for %s", n, pkg)
		}
		r := &rule{pkg: pkg, row: len(t.order), line: n, deps: map[string]bool{}}
		if err := r.add(n, strings.Fields(deps)); err != nil {
			return nil, err
		}
		t.rules[pkg] = r
		last = r
		t.order = append(t.order, pkg)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found || in {
		return nil, fmt.Errorf("no complete ```imports block")
	}
	return t, nil
}

// scan returns, for every package directory of the module at root
// (module-relative), the memwall packages and other modules' packages its
// non-test files import, under every build constraint (all files count).
// Files built only by `go run` (//go:build ignore) are programs of their
// own and do not count.
func scan(root, module string) (map[string]map[string]string, error) {
	pkgs := map[string]map[string]string{} // pkg -> import -> file
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path == root {
				return nil
			}
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		for _, g := range f.Comments {
			if g.Pos() > f.Package {
				break
			}
			for _, c := range g.List {
				if x, err := constraint.Parse(c.Text); err == nil {
					if tag, ok := x.(*constraint.TagExpr); ok && tag.Tag == "ignore" {
						return nil
					}
				}
			}
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		file := filepath.ToSlash(filepath.Join(rel, name))
		if pkgs[pkg] == nil {
			pkgs[pkg] = map[string]string{}
		}
		for _, im := range f.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: import %s: %v", file, im.Path.Value, err)
			}
			switch {
			case strings.HasPrefix(p, module+"/"):
				p = strings.TrimPrefix(p, module+"/")
			case !strings.Contains(strings.SplitN(p, "/", 2)[0], "."):
				continue // the standard library (and cgo's "C")
			}
			if _, ok := pkgs[pkg][p]; !ok {
				pkgs[pkg][p] = file
			}
		}
		return nil
	})
	return pkgs, err
}

// modulePath reads the module line of root's go.mod.
func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("go.mod: no module line")
}

// TestImportRules holds the module to docs/DESIGN.md's import table: every
// package has a row; a row names only packages of rows above it (so the
// table is one-way: no cycle, each package stands on those below); every
// import of a non-test file is in its package's row, and every edge a row
// names is one the code makes. Changing what a package imports means
// changing the design's table in the same commit.
func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	module, err := modulePath(root)
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := parseTable(md)
	if err != nil {
		t.Fatalf("docs/DESIGN.md: %v", err)
	}
	pkgs, err := scan(root, module)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 30 {
		t.Fatalf("found only %d packages under %s: the walk is broken", len(pkgs), root)
	}
	for _, pkg := range tab.order {
		r := tab.rules[pkg]
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("docs/DESIGN.md:%d: a row for %s, which is not a package of the module", r.line, pkg)
		}
		for dep := range r.deps {
			if d, ok := tab.rules[dep]; ok && d.row >= r.row {
				t.Errorf("docs/DESIGN.md:%d: %s may import %s, which is not below it (row %d, line %d): the table must read bottom up", r.line, pkg, dep, d.row+1, d.line)
			} else if !ok && !strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") {
				t.Errorf("docs/DESIGN.md:%d: %s may import %s, which has no row (name another module's package by its full path)", r.line, pkg, dep)
			}
		}
	}
	names := make([]string, 0, len(pkgs))
	for pkg := range pkgs {
		names = append(names, pkg)
	}
	sort.Strings(names)
	for _, pkg := range names {
		r, ok := tab.rules[pkg]
		if !ok {
			t.Errorf("%s has no row in docs/DESIGN.md's import table: place it", pkg)
			continue
		}
		imps := pkgs[pkg]
		var got []string
		for to := range imps {
			got = append(got, to)
		}
		sort.Strings(got)
		for _, to := range got {
			if !r.deps[to] {
				t.Errorf("%s imports %s, which docs/DESIGN.md:%d does not allow %s", imps[to], to, r.line, pkg)
			}
		}
		var unused []string
		for dep := range r.deps {
			if _, ok := imps[dep]; !ok {
				unused = append(unused, dep)
			}
		}
		slices.Sort(unused)
		for _, dep := range unused {
			t.Errorf("docs/DESIGN.md:%d allows %s to import %s, which none of its files does: drop it from the table", r.line, pkg, dep)
		}
	}
}

// TestParseTable checks the table reader on rows it must refuse.
func TestParseTable(t *testing.T) {
	good := "text\n```imports\n# comment\nalloc:\n\npool: alloc\n  device\n```\nmore\n"
	tab, err := parseTable([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tab.order, []string{"alloc", "pool"}) || !tab.rules["pool"].deps["device"] || tab.rules["pool"].line != 6 {
		t.Fatalf("parsed %v, pool %+v", tab.order, tab.rules["pool"])
	}
	for name, md := range map[string]string{
		"no block":    "alloc:\n",
		"unclosed":    "```imports\nalloc:\n",
		"no colon":    "```imports\nalloc\n```\n",
		"two rows":    "```imports\nalloc:\nalloc:\n```\n",
		"twice named": "```imports\npool: alloc alloc\n```\n",
		"two blocks":  "```imports\nalloc:\n```\n```imports\npool:\n```\n",
		"spaced name": "```imports\nal loc:\n```\n",
		"orphan line": "```imports\n  alloc\n```\n",
		"twice, cont": "```imports\npool: alloc\n alloc\n```\n",
	} {
		if _, err := parseTable([]byte(md)); err == nil {
			t.Errorf("%s: parseTable accepted %q", name, md)
		}
	}
}
