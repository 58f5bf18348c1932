package auto_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/memwall/memwall/"

// TestFloorImports checks that device/auto and everything it imports stay
// the floor: memwall packages under device/ only, so that kernels, bench,
// pool and the engine stand on it and never the other way round (a
// benchmark's type or the kernels in the floor would make every program
// that opens a device build them).
func TestFloorImports(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{} // package -> the one that imported it
	queue := []string{module + "device/auto"}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
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
				if !strings.HasPrefix(imp, module) {
					continue
				}
				if rel := strings.TrimPrefix(imp, module); rel != "device" && !strings.HasPrefix(rel, "device/") {
					t.Errorf("%s imports %s: the device floor must not import what stands on it", path, imp)
				}
				if _, ok := seen[imp]; !ok {
					seen[imp] = path
					queue = append(queue, imp)
				}
			}
		}
	}
	if len(seen) < 4 {
		t.Fatalf("only %d memwall packages under device/auto (%v): the walk found nothing", len(seen), seen)
	}
}
