package main

import (
	"fmt"
	"sort"
	"strings"
)

func init() {
	register(verb{name: "bench", summary: "measure the link (transfer) and allocation latency (alloc)", run: runBench})
}

// benchVerbs are the `memwall bench` sub-commands, one file each.
var benchVerbs = map[string]func(e *env, args []string) error{}

func runBench(e *env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		names := make([]string, 0, len(benchVerbs))
		for n := range benchVerbs {
			names = append(names, n)
		}
		sort.Strings(names)
		return usagef("want a benchmark: %s", strings.Join(names, ", "))
	}
	f, ok := benchVerbs[args[0]]
	if !ok {
		return usagef("unknown benchmark %q", args[0])
	}
	return f(e, args[1:])
}

// ratio formats a/b as "12.3×", or "-" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
