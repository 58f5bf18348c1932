package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestParseServeConfigDefaults: entries without a value take the flags';
// paths are resolved against the file's directory unless absolute; names
// default to the base names, numbered where two repeat or one is taken.
func TestParseServeConfigDefaults(t *testing.T) {
	def := fleetSpec{priority: 1, keepAlive: 5 * time.Minute, unloadAfter: 30 * time.Minute}
	file := filepath.Join("conf", "serve.json")
	specs, err := parseServeConfig(file, strings.NewReader(`{"models": [
		{"path": "a/model.gguf"},
		{"path": "/m/b/model.gguf", "priority": 2.5, "keep_alive_s": 0, "unload_after_s": 0},
		{"path": "x.gguf", "name": "model.gguf-1"},
		{"path": "c/d.gguf", "name": "d", "keep_alive_s": -1, "unload_after_s": 60}
	]}`), def)
	if err != nil {
		t.Fatal(err)
	}
	want := []fleetSpec{
		{path: filepath.Join("conf", "a", "model.gguf"), name: "model.gguf-1-2", priority: 1, keepAlive: 5 * time.Minute, unloadAfter: 30 * time.Minute},
		{path: "/m/b/model.gguf", name: "model.gguf-2", priority: 2.5, keepAlive: time.Nanosecond},
		{path: filepath.Join("conf", "x.gguf"), name: "model.gguf-1", priority: 1, keepAlive: 5 * time.Minute, unloadAfter: 30 * time.Minute},
		{path: filepath.Join("conf", "c", "d.gguf"), name: "d", priority: 1, keepAlive: -1, unloadAfter: time.Minute},
	}
	// The first default, "model.gguf" repeated, is numbered by position:
	// "model.gguf-1", which the third entry took, so it is counted on.
	if len(specs) != len(want) {
		t.Fatalf("%d specs, want %d", len(specs), len(want))
	}
	for i := range want {
		if specs[i] != want[i] {
			t.Errorf("models[%d]: %+v, want %+v", i, specs[i], want[i])
		}
	}
	seen := map[string]bool{}
	for _, s := range specs {
		if s.name == "" || seen[s.name] {
			t.Fatalf("names %+v: empty or repeated", specs)
		}
		seen[s.name] = true
	}
}

// FuzzServeConfig: any file parses or fails with an error naming it; what
// parses has one spec per model, every one with a path, a unique name, a
// priority above 0 and durations in the flags' bounds.
func FuzzServeConfig(f *testing.F) {
	for _, s := range []string{
		`{"models": [{"path": "a.gguf"}]}`,
		`{"models": [{"path": "a", "name": "x", "priority": 3, "keep_alive_s": -1, "unload_after_s": 10}, {"path": "a"}, {"path": "a"}]}`,
		`{"models": [{"path": "a", "name": "a"}, {"path": "b/a"}]}`,
		`{"models": []}`, `{}`, ``, `[]`, `{"models": [{"path": 1}]}`, `{"models": [{"path": "a", "priority": 1e400}]}`,
		`{"models": [{"path": "a", "keep_alive_s": 1073741825}]}`, `{"models": [{"path": "a"}]} x`,
	} {
		f.Add(s)
	}
	def := fleetSpec{priority: 1, keepAlive: time.Minute, unloadAfter: time.Hour}
	f.Fuzz(func(t *testing.T, body string) {
		specs, err := parseServeConfig("f.json", strings.NewReader(body), def)
		if err != nil {
			if !strings.Contains(err.Error(), "f.json") {
				t.Fatalf("error without the file's name: %v", err)
			}
			return
		}
		if len(specs) == 0 || len(specs) > maxConfigModels {
			t.Fatalf("%d specs", len(specs))
		}
		names := map[string]bool{}
		for _, s := range specs {
			switch {
			case s.path == "" || s.name == "" || names[s.name]:
				t.Fatalf("spec %+v among %+v", s, specs)
			case !(s.priority > 0) || s.priority > 1e6:
				t.Fatalf("priority %v", s.priority)
			case s.keepAlive < -1 || s.keepAlive > maxConfigSeconds*time.Second || s.keepAlive == 0:
				t.Fatalf("keep-alive %v", s.keepAlive)
			case s.unloadAfter < 0 || s.unloadAfter > maxConfigSeconds*time.Second:
				t.Fatalf("unload-after %v", s.unloadAfter)
			}
			names[s.name] = true
		}
	})
}

// TestFleetNames: MODEL arguments' default names are unique even where a
// numbered name is another model's base name.
func TestFleetNames(t *testing.T) {
	got, err := fleetNames("", []string{"a/m", "b/m", "c/m-2", "d/"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"m-1", "m-2-2", "m-2", "d"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("names %v, want %v", got, want)
	}
	if _, err := fleetNames("x,x", []string{"a", "b"}); err == nil || !strings.Contains(err.Error(), `"x" names two models`) {
		t.Fatalf("repeated --model-name: %v", err)
	}
}
