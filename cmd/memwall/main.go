// Command memwall answers "will this model fit on this GPU, how, and how
// fast?" and measures the memory layer that makes it so. Run `memwall help`.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], newEnv()))
}
