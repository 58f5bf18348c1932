package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// humanBytes formats a byte count with binary units ("1.5 GiB").
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// parseBytes reads sizes such as "8GiB", "512MiB", "1.5GB", "4096".
func parseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	units := []struct {
		suf string
		m   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suf)) && len(t) > len(u.suf) {
			// Case-insensitive match but keep KiB vs KB distinct.
			if strings.HasSuffix(t, u.suf) || strings.EqualFold(t[len(t)-len(u.suf):], u.suf) {
				mult = u.m
				t = strings.TrimSpace(t[:len(t)-len(u.suf)])
				break
			}
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q: want a number with an optional unit (B, KiB, MiB, GiB, KB, MB, GB)", s)
	}
	b := v * mult
	if b > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(b), nil
}

// writeJSON writes v as indented JSON followed by a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// yesNo renders a boolean for humans.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
