package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"time"
)

// fleetSpec is one model of a shared-budget serve: from a MODEL argument
// and the flags, or from a --config file's entry.
type fleetSpec struct {
	path, name string
	// priority weighs the model against the others (fleet.Model.Priority;
	// 1 by default).
	priority float64
	// keepAlive is fleet.Model.KeepAlive (negative: forever); unloadAfter
	// how long without a request before the model is unloaded (0: never).
	keepAlive, unloadAfter time.Duration
}

// serveConfig is --config's file: the models to serve and, for each, what
// the flags would otherwise set for all of them.
type serveConfig struct {
	Models []serveConfigModel `json:"models"`
}

type serveConfigModel struct {
	// Path is the model (what `memwall run` reads), relative to the
	// config file's directory unless absolute.
	Path string `json:"path"`
	// Name is its id in the API (default: the path's base name).
	Name string `json:"name"`
	// Priority > 0 (default 1).
	Priority *float64 `json:"priority"`
	// KeepAliveS: seconds an idle model keeps more than its minimum (0:
	// none, -1: forever; default --keep-alive).
	KeepAliveS *int64 `json:"keep_alive_s"`
	// UnloadAfterS: seconds without a request before the model is unloaded
	// (0: never; default --unload-after).
	UnloadAfterS *int64 `json:"unload_after_s"`
}

// maxConfigModels bounds a --config file's models; maxConfigSeconds its
// durations (the flags' bound).
const (
	maxConfigModels  = 64
	maxConfigSeconds = 1 << 30
)

// parseServeConfig reads --config's JSON from r (named file in errors): a
// "models" list of at least one entry, each with a path and optionally a
// name, priority, keep_alive_s and unload_after_s, unknown fields refused.
// Entries without a value take def's (the flags'). Relative paths are
// resolved against file's directory. Names must be unique; absent ones are
// the paths' base names, with their position added where two repeat.
func parseServeConfig(file string, r io.Reader, def fleetSpec) ([]fleetSpec, error) {
	data, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", file, err)
	}
	if len(data) > 1<<20 {
		return nil, fmt.Errorf("--config %s: larger than 1 MiB", file)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c serveConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("--config %s: %w", file, configJSONError(data, err))
	}
	if dec.More() {
		return nil, fmt.Errorf("--config %s: more than one JSON value", file)
	}
	switch {
	case len(c.Models) == 0:
		return nil, fmt.Errorf("--config %s: models: want at least one model", file)
	case len(c.Models) > maxConfigModels:
		return nil, fmt.Errorf("--config %s: models: %d models, at most %d", file, len(c.Models), maxConfigModels)
	}
	dir := filepath.Dir(file)
	specs := make([]fleetSpec, len(c.Models))
	named := map[string]int{}
	for i, m := range c.Models {
		at := func(field, format string, a ...any) error {
			return fmt.Errorf("--config %s: models[%d].%s: %s", file, i, field, fmt.Sprintf(format, a...))
		}
		s := def
		switch {
		case strings.TrimSpace(m.Path) == "":
			return nil, at("path", "missing or empty")
		case strings.ContainsRune(m.Path, 0):
			return nil, at("path", "%q holds a NUL byte", m.Path)
		case m.Path == "-":
			return nil, at("path", "standard input serves alone: give a file")
		}
		s.path = m.Path
		if !filepath.IsAbs(s.path) {
			s.path = filepath.Join(dir, s.path)
		}
		if m.Name != "" {
			if strings.TrimSpace(m.Name) == "" || strings.ContainsAny(m.Name, "\x00\n\r") {
				return nil, at("name", "%q: want a visible name on one line", m.Name)
			}
			if j, ok := named[m.Name]; ok {
				return nil, at("name", "%q names models[%d] too", m.Name, j)
			}
			named[m.Name] = i
		}
		s.name = m.Name
		if p := m.Priority; p != nil {
			if !(*p > 0) || math.IsInf(*p, 0) || *p > 1e6 {
				return nil, at("priority", "%v: want a number above 0, at most 1e6", *p)
			}
			s.priority = *p
		}
		if k := m.KeepAliveS; k != nil {
			if *k < -1 || *k > maxConfigSeconds {
				return nil, at("keep_alive_s", "%d: want -1 (forever), 0 (none) or seconds up to %d", *k, maxConfigSeconds)
			}
			s.keepAlive = keepAliveOf(*k)
		}
		if u := m.UnloadAfterS; u != nil {
			if *u < 0 || *u > maxConfigSeconds {
				return nil, at("unload_after_s", "%d: want 0 (never) or seconds up to %d", *u, maxConfigSeconds)
			}
			s.unloadAfter = time.Duration(*u) * time.Second
		}
		specs[i] = s
	}
	nameDefaults(specs, named)
	return specs, nil
}

// nameDefaults names the specs without a name after their paths' base
// names, with their position added where a base name repeats or is taken
// (and a count after that where that too is taken); a base name no other
// model shares stays as it is unless a given name took it.
func nameDefaults(specs []fleetSpec, taken map[string]int) {
	base := func(s fleetSpec) string { return filepath.Base(strings.TrimRight(s.path, "/")) }
	count := map[string]int{}
	for _, s := range specs {
		if s.name == "" {
			count[base(s)]++
		}
	}
	// Base names no other model shares are kept first, so that the
	// numbered ones go around them.
	for i := range specs {
		if b := base(specs[i]); specs[i].name == "" && count[b] == 1 {
			if _, ok := taken[b]; !ok {
				specs[i].name = b
				taken[b] = i
			}
		}
	}
	for i := range specs {
		if specs[i].name != "" {
			continue
		}
		b := base(specs[i])
		n := b
		if _, ok := taken[n]; ok || count[b] > 1 {
			n = fmt.Sprintf("%s-%d", b, i+1)
		}
		for k := 2; ; k++ {
			if _, ok := taken[n]; !ok {
				break
			}
			n = fmt.Sprintf("%s-%d-%d", b, i+1, k)
		}
		specs[i].name = n
		taken[n] = i
	}
}

// keepAliveOf turns keep-alive seconds (-1 forever, 0 none) into
// fleet.Model.KeepAlive, whose 0 means the default.
func keepAliveOf(s int64) time.Duration {
	switch s {
	case 0:
		return time.Nanosecond
	case -1:
		return -1
	}
	return time.Duration(s) * time.Second
}

// configJSONError says where in data a decoding error lies.
func configJSONError(data []byte, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		line, col := lineCol(data, se.Offset)
		return fmt.Errorf("line %d, column %d: %w", line, col, err)
	case errors.As(err, &te):
		line, col := lineCol(data, te.Offset)
		return fmt.Errorf("line %d, column %d: %s: want %s, got %s", line, col, te.Field, te.Type, te.Value)
	case errors.Is(err, io.EOF):
		return errors.New("empty: want {\"models\": [{\"path\": ...}]}")
	}
	return err
}

func lineCol(data []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line = 1 + bytes.Count(before, []byte("\n"))
	return line, int(off) - bytes.LastIndexByte(before, '\n')
}
