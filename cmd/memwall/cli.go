package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
)

// env is what a verb may touch: its output streams and whether stdout is a
// terminal (progress bars only then). Tests build one over buffers.
type env struct {
	ctx      context.Context
	stdout   io.Writer
	stderr   io.Writer
	terminal bool
	getenv   func(string) string
}

func newEnv() *env {
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt)
	return &env{ctx: ctx, stdout: os.Stdout, stderr: os.Stderr, terminal: isTerminal(os.Stdout), getenv: os.Getenv}
}

// isTerminal reports whether f is a terminal: a character device that
// answers the terminal ioctl (so /dev/null, also a character device, is not).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && isTTY(f.Fd())
}

// verb is one memwall sub-command; each lives in its own file and registers
// itself from that file's init.
type verb struct {
	name    string
	summary string
	run     func(e *env, args []string) error
}

var verbs = map[string]verb{}

func register(v verb) {
	if _, dup := verbs[v.name]; dup {
		panic("memwall: verb registered twice: " + v.name)
	}
	verbs[v.name] = v
}

// usageError marks a bad command line (exit status 2).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: memwall %s %s\n", name, usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, allowing flags after positional arguments, and
// turns flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

var errHelp = errors.New("help requested")

// parseNoArgs parses args for a verb that takes flags only.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	return nil
}

func run(args []string, e *env) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(e.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	v, ok := verbs[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "memwall: unknown command %q\n", args[0])
		printHelp(e.stderr)
		return 2
	}
	if path := e.getenv("MEMWALL_CPUPROFILE"); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			fmt.Fprintf(e.stderr, "memwall: MEMWALL_CPUPROFILE: %v\n", err)
			return 1
		}
		defer func() {
			if err := stop(); err != nil {
				fmt.Fprintf(e.stderr, "memwall: MEMWALL_CPUPROFILE: %v\n", err)
			}
		}()
	}
	err := v.run(e, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	default:
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(e.stderr, "memwall %s: %v\n", v.name, err)
			return 2
		}
		fmt.Fprintf(e.stderr, "memwall %s: %v\n", v.name, err)
		return 1
	}
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "memwall: GPU memory for ML inference — pools, plans, streaming, budgets.")
	fmt.Fprintln(w, "\nusage: memwall <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, verbs[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'memwall <command> -h' for a command's flags.")
}

// startCPUProfile writes a CPU profile of the rest of the run to path
// (MEMWALL_CPUPROFILE; scripts/pgo.sh builds the compiler's profile from
// such runs). The returned function stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}, nil
}
