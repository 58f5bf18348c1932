package longtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const importPath = "github.com/memwall/memwall/internal/longtest"

// TestEveryTestPackageDefinesLong holds the rule that makes `go test ./...
// -long` work: a test binary that does not define -long refuses the flag, so
// every directory of the module with _test.go files imports this package from
// one of them.
func TestEveryTestPackageDefinesLong(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found above %s: %v", root, err)
	}
	tests := map[string]bool{} // dir -> imports longtest
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "tools" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		uses := false
		for _, im := range f.Imports {
			if p, _ := strconv.Unquote(im.Path.Value); p == importPath {
				uses = true
			}
		}
		tests[dir] = tests[dir] || uses
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	here, _ := filepath.Abs(".")
	for dir, ok := range tests {
		if !ok && dir != here {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("%s has tests but none imports %s: `go test ./... -long` would fail there (add `_ %q` to one _test.go file)", rel, importPath, importPath)
		}
	}
}

func TestChoose(t *testing.T) {
	want := 1
	if Enabled() {
		want = 2
	}
	if got := Choose(1, 2); got != want {
		t.Fatalf("Choose(1, 2) = %d with -long=%v", got, Enabled())
	}
}
