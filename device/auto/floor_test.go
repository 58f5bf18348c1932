package auto_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/memwall/memwall/"

// TestFloorImports checks that device/auto and everything it imports stay
// the floor: the memwall packages it reaches outside device/ are leaves
// that stand on nothing of memwall (embedded shader blobs, say), never one
// that stands on the device — kernels, bench, pool, the engine — so that
// a program that opens a device does not build what runs on it (issue 13:
// a benchmark's type or the kernels in the floor).
func TestFloorImports(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	imports := func(path string) []string {
		var out []string
		// Each build of the floor counts: with cgo (the default here) and
		// without (how the GPU binaries are built).
		for _, cgo := range []bool{true, false} {
			ctxt := build.Default
			ctxt.CgoEnabled = cgo
			pkg, err := ctxt.ImportDir(filepath.Join(root, strings.TrimPrefix(path, module)), 0)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			for _, imp := range pkg.Imports {
				if strings.HasPrefix(imp, module) {
					out = append(out, imp)
				}
			}
		}
		return out
	}
	inFloor := func(path string) bool {
		rel := strings.TrimPrefix(path, module)
		return rel == "device" || strings.HasPrefix(rel, "device/")
	}
	seen := map[string]string{} // package -> the one that imported it
	queue := []string{module + "device/auto"}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		for _, imp := range imports(path) {
			if _, ok := seen[imp]; ok {
				continue
			}
			seen[imp] = path
			if inFloor(imp) {
				queue = append(queue, imp)
				continue
			}
			// Outside the floor: it must import no memwall package at all.
			if deps := imports(imp); len(deps) > 0 {
				t.Errorf("%s imports %s, which stands on %s: the device floor must not import what stands on it", path, imp, deps[0])
			}
		}
	}
	if len(seen) < 4 {
		t.Fatalf("only %d memwall packages under device/auto (%v): the walk found nothing", len(seen), seen)
	}
}
