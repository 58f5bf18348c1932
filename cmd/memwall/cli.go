package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/memwall/memwall/device"
)

// env is what a verb may touch: its output streams and whether stdout is a
// terminal (progress bars only then). Tests build one over buffers.
type env struct {
	ctx      context.Context
	stdout   io.Writer
	stderr   io.Writer
	terminal bool
	getenv   func(string) string
	// wrapDevice, when set, wraps every device a verb opens (tests inject
	// device failures with it); nil in the program.
	wrapDevice func(device.Device) device.Device
	// spooled maps an input read from a pipe to the temporary file it was
	// copied to (spoolPipe); e.local reads it.
	spooled map[string]string
	// stop is how a signal interrupts the run: it cancels ctx and records
	// the signal, which sets the exit status. Tests interrupt a verb
	// through it (stop.signal); nil when nothing can interrupt the run.
	stop *interruption
	// work is how far the verb's progress bar got (drawn or not), for the
	// message of an interrupted run.
	work workDone
	// temps registers the temporary files the run makes, which a second
	// signal removes before it exits (nil: none are registered).
	temps *tempFiles
}

func newEnv() *env {
	ctx, stop := interruptible(context.Background())
	e := &env{ctx: ctx, stop: stop, stdout: os.Stdout, stderr: os.Stderr, terminal: isTerminal(os.Stdout), getenv: os.Getenv, temps: &tempFiles{}}
	// SIGTERM stops the work as SIGINT does, so that every verb's cleanup
	// (temporary files above all) runs for both; a second signal does not
	// wait for it.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go handleSignals(sigs, stop, e.temps, os.Stderr, os.Exit)
	return e
}

// handleSignals interrupts the run on the first signal from sigs and
// calls exit on the next, with the status of the first, without waiting
// for the work to stop: a user who signals twice wants out now. Before it
// exits it removes the temporary files still registered in temps, which
// the work's own cleanup would have removed.
func handleSignals(sigs <-chan os.Signal, stop *interruption, temps *tempFiles, stderr io.Writer, exit func(int)) {
	for sig := range sigs {
		if !stop.signal(sig) {
			first := stop.signalled()
			temps.removeAll()
			fmt.Fprintf(stderr, "memwall: %s after %s: exiting at once\n", signalName(sig), signalName(first))
			exit(signalStatus(first))
			return
		}
	}
}

// interruption is what SIGINT and SIGTERM do to a run: the first cancels
// its context and is recorded, so that the verb stops at its next check,
// cleans up and exits with signalStatus; newEnv exits at once on a second.
type interruption struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	sig    os.Signal
}

// interruptible returns a context that the interruption cancels.
func interruptible(parent context.Context) (context.Context, *interruption) {
	ctx, cancel := context.WithCancel(parent)
	return ctx, &interruption{cancel: cancel}
}

// signal records sig and cancels the run's context; it reports whether
// sig is the first signal (a later one changes nothing here).
func (in *interruption) signal(sig os.Signal) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.sig != nil {
		return false
	}
	in.sig = sig
	in.cancel()
	return true
}

// signalled is the signal that interrupted the run, nil if none did (or
// in is nil).
func (in *interruption) signalled() os.Signal {
	if in == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.sig
}

// signalName is the signal's usual name: SIGINT, SIGTERM.
func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// signalStatus is the exit status of a run the signal interrupted, the
// shell's convention: 128 plus the signal's number (SIGINT 130, SIGTERM
// 143).
func signalStatus(sig os.Signal) int {
	switch sig {
	case os.Interrupt:
		return exitSIGINT
	case syscall.SIGTERM:
		return exitSIGTERM
	}
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitFail
}

// workDone is the last progress a verb reported: done of total units.
type workDone struct {
	mu          sync.Mutex
	done, total float64
	unit        string
}

func (w *workDone) set(done, total float64, unit string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done, w.total, w.unit = done, total, unit
}

// String is "3 of 12 rows", "1.2 GiB of 13.5 GiB", or "" when no progress
// was reported.
func (w *workDone) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total <= 0 {
		return ""
	}
	if w.unit == "bytes" {
		return humanBytes(uint64(w.done)) + " of " + humanBytes(uint64(w.total))
	}
	return fmt.Sprintf("%.0f of %.0f %s", w.done, w.total, w.unit)
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

// newFlags returns a flag set that reports errors instead of exiting. A
// flag error is returned (parseFlags makes it a usage error that run prints
// once); -h prints the usage and the flags to stdout.
func newFlags(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	sink := &flagErrors{}
	fs.SetOutput(sink)
	fs.Usage = func() {
		// The flag package writes a parse error to Output and then calls
		// Usage; -h calls Usage alone. Only the latter prints.
		if sink.wrote {
			sink.wrote = false
			return
		}
		fmt.Fprintf(e.stdout, "usage: memwall %s %s\n\nflags:\n", name, usage)
		printDefaults(e.stdout, fs)
	}
	return fs
}

// flagErrors swallows what the flag package prints about a parse error
// (the error comes back from Parse too) and notes that it did.
type flagErrors struct{ wrote bool }

func (f *flagErrors) Write(p []byte) (int, error) {
	f.wrote = true
	return len(p), nil
}

// parseFlags parses args, allowing flags after positional arguments, and
// turns flag errors into usage errors; then it checks the values of the
// bounded flags given (see bounds.go).
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
			return pos, checkBounded(fs)
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

// Exit statuses: every verb ends in one of these, through run.
const (
	exitOK      = 0   // the work was done (a plan that fits, a report written)
	exitFail    = 1   // the work failed, "does not fit" included
	exitUsage   = 2   // a bad command line: nothing was done
	exitSIGINT  = 130 // SIGINT stopped the work (128 + 2)
	exitSIGTERM = 143 // SIGTERM stopped the work (128 + 15)
)

// run runs the command line args and returns the exit status: a verb's nil
// error is exitOK, a usageError (or one wrapping it) exitUsage after the
// message and a pointer to the verb's help, an error after a signal
// interrupted the work the signal's status (exitSIGINT, exitSIGTERM) after
// saying so, any other error exitFail after the message. Every message goes
// to stderr once, prefixed "memwall VERB: ".
func run(args []string, e *env) (code int) {
	if len(args) == 0 {
		printHelp(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printHelp(e.stdout)
		return exitOK
	case "help":
		return runHelp(e, args[1:])
	}
	v, ok := verbs[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "memwall: unknown command %q (commands: %s; run 'memwall help')\n", args[0], strings.Join(verbNames(), ", "))
		return exitUsage
	}
	if path := e.getenv("MEMWALL_CPUPROFILE"); path != "" {
		stop, err := startCPUProfile(e.temps, path)
		if err != nil {
			fmt.Fprintf(e.stderr, "memwall: %v\n", err) // names the variable and the path
			return exitFail
		}
		defer func() {
			// A profile that could not be written fails a run that had
			// not failed already.
			if err := stop(); err != nil {
				fmt.Fprintf(e.stderr, "memwall: %v\n", err)
				if code == exitOK {
					code = exitFail
				}
			}
		}()
	}
	name := v.name
	if v.name == "bench" && len(args) > 1 && benchVerbs[args[1]] != nil || v.name == "kv" && len(args) > 1 && args[1] == "simulate" {
		name += " " + args[1] // messages and the help hint name the benchmark or sub-command
	}
	return exitStatus(e, name, v.run(e, args[1:]))
}

// exitStatus prints err for verb and returns the exit status it means.
func exitStatus(e *env, verb string, err error) int {
	var u usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &u):
		fmt.Fprintf(e.stderr, "memwall %s: %s\n(run 'memwall help %s' for its flags)\n", verb, tidyMessage(verb, err.Error()), verb)
		return exitUsage
	case e.stop.signalled() != nil:
		// SIGINT or SIGTERM: say so, and how far the work got, rather than
		// "context canceled".
		sig := e.stop.signalled()
		fmt.Fprintf(e.stderr, "memwall %s: %s\n", verb, interrupted(verb, signalName(sig), &e.work, err))
		return signalStatus(sig)
	case errors.Is(err, context.Canceled) && e.ctx != nil && e.ctx.Err() != nil:
		// The caller's own context, no signal.
		fmt.Fprintf(e.stderr, "memwall %s: %s\n", verb, interrupted(verb, "its context", &e.work, err))
		return exitFail
	default:
		fmt.Fprintf(e.stderr, "memwall %s: %s\n", verb, tidyMessage(verb, err.Error()))
		return exitFail
	}
}

// interrupted is the message of a run stopped before its work was done:
// by whom, how far its progress got and where its error says it stopped,
// without the context's own "context canceled".
func interrupted(verb, by string, work *workDone, err error) string {
	msg := "interrupted by " + by
	if w := work.String(); w != "" {
		msg += " after " + w
	}
	where := tidyMessage(verb, err.Error())
	for _, c := range []error{context.Canceled, context.DeadlineExceeded} {
		where = strings.TrimSuffix(strings.TrimSuffix(where, c.Error()), ": ")
	}
	if where != "" {
		msg += " (" + where + ")"
	}
	return msg
}

// wordPair is two words before a colon, as in "pool pool:" (a pool with
// the pool package's default name, in that package's prefix).
var wordPair = regexp.MustCompile(`\b([A-Za-z][A-Za-z-]*) ([A-Za-z][A-Za-z-]*):`)

// tidyMessage removes what an error's layers repeat: the verb's own name
// at its start ("memwall plan: plan: ...") and a word doubled before a
// colon ("pool pool: ..." becomes "pool: ...").
func tidyMessage(verb, msg string) string {
	msg = strings.TrimPrefix(msg, verb+": ")
	return wordPair.ReplaceAllStringFunc(msg, func(m string) string {
		a, b, _ := strings.Cut(strings.TrimSuffix(m, ":"), " ")
		if a == b {
			return a + ":"
		}
		return m
	})
}

// runHelp is `memwall help [VERB [SUB]]`: the top-level help, or a verb's
// usage and flags (what `memwall VERB -h` prints), on stdout.
func runHelp(e *env, args []string) int {
	if len(args) == 0 {
		printHelp(e.stdout)
		return exitOK
	}
	v, ok := verbs[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "memwall help: unknown command %q (commands: %s)\n", args[0], strings.Join(verbNames(), ", "))
		return exitUsage
	}
	return exitStatus(e, v.name, v.run(e, append(slices.Clone(args[1:]), "-h")))
}

// printSubHelp prints, after intro, each sub-command's usage and flags
// (what `memwall VERB SUB -h` prints), for `memwall help VERB` of a verb
// made of sub-commands; it returns errHelp as -h does.
func printSubHelp(e *env, intro string, subs []string, run func(sub string, args []string) error) error {
	fmt.Fprintln(e.stdout, intro)
	for _, sub := range subs {
		fmt.Fprintln(e.stdout)
		if err := run(sub, []string{"-h"}); err != nil && !errors.Is(err, errHelp) {
			return err
		}
	}
	return errHelp
}

func verbNames() []string {
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "memwall: GPU memory for ML inference — pools, plans, streaming, budgets.")
	fmt.Fprintln(w, "\nusage: memwall <command> [flags]\n\ncommands:")
	for _, n := range verbNames() {
		fmt.Fprintf(w, "  %-10s %s\n", n, verbs[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'memwall help <command>' (or 'memwall <command> -h') for a command's flags.")
	fmt.Fprintln(w, "Sizes take the units "+sizeUnitsHelp+".")
	fmt.Fprintln(w, "Exit status: 0 done, 1 the work failed (a plan that does not fit included), 2 a bad command line,")
	fmt.Fprintln(w, "130 stopped by SIGINT, 143 by SIGTERM (after cleaning up; a second signal exits at once, removing")
	fmt.Fprintln(w, "the temporary files first).")
}

// startCPUProfile writes a CPU profile of the rest of the run to path
// (MEMWALL_CPUPROFILE; scripts/pgo.sh builds the compiler's profile from
// such runs), by outputFile's rules: the path is checked now and written
// when the returned function stops the profile.
func startCPUProfile(temps *tempFiles, path string) (stop func() error, err error) {
	o, err := checkOutput(temps, "MEMWALL_CPUPROFILE", path)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, fmt.Errorf("MEMWALL_CPUPROFILE %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return o.write(buf.Bytes())
	}, nil
}
