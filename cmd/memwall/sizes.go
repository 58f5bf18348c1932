package main

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
)

// sizeUnits is every unit parseBytes knows, longest suffix first so that
// "KiB" is tried before "B". Decimal units (KB … PB) are powers of 1000,
// binary ones (KiB … PiB) powers of 1024, and the bare letters K, M, G, T, P
// are the binary units: 1G is 1 GiB, 1GB is 10^9 bytes. Units are matched
// without regard to case ("1gib", "1Gb"), and B always means bytes.
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"P", 1 << 50},
	{"B", 1},
}

// sizeUnitsHelp is the unit list every size error and flag help repeats.
const sizeUnitsHelp = "B; KB, MB, GB, TB, PB (powers of 1000); KiB, MiB, GiB, TiB, PiB (powers of 1024); bare K, M, G, T, P mean KiB … PiB"

// sizeNumber is the number part of a size: digits with an optional
// fraction and a short exponent.
var sizeNumber = regexp.MustCompile(`^([0-9]+\.?[0-9]*|\.[0-9]+)([eE]-?[0-9]{1,2})?$`)

// maxSize is the largest size parseBytes returns: sizes stay within an
// int64 so that every caller may convert them.
const maxSize = math.MaxInt64

// parseBytes is memwall's one size parser, used by every flag that takes a
// size: a non-negative decimal number ("4096", "1.5", "2e3") and an optional
// unit (see sizeUnits), with optional space between ("512 MiB"). The result
// must be a whole number of bytes (0.5KiB is 512, 0.3B is an error) no larger
// than maxSize. Errors quote the input and list the units.
func parseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	// The number's shape is checked first: big.Rat also reads fractions,
	// hexadecimal and exponents large enough to take seconds.
	if !sizeNumber.MatchString(t) {
		return 0, fmt.Errorf("bad size %q: want a number and a unit: %s", s, sizeUnitsHelp)
	}
	v, ok := new(big.Rat).SetString(t)
	if !ok {
		return 0, fmt.Errorf("bad size %q: want a number and a unit: %s", s, sizeUnitsHelp)
	}
	if v.Cmp(new(big.Rat).SetUint64(maxSize)) > 0 {
		return 0, fmt.Errorf("size %q is too large: at most %d bytes (8 EiB)", s, uint64(maxSize))
	}
	v.Mul(v, new(big.Rat).SetUint64(mult))
	if !v.IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	n := v.Num()
	if !n.IsUint64() || n.Uint64() > maxSize {
		return 0, fmt.Errorf("size %q is too large: at most %d bytes (8 EiB)", s, uint64(maxSize))
	}
	return n.Uint64(), nil
}

// flagSize parses the value of the size flag --name (name without dashes)
// with parseBytes; a zero size is refused unless allowZero. Every error is a
// usage error (exit status 2) naming the flag.
func flagSize(name, value string, allowZero bool) (uint64, error) {
	n, err := parseBytes(value)
	if err != nil {
		return 0, usagef("--%s: %v", name, err)
	}
	if n == 0 && !allowZero {
		return 0, usagef("--%s %q: want a size above zero (units: %s)", name, value, sizeUnitsHelp)
	}
	return n, nil
}
