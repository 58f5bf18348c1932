package mmap

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"small", []byte("hello, mapping")},
		{"pages", bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 3000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			if err := os.WriteFile(p, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			if m.Len() != len(c.data) || !bytes.Equal(m.Bytes(), c.data) {
				t.Fatalf("mapped %d bytes, want %d equal bytes", m.Len(), len(c.data))
			}
			if m.Path() != p {
				t.Errorf("Path() = %q, want %q", m.Path(), p)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if m.Bytes() != nil || m.Len() != 0 {
				t.Error("Bytes() not nil after Close")
			}
			if err := m.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		path string
	}{
		{"missing", filepath.Join(dir, "nope")},
		{"directory", dir},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Open(c.path)
			if err == nil {
				m.Close()
				t.Fatal("Open succeeded")
			}
			if !bytes.Contains([]byte(err.Error()), []byte(c.path)) {
				t.Errorf("error %q does not name %s", err, c.path)
			}
		})
	}
}
