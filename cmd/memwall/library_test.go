package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// TestREADMELibrary: the README's section on memwall as a Go library points
// at a program that runs (examples/library, whose own test runs it), and
// every call its code block shows is one that program makes, so the
// summary cannot drift from code that works.
func TestREADMELibrary(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Using memwall as a Go library\n")
	if !ok {
		t.Fatal("README.md has no section \"Using memwall as a Go library\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "`go run ./examples/library`") || !strings.Contains(section, "`go test ./examples/library`") {
		t.Errorf("the section does not say how to run the example and its test:\n%s", section)
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if block == nil {
		t.Fatal("the section has no Go code block")
	}
	prog, err := os.ReadFile("../../examples/library/main.go")
	if err != nil {
		t.Fatal(err)
	}
	calls := regexp.MustCompile(`\b([a-z]+)\.([A-Z][A-Za-z]*)\(`)
	seen := map[string]bool{}
	for _, m := range calls.FindAllStringSubmatch(string(prog), -1) {
		seen[m[2]] = true
		seen[m[1]+"."+m[2]] = true
	}
	n := 0
	for _, m := range calls.FindAllStringSubmatch(block[1], -1) {
		n++
		name := m[1] + "." + m[2]
		if isPackage(m[1]) && !seen[name] || !isPackage(m[1]) && !seen[m[2]] {
			t.Errorf("the README's example calls %s, which examples/library/main.go does not", name)
		}
	}
	if n < 8 {
		t.Errorf("the README's example shows %d calls; want the pool, the KV cache and the engine's", n)
	}
}

// isPackage reports whether name is one of the packages the README's
// library example imports (not a variable such as dev or e).
func isPackage(name string) bool {
	switch name {
	case "auto", "pool", "kvcache", "llama", "kernels", "residency", "engine":
		return true
	}
	return false
}

// TestLibraryImports: a Go program that imports memwall's library
// packages gets neither Prometheus nor the protobuf runtime (telemetry,
// which exports the pool's and the KV cache's figures to Prometheus, is
// imported only by those who ask for it); the ONNX reader's wire-format
// decoder, protowire, is all of protobuf that planning takes.
func TestLibraryImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	for _, c := range []struct {
		pkgs  []string
		allow []string // the protobuf packages allowed
	}{
		{[]string{"./pool", "./kvcache", "./alloc", "./tokenizer", "./device/auto", "./kernels"}, nil},
		{[]string{"./engine", "./residency", "./plan", "./format/llama"}, []string{"google.golang.org/protobuf/encoding/protowire",
			"google.golang.org/protobuf/internal/detrand", "google.golang.org/protobuf/internal/errors"}}, // protowire and what it imports
	} {
		for _, p := range c.pkgs {
			cmd := exec.Command(goTool, "list", "-deps", p)
			cmd.Dir = "../.."
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", p, err)
			}
			for _, dep := range strings.Fields(string(out)) {
				prom := strings.HasPrefix(dep, "github.com/prometheus/")
				proto := strings.HasPrefix(dep, "google.golang.org/protobuf/") && !slices.Contains(c.allow, dep)
				if prom || proto {
					t.Errorf("importing %s pulls in %s", p, dep)
				}
			}
		}
	}
}

// TestLibraryErrorsNameThePoolOnce: a pool with the default name, and its
// tenants, name themselves "pool" in their errors, not "pool pool" (which
// the command line tidies, but a library user reads as it is).
func TestLibraryErrorsNameThePoolOnce(t *testing.T) {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	p, err := pool.New(d, pool.Options{Limit: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tn, err := p.Tenant("a", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	other, err := p.Tenant("b", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := other.Alloc(4096, pool.AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, dup := p.Tenant("a", 0)
	_, big := p.Alloc(64<<20, pool.AllocOptions{})
	_, quota := tn.Alloc(2<<20, pool.AllocOptions{})
	for name, err := range map[string]error{"a tenant twice": dup, "above the limit": big, "above the quota": quota, "another tenant's block": tn.Free(b)} {
		if err == nil || !strings.HasPrefix(err.Error(), "pool: ") || strings.Contains(err.Error(), "pool pool") {
			t.Errorf("%s: %v, want an error that begins \"pool: \" once", name, err)
		}
	}
}
