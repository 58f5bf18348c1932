// Command mkclasses generates alloc/sizeclasses.go, the slab allocator's
// size-class table, with each class's worst-case waste in a comment.
//
// Usage (from package alloc, through go generate):
//
//	go run ./internal/mkclasses -o sizeclasses.go
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/memwall/memwall/alloc/internal/sizeclass"
)

func main() {
	p := sizeclass.Default()
	out := flag.String("o", "sizeclasses.go", "output file (- for stdout)")
	flag.Uint64Var(&p.PageSize, "page", p.PageSize, "slab page size in bytes")
	flag.Uint64Var(&p.MinSize, "min", p.MinSize, "smallest class in bytes")
	flag.Uint64Var(&p.MaxSize, "max", p.MaxSize, "largest class in bytes")
	flag.Uint64Var(&p.Quantum, "quantum", p.Quantum, "class granularity (and block alignment) in bytes")
	flag.Float64Var(&p.MaxWaste, "waste", p.MaxWaste, "bound on the worst-case waste fraction")
	flag.Parse()
	if err := run(p, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkclasses:", err)
		os.Exit(1)
	}
}

func run(p sizeclass.Params, out string) error {
	classes, err := sizeclass.Compute(p)
	if err != nil {
		return err
	}
	src, err := sizeclass.Source(p, classes)
	if err != nil {
		return err
	}
	if out == "-" {
		_, err = os.Stdout.Write(src)
		return err
	}
	return os.WriteFile(out, src, 0o644)
}
