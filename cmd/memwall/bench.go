package main

import (
	"fmt"
	"sort"
	"strings"
)

func init() {
	register(verb{name: "bench", summary: "measure the link (transfer), allocation latency (alloc), the KV cache (kv), a server (serve) and batched generation (batch)", run: runBench})
}

// benchVerbs are the `memwall bench` sub-commands, one file each.
var benchVerbs = map[string]func(e *env, args []string) error{}

// runBench runs `memwall bench NAME [flags]`; `memwall bench -h` (and
// `memwall help bench`) lists the benchmarks, each with its usage and
// flags, on stdout.
func runBench(e *env, args []string) error {
	names := make([]string, 0, len(benchVerbs))
	for n := range benchVerbs {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		return printSubHelp(e, fmt.Sprintf("usage: memwall bench NAME [flags]\n\nbenchmarks: %s ('memwall help bench NAME' prints one's flags alone):", strings.Join(names, ", ")),
			names, func(n string, args []string) error { return benchVerbs[n](e, args) })
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef("want a benchmark: %s", strings.Join(names, ", "))
	}
	f, ok := benchVerbs[args[0]]
	if !ok {
		return usagef("unknown benchmark %q (have %s)", args[0], strings.Join(names, ", "))
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
