package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// noTemps fails if dir holds a leftover temporary file.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") || strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

func TestOutputFileRegularAndAbsent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "r.json")
	o, err := checkOutput(nil, "--out", p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("checkOutput created the file: %v", err)
	}
	if err := o.write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = checkOutput(nil, "--out", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.write([]byte("two")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "two" || st.Mode().Perm() != 0o600 {
		t.Errorf("got %q mode %v; want \"two\" mode 0600 (kept)", b, st.Mode().Perm())
	}
	noTemps(t, dir)
	var none *outputFile
	if err := none.write([]byte("x")); err != nil {
		t.Errorf("nil outputFile: %v", err)
	}
	if o, err := checkOutput(nil, "--out", ""); o != nil || err != nil {
		t.Errorf("empty path: %v, %v", o, err)
	}
}

// TestOutputFileLink: a link is written through to its target (relative,
// chained and dangling links too) and stays a link.
func TestOutputFileLink(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	target := filepath.Join(sub, "target.json")
	os.WriteFile(target, []byte("old"), 0o644)
	link1 := filepath.Join(dir, "link1")
	link2 := filepath.Join(dir, "link2")
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink("sub/target.json", link1); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	os.Symlink(link1, link2)
	os.Symlink(filepath.Join(sub, "new.json"), dangling)
	for _, c := range []struct{ link, target string }{{link1, target}, {link2, target}, {dangling, filepath.Join(sub, "new.json")}} {
		o, err := checkOutput(nil, "--out", c.link)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.write([]byte("new " + c.link)); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Lstat(c.link); err != nil || st.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a link: %v", c.link, err)
		}
		if b, _ := os.ReadFile(c.target); string(b) != "new "+c.link {
			t.Errorf("target of %s holds %q", c.link, b)
		}
	}
	noTemps(t, dir)
	noTemps(t, sub)
	loop := filepath.Join(dir, "loop")
	os.Symlink(loop, loop)
	if _, err := checkOutput(nil, "--out", loop); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Errorf("a link loop: %v", err)
	}
}

// TestOutputFileRefused: what is refused is refused before the work, with
// the flag and the path given in the message and no temporary path.
func TestOutputFileRefused(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ path, want string }{
		{dir, "is a directory"},
		{filepath.Join(dir, "no", "x.json"), "no such file or directory"},
		{filepath.Join(dir, "f", "x.json"), "not a directory"},
	} {
		if c.want == "not a directory" {
			os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
		}
		_, err := checkOutput(nil, "--html", c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--html "+c.path) {
			t.Errorf("%s: %v; want %q naming the flag and path", c.path, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), ".tmp") {
			t.Errorf("%s: the message shows a temporary file: %v", c.path, err)
		}
	}
	if os.Getuid() != 0 {
		ro := filepath.Join(dir, "ro")
		os.Mkdir(ro, 0o555)
		if _, err := checkOutput(nil, "--out", filepath.Join(ro, "x")); err == nil || strings.Contains(err.Error(), ".tmp") {
			t.Errorf("read-only directory: %v", err)
		}
	}
}

// TestOutputFileDevice: a character device is written through, never
// replaced.
func TestOutputFileDevice(t *testing.T) {
	st, err := os.Stat(os.DevNull)
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Skip("no character device", os.DevNull)
	}
	o, err := checkOutput(nil, "--out", os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	if !o.through {
		t.Fatalf("%s is not written through", os.DevNull)
	}
	if err := o.write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(os.DevNull); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("%s is no longer a device: %v %v", os.DevNull, st.Mode(), err)
	}
	if _, err := os.Stat("/dev/full"); err == nil {
		o, err := checkOutput(nil, "--out", "/dev/full")
		if err == nil {
			err = o.write([]byte("x"))
		}
		if err == nil || !strings.Contains(err.Error(), "--out /dev/full") {
			t.Errorf("/dev/full: %v; want an error naming it", err)
		}
		if st, err := os.Stat("/dev/full"); err != nil || st.Mode()&os.ModeCharDevice == 0 {
			t.Fatalf("/dev/full is no longer a device")
		}
	}
}
