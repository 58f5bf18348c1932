package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// outputFile is a file a verb writes besides its report (--out, --svg,
// --html): checked before the work starts, written when the work is done.
//
// The rules: a regular file or an absent path is replaced atomically (a
// temporary file in the same directory, synced, then renamed over it, so a
// reader sees the old bytes or the new ones, never a mix); a symbolic link
// is followed and its final target written by those rules, so the link stays
// a link; a character device or a named pipe (/dev/stdout, /dev/null, a
// FIFO) is written through, never replaced; a directory, a block device, a
// socket, a missing or unwritable directory are refused before the work.
// The temporary file is removed on every error, and the work's context is
// cancelled by SIGTERM as by SIGINT (see newEnv), so an interrupted run
// leaves none behind.
type outputFile struct {
	flag    string      // "--out", for messages
	path    string      // as given
	target  string      // the path written: path with its links resolved
	through bool        // write through (a device node or a pipe)
	mode    fs.FileMode // permissions of the file replaced, or 0o644
}

// checkOutput checks that path, the value of flag (such as "--out"), can be
// written by outputFile's rules, and returns the file to write when the work
// is done; it returns nil, nil when path is empty (the flag not given). Its
// errors name the flag and the path; they are failures (exit status 1), not
// usage errors: the command line is well formed, the file system refuses.
func checkOutput(flag, path string) (*outputFile, error) {
	if path == "" {
		return nil, nil
	}
	o := &outputFile{flag: flag, path: path, target: path, mode: 0o644}
	if lst, err := os.Lstat(path); err == nil && lst.Mode()&fs.ModeSymlink != 0 {
		t, err := resolveLink(path)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", flag, path, err)
		}
		o.target = t
	}
	st, err := os.Stat(o.target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("%s %s: %v", flag, path, pathErr(err))
	case st.IsDir():
		return nil, fmt.Errorf("%s %s: is a directory; give a file name", flag, path)
	case st.Mode()&fs.ModeNamedPipe != 0:
		// Not opened now: opening a pipe for writing waits for its reader.
		o.through = true
		return o, nil
	case st.Mode()&fs.ModeCharDevice != 0:
		// Opened for writing now, so a read-only device fails here.
		f, err := os.OpenFile(o.target, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", flag, path, pathErr(err))
		}
		f.Close()
		o.through = true
		return o, nil
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s %s: not a regular file (%s); memwall writes only regular files, character devices and pipes", flag, path, st.Mode().Type())
	default:
		o.mode = st.Mode().Perm()
	}
	dir := filepath.Dir(o.target)
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%s %s: directory %s: %v", flag, path, dir, pathErr(err))
	} else if !st.IsDir() {
		return nil, fmt.Errorf("%s %s: %s is not a directory", flag, path, dir)
	}
	// Prove the directory takes a new file: the same temporary file the
	// write will make, removed at once.
	f, err := os.CreateTemp(dir, "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("%s %s: cannot create a file in %s: %v", flag, path, dir, pathErr(err))
	}
	f.Close()
	os.Remove(f.Name())
	return o, nil
}

// resolveLink follows the symbolic link path to its final target, which may
// not exist yet (a dangling link names the file to create).
func resolveLink(path string) (string, error) {
	for range 40 {
		lst, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return path, nil
		}
		if err != nil {
			return "", pathErr(err)
		}
		if lst.Mode()&fs.ModeSymlink == 0 {
			return path, nil
		}
		t, err := os.Readlink(path)
		if err != nil {
			return "", pathErr(err)
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(path), t)
		}
		path = t
	}
	return "", errors.New("too many levels of symbolic links")
}

// pathErr drops the operation and path from an *fs.PathError (the caller
// names the path the user gave, not a resolved or temporary one).
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// write writes data to the file by outputFile's rules; a nil o writes
// nothing. The error names the flag and the path given, never the
// temporary file.
func (o *outputFile) write(data []byte) error {
	if o == nil {
		return nil
	}
	if err := o.put(data); err != nil {
		return fmt.Errorf("%s %s: %w", o.flag, o.path, pathErr(err))
	}
	return nil
}

func (o *outputFile) put(data []byte) error {
	if o.through {
		f, err := os.OpenFile(o.target, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	// Something may have taken the path's place since checkOutput.
	if st, err := os.Lstat(o.target); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("became a %s since the start; not replaced", st.Mode().Type())
	}
	f, err := os.CreateTemp(filepath.Dir(o.target), "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(o.mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, o.target); err != nil {
		return err
	}
	ok = true
	return nil
}

// String is the path as the user gave it.
func (o *outputFile) String() string { return o.path }
