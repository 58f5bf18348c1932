package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// outputFile is a file a verb writes besides its report (--out, --svg,
// --html): checked before the work starts, written when the work is done.
//
// The rules: a regular file or an absent path is replaced atomically (a
// temporary file in the same directory, synced, then renamed over it, so a
// reader sees the old bytes or the new ones, never a mix); a symbolic link
// is followed and its final target written by those rules, so the link stays
// a link; one of the process's open descriptors (/dev/stdout, /dev/stderr,
// /dev/fd/N, /proc/self/fd/N) is written to that descriptor, whatever it is
// open on (a pipe, a terminal, a file, which is then written at its offset,
// not replaced); a character device or a named pipe (/dev/null, a FIFO) is
// written through, never replaced; a directory, a block device, a socket, a
// missing or unwritable directory are refused before the work. checkFiles
// then refuses an output that is one of the verb's inputs. The temporary
// file is removed on every error, and the work's context is cancelled by
// SIGTERM as by SIGINT (see newEnv), so an interrupted run leaves none
// behind.
type outputFile struct {
	flag    string      // "--out", for messages
	path    string      // as given
	target  string      // the path written: path with its links resolved
	through bool        // write through (a device node, a pipe or a descriptor)
	fd      int         // the open descriptor target names, or -1
	w       io.Writer   // set by checkFiles: the env's stream that fd (or the file) is
	mode    fs.FileMode // permissions of the file replaced, or 0o644
	temps   *tempFiles  // registers the temporary file (nil: none)
}

// checkOutput checks that path, the value of flag (such as "--out"), can be
// written by outputFile's rules, and returns the file to write when the work
// is done; it returns nil, nil when path is empty (the flag not given). Its
// errors name the flag and the path; they are failures (exit status 1), not
// usage errors: the command line is well formed, the file system refuses.
// The temporary files (the directory's proof now, the file written later)
// are made and removed through temps (the run's registry; nil: none).
func checkOutput(temps *tempFiles, flag, path string) (*outputFile, error) {
	if path == "" {
		return nil, nil
	}
	o := &outputFile{flag: flag, path: path, target: path, fd: -1, mode: 0o644, temps: temps}
	if lst, err := os.Lstat(path); err == nil && lst.Mode()&fs.ModeSymlink != 0 {
		t, err := resolveLink(path)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", flag, path, err)
		}
		o.target = t
	}
	if fd, ok := descriptorPath(o.target); ok {
		// Not reopened: a pipe's link names no file, and reopening a
		// regular file would write it from its start.
		if _, err := os.Stat(o.target); err != nil {
			return nil, fmt.Errorf("%s %s: descriptor %d is not open: %v", flag, path, fd, pathErr(err))
		}
		o.fd, o.through = fd, true
		return o, nil
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
	f, err := temps.CreateTemp(dir, "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("%s %s: cannot create a file in %s: %v", flag, path, dir, pathErr(err))
	}
	f.Close()
	temps.Remove(f.Name())
	return o, nil
}

// resolveLink follows the symbolic link path to its final target, which may
// not exist yet (a dangling link names the file to create). It stops at a
// path that names an open descriptor (descriptorPath): /dev/stdout is a link
// to /proc/self/fd/1, itself a link to what the descriptor is open on, which
// for a pipe is no path at all.
func resolveLink(path string) (string, error) {
	for range 40 {
		if _, ok := descriptorPath(path); ok {
			return path, nil
		}
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
	switch {
	case o.w != nil:
		_, err := o.w.Write(data)
		return err
	case o.fd >= 0:
		return writeDescriptor(o.fd, data)
	}
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
	f, err := o.temps.CreateTemp(filepath.Dir(o.target), "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			o.temps.Remove(tmp)
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
	if err := o.temps.Rename(tmp, o.target); err != nil {
		return err
	}
	ok = true
	return nil
}

// String is the path as the user gave it.
func (o *outputFile) String() string { return o.path }

// descriptorPath reports whether path names one of the process's open
// descriptors, and which: /dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N,
// /proc/self/fd/N and /proc/PID/fd/N with the process's own PID.
func descriptorPath(path string) (int, bool) {
	p := filepath.Clean(path)
	switch p {
	case "/dev/stdin":
		return 0, true
	case "/dev/stdout":
		return 1, true
	case "/dev/stderr":
		return 2, true
	}
	for _, dir := range []string{"/dev/fd/", "/proc/self/fd/", "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/"} {
		if n, ok := strings.CutPrefix(p, dir); ok {
			if fd, err := strconv.Atoi(n); err == nil && fd >= 0 && strconv.Itoa(fd) == n {
				return fd, true
			}
		}
	}
	return 0, false
}

// input is a file or directory a verb reads, for checkFiles: what names it
// in messages ("MODEL", "--lifetimes", "MODEL's config.json").
type input struct{ what, path string }

// checkFiles checks a verb's outputs, each already checked by checkOutput
// (nil ones, flags not given, are skipped), against its inputs and against
// each other before the work. It refuses an output that is an input — the
// same path, the same file by another path (a hard link, a symbolic link,
// ./x for x) or a path inside an input directory — and two outputs that are
// one file (descriptors, devices and pipes excepted: they are written in
// turn). Its errors name both paths and, like checkOutput's, are failures
// (exit status 1): nothing was done.
//
// It then binds the outputs that are the process's stdout — /dev/stdout,
// /dev/fd/1, or the file or pipe that stdout is open on — to e.stdout, and
// sends the verb's report to stderr (e.stdout becomes e.stderr), so that
// stdout gets the output's bytes and nothing else; an output that is
// /dev/stderr is bound to e.stderr.
func checkFiles(e *env, ins []input, outs ...*outputFile) error {
	type stated struct {
		input
		st fs.FileInfo
	}
	var files, dirs []stated
	for _, in := range ins {
		st, err := os.Stat(in.path)
		switch {
		case in.path == "" || err != nil: // the verb names it when it reads it
		case st.IsDir():
			dirs = append(dirs, stated{in, st})
		case st.Mode().IsRegular():
			files = append(files, stated{in, st})
		}
	}
	var written []*outputFile
	for _, o := range outs {
		if o != nil {
			written = append(written, o)
		}
	}
	for i, o := range written {
		st, err := os.Stat(o.target)
		for _, in := range ins {
			if in.path != "" && filepath.Clean(in.path) == filepath.Clean(o.path) {
				return fmt.Errorf("%s %s: is the input %s %s; memwall does not write over what it reads (give another path)", o.flag, o.path, in.what, in.path)
			}
		}
		if err == nil && st.Mode().IsRegular() {
			for _, in := range files {
				if os.SameFile(st, in.st) {
					return fmt.Errorf("%s %s: is the same file as the input %s %s; memwall does not write over what it reads (give another path)", o.flag, o.path, in.what, in.path)
				}
			}
		}
		if o.through {
			continue
		}
		for _, in := range dirs {
			if insideDir(o.target, in.st) {
				return fmt.Errorf("%s %s: is inside the input %s %s, a directory; memwall does not write into what it reads (give a path outside it)", o.flag, o.path, in.what, in.path)
			}
		}
		for _, p := range written[:i] {
			if !p.through && sameOutput(p.target, o.target) {
				return fmt.Errorf("%s %s and %s %s are the same file; give each its own path", p.flag, p.path, o.flag, o.path)
			}
		}
	}
	var stdout fs.FileInfo
	if f := stdoutFile(e.stdout); f != nil {
		if st, err := f.Stat(); err == nil && (st.Mode().IsRegular() || st.Mode()&fs.ModeNamedPipe != 0) {
			stdout = st
		}
	}
	report := e.stdout
	for _, o := range written {
		st, err := os.Stat(o.target)
		switch {
		case o.fd == 1 || stdout != nil && err == nil && os.SameFile(st, stdout):
			o.w, o.through = report, true
			e.stdout = e.stderr
		case o.fd == 2:
			o.w = e.stderr
		}
	}
	return nil
}

// insideDir reports whether the file path would be in the directory dir or
// in one below it, its links resolved.
func insideDir(path string, dir fs.FileInfo) bool {
	d, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return false
	}
	if r, err := filepath.EvalSymlinks(d); err == nil {
		d = r
	}
	for {
		if st, err := os.Stat(d); err == nil && os.SameFile(st, dir) {
			return true
		}
		up := filepath.Dir(d)
		if up == d {
			return false
		}
		d = up
	}
}

// sameOutput reports whether two output paths (links resolved) are one
// file: the same file when both exist, else the same path once their
// directories' links are resolved.
func sameOutput(a, b string) bool {
	sa, ea := os.Stat(a)
	sb, eb := os.Stat(b)
	if ea == nil && eb == nil {
		return os.SameFile(sa, sb)
	}
	return realPath(a) == realPath(b)
}

// realPath is path made absolute with its directory's links resolved.
func realPath(path string) string {
	p, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	if d, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		p = filepath.Join(d, filepath.Base(p))
	}
	return p
}
