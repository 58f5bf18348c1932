package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Numeric flags carry the range of values the work can take. Their values
// are parsed when the flag is set and checked by parseFlags once the
// command line is read, so that every bad number is a usage error (exit
// status 2) of one line naming the flag and the limit: "--pairs
// 1000000000000: at most 100000000". A flag left out keeps its default,
// which is not checked.

// boundedFlag is a flag whose value parseFlags checks after parsing.
type boundedFlag interface {
	flag.Value
	// check returns the usage error for the value given to --name, nil if
	// it is in range.
	check(name string) error
	// kind names the value in the help ("int", "float").
	kind() string
}

// intFlag is an integer flag in lo..hi.
type intFlag struct {
	p      *int
	lo, hi int
	given  string // the value as given
	bad    bool   // given is not an integer that fits in an int
}

// intVar defines the integer flag --name with default value and range
// lo..hi, stored in p; the help states the range after usage.
func intVar(fs *flag.FlagSet, p *int, name string, value, lo, hi int, usage string) {
	*p = value
	fs.Var(&intFlag{p: p, lo: lo, hi: hi}, name, fmt.Sprintf("%s (%d..%d)", usage, lo, hi))
}

// intFlagOf is intVar with a new variable.
func intFlagOf(fs *flag.FlagSet, name string, value, lo, hi int, usage string) *int {
	p := new(int)
	intVar(fs, p, name, value, lo, hi, usage)
	return p
}

func (f *intFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.Itoa(*f.p)
}

func (f *intFlag) Set(s string) error {
	f.given = s
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 0)
	if err != nil && !isRange(err) {
		f.bad = true
		return nil
	}
	// An integer past an int reads as the int's limit: still out of range.
	*f.p = int(v)
	return nil
}

func (f *intFlag) check(name string) error {
	switch v := *f.p; {
	case f.bad:
		return usagef("--%s %q: want an integer from %d to %d", name, f.given, f.lo, f.hi)
	case v > f.hi:
		return usagef("--%s %s: at most %d", name, f.given, f.hi)
	case v < f.lo:
		return usagef("--%s %s: at least %d", name, f.given, f.lo)
	}
	return nil
}

func (f *intFlag) kind() string { return "int" }

// isRange reports whether err is strconv's "value out of range".
func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// floatFlag is a finite number from lo (above lo when open) to hi.
type floatFlag struct {
	p      *float64
	lo, hi float64
	open   bool   // lo itself is refused
	given  string // the value as given
	bad    bool   // given is not a finite number
}

// floatVar defines the number flag --name with default value and the
// range lo..hi, stored in p; open refuses lo itself ("above 0"). NaN and
// infinities are refused.
func floatVar(fs *flag.FlagSet, p *float64, name string, value, lo, hi float64, open bool, usage string) {
	*p = value
	f := &floatFlag{p: p, lo: lo, hi: hi, open: open}
	fs.Var(f, name, fmt.Sprintf("%s (%s)", usage, f.span()))
}

// floatFlagOf is floatVar with a new variable.
func floatFlagOf(fs *flag.FlagSet, name string, value, lo, hi float64, open bool, usage string) *float64 {
	p := new(float64)
	floatVar(fs, p, name, value, lo, hi, open, usage)
	return p
}

// span is the range in words: "above 0, at most 10000", "0..1".
func (f *floatFlag) span() string {
	if f.open {
		return "above " + num(f.lo) + ", at most " + num(f.hi)
	}
	return num(f.lo) + ".." + num(f.hi)
}

// num formats a limit: whole numbers in full ("1000000"), others as %g.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func (f *floatFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return num(*f.p)
}

func (f *floatFlag) Set(s string) error {
	f.given = s
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	f.bad = err != nil && !isRange(err) || math.IsNaN(v)
	*f.p = v // ±Inf for a number past a float64: out of range
	return nil
}

func (f *floatFlag) check(name string) error {
	switch v := *f.p; {
	case f.bad:
		return usagef("--%s %q: want a number %s", name, f.given, f.span())
	case v > f.hi:
		return usagef("--%s %s: at most %s", name, f.given, num(f.hi))
	case f.open && v <= f.lo:
		return usagef("--%s %s: want above %s", name, f.given, num(f.lo))
	case v < f.lo:
		return usagef("--%s %s: at least %s", name, f.given, num(f.lo))
	}
	return nil
}

func (f *floatFlag) kind() string { return "float" }

// checkBounded checks every bounded flag given on the command line.
func checkBounded(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if b, ok := f.Value.(boundedFlag); ok && err == nil {
			err = b.check(f.Name)
		}
	})
	return err
}

// printDefaults is flag.PrintDefaults, with bounded flags shown by the
// kind of their value ("-pairs int") rather than as "value".
func printDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  -%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if bf, ok := f.Value.(boundedFlag); ok {
			name = bf.kind()
		}
		if name != "" {
			b.WriteString(" " + name)
		}
		if b.Len() <= 4 { // a one-letter flag without a value name
			b.WriteString("\t")
		} else {
			b.WriteString("\n    \t")
		}
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			if g, ok := f.Value.(flag.Getter); ok {
				if _, isString := g.Get().(string); isString {
					fmt.Fprintf(&b, " (default %q)", f.DefValue)
					break
				}
			}
			fmt.Fprintf(&b, " (default %v)", f.DefValue)
		}
		fmt.Fprintln(w, b.String())
	})
}
