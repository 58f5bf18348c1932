package main

import (
	"errors"
	"os"
	"sync"
)

// tempFiles is the registry of the temporary files and directories a run
// has made and not yet renamed into place or removed: the files an output
// is written to before its rename, a pipe's copy. A verb's own cleanup
// removes them as it unwinds; a second signal does not wait for that, so
// the signal handler removes what is still registered (removeAll) before
// the process exits.
//
// A file is made and registered under the registry's lock, and renamed or
// removed and unregistered under it too, so removeAll never misses a file
// that was being made nor removes one that was renamed into place. After
// removeAll nothing more is made or renamed (CreateTemp, MkdirTemp and
// Rename fail with errExiting; removing still works). The zero value is
// ready to use; a nil *tempFiles makes, renames and removes files without
// registering them.
type tempFiles struct {
	mu      sync.Mutex
	paths   map[string]bool // path → is a directory
	exiting bool
}

// errExiting is what a registry refuses with once the process is exiting.
var errExiting = errors.New("memwall is exiting")

// CreateTemp is os.CreateTemp, with the file registered.
func (t *tempFiles) CreateTemp(dir, pattern string) (*os.File, error) {
	if t == nil {
		return os.CreateTemp(dir, pattern)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exiting {
		return nil, errExiting
	}
	f, err := os.CreateTemp(dir, pattern)
	if err == nil {
		t.add(f.Name(), false)
	}
	return f, err
}

// MkdirTemp is os.MkdirTemp, with the directory registered (RemoveAll
// removes it and what is in it).
func (t *tempFiles) MkdirTemp(dir, pattern string) (string, error) {
	if t == nil {
		return os.MkdirTemp(dir, pattern)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exiting {
		return "", errExiting
	}
	d, err := os.MkdirTemp(dir, pattern)
	if err == nil {
		t.add(d, true)
	}
	return d, err
}

func (t *tempFiles) add(path string, dir bool) {
	if t.paths == nil {
		t.paths = map[string]bool{}
	}
	t.paths[path] = dir
}

// Rename is os.Rename of a registered file, which it unregisters when the
// rename succeeds.
func (t *tempFiles) Rename(tmp, path string) error {
	if t == nil {
		return os.Rename(tmp, path)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exiting {
		return errExiting
	}
	err := os.Rename(tmp, path)
	if err == nil {
		delete(t.paths, tmp)
	}
	return err
}

// Remove is os.Remove of a registered file, which it unregisters.
func (t *tempFiles) Remove(tmp string) error { return t.drop(tmp, os.Remove) }

// RemoveAll is os.RemoveAll of a registered directory, which it
// unregisters.
func (t *tempFiles) RemoveAll(dir string) error { return t.drop(dir, os.RemoveAll) }

// drop unregisters path and removes it with remove.
func (t *tempFiles) drop(path string, remove func(string) error) error {
	if t == nil {
		return remove(path)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.paths, path)
	return remove(path)
}

// removeAll removes every file and directory still registered, and
// refuses to make or rename any from then on: the process is about to
// exit.
func (t *tempFiles) removeAll() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.exiting = true
	for p, dir := range t.paths {
		if dir {
			os.RemoveAll(p)
		} else {
			os.Remove(p)
		}
		delete(t.paths, p)
	}
}

// registered is how many files and directories are registered.
func (t *tempFiles) registered() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.paths)
}
