package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	good := []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"4096", 4096}, {"1B", 1}, {"17 B", 17},
		{"1KB", 1000}, {"1MB", 1e6}, {"1GB", 1e9}, {"1TB", 1e12}, {"1PB", 1e15},
		{"1KiB", 1 << 10}, {"1MiB", 1 << 20}, {"1GiB", 1 << 30}, {"1TiB", 1 << 40}, {"1PiB", 1 << 50},
		{"1K", 1 << 10}, {"1M", 1 << 20}, {"1G", 1 << 30}, {"1T", 1 << 40}, {"1P", 1 << 50},
		{"1.5GiB", 3 << 29}, {"0.5KiB", 512}, {".5KiB", 512}, {"2e3", 2000}, {"1e3KB", 1e6},
		{"512 mib", 512 << 20}, {"8gb", 8e9}, {" 3GiB ", 3 << 30}, {"1.", 1},
		{"8191PiB", 8191 << 50},
	}
	for _, c := range good {
		got, err := parseBytes(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, want string }{
		{"", "want a number and a unit: B; KB"},
		{"lots", "KiB, MiB, GiB, TiB, PiB"},
		{"-1GiB", "bad size"},
		{"1XB", "bad size"},
		{"0x10", "bad size"},
		{"1/2GiB", "bad size"},
		{"1e999999999", "bad size"},
		{"inf", "bad size"},
		{"NaN", "bad size"},
		{"GiB", "bad size"},
		{"1 2KiB", "bad size"},
		{"0.3B", "not a whole number of bytes"},
		{"8192PiB", "too large"},
		{"1e99", "too large"},
		{"99999999999999999999", "too large"},
	}
	for _, c := range bad {
		got, err := parseBytes(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseBytes(%q) = %d, %v; want an error containing %q", c.in, got, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("%q", c.in)) {
			t.Errorf("parseBytes(%q): error %q does not quote the input", c.in, err)
		}
	}
}

// TestParseBytesRandom: every whole number with every unit, in every case,
// parses to number × unit, or is refused as too large exactly when that
// product exceeds maxSize.
func TestParseBytesRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		u := sizeUnits[r.IntN(len(sizeUnits))]
		n := r.Uint64N(1 << uint(r.IntN(63)+1))
		suffix := u.suffix
		switch r.IntN(3) {
		case 0:
			suffix = strings.ToLower(suffix)
		case 1:
			suffix = strings.ToUpper(suffix)
		}
		if r.IntN(2) == 0 && !(u.suffix == "B" && r.IntN(2) == 0) {
			suffix = " " + suffix
		}
		in := fmt.Sprintf("%d%s", n, suffix)
		if r.IntN(4) == 0 {
			in = fmt.Sprintf("%d", n)
			u.mult = 1
		}
		got, err := parseBytes(in)
		hi, lo := mulWide(n, u.mult)
		want, fits := lo, hi == 0 && lo <= maxSize
		switch {
		case fits && (err != nil || got != want):
			t.Fatalf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		case !fits && (err == nil || !strings.Contains(err.Error(), "too large")):
			t.Fatalf("parseBytes(%q) = %d, %v; want too large", in, got, err)
		}
	}
}

func mulWide(a, b uint64) (hi, lo uint64) {
	const mask = 1<<32 - 1
	a0, a1, b0, b1 := a&mask, a>>32, b&mask, b>>32
	w0 := a0 * b0
	t := a1*b0 + w0>>32
	w1, w2 := t&mask, t>>32
	w1 += a0 * b1
	return a1*b1 + w2 + w1>>32, a * b
}

func TestFlagSize(t *testing.T) {
	if _, err := flagSize("size", "0", false); err == nil || !strings.Contains(err.Error(), "--size") {
		t.Errorf("zero: %v", err)
	} else if _, ok := err.(usageError); !ok {
		t.Errorf("zero: %T, not a usage error", err)
	}
	if n, err := flagSize("size", "0", true); err != nil || n != 0 {
		t.Errorf("zero allowed: %d, %v", n, err)
	}
	if _, err := flagSize("vram", "1PiB3", false); err == nil || !strings.Contains(err.Error(), "--vram: bad size") {
		t.Errorf("bad: %v", err)
	}
}

// FuzzParseBytes: no input panics or hangs; what parses is at most maxSize
// and parses again to the same number written in bytes.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"1GiB", "1.5 GB", "0.5KiB", "1e3", "8191PiB", "-1", "1e99", "0x1p3", "1_000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseBytes(s)
		if err != nil {
			return
		}
		if n > maxSize {
			t.Fatalf("parseBytes(%q) = %d above maxSize", s, n)
		}
		if m, err := parseBytes(fmt.Sprintf("%dB", n)); err != nil || m != n {
			t.Fatalf("parseBytes(%q) = %d, but %dB parses to %d, %v", s, n, n, m, err)
		}
	})
}
