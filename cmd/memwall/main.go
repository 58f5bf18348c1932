// Command memwall answers "will this model fit on this GPU, how, and how
// fast?" and measures the memory layer that makes it so. Run `memwall help`.
package main

import (
	"os"
)

func main() {
	os.Exit(memwall(os.Args[1:]))
}

// memwall runs the command line args on the process's streams and returns
// the exit status.
func memwall(args []string) int {
	e := newEnv()
	w := newReportWriter(e)
	return w.status(e, run(args, e))
}
