//go:build ignore

// gen writes kernels_amd64.s and kernels_amd64.go from internal/asmgen.
package main

import (
	"log"
	"os"

	"github.com/memwall/memwall/device/cpu/hostmath/internal/asmgen"
)

func main() {
	asm, decl := asmgen.Generate()
	if err := os.WriteFile("kernels_amd64.s", asm, 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("kernels_amd64.go", decl, 0o644); err != nil {
		log.Fatal(err)
	}
}
