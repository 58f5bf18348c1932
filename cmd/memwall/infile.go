package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// isPipe reports whether path is something to read once, from its start:
// a pipe, a FIFO or a device (/dev/stdin, <(...)), not a file or a
// directory.
func isPipe(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && !st.Mode().IsRegular()
}

// spoolPipe makes an input that is a pipe (isPipe) readable as a file: its
// bytes are copied to a temporary file, in a directory of its own under the
// system's temporary directory ($TMPDIR), which e.local(path) names from
// then on and the returned function removes; the copy takes as much disk
// as the input; the directory is registered in e.temps. The formats memwall maps into memory (safetensors, GGUF,
// ONNX weights) and the readers that read their input twice need it. A
// file, a directory or a path that does not exist is left as it is (and
// the function returned does nothing); kind is the copy's kind (sniff),
// "" when nothing was copied. what names the input in errors ("MODEL").
func spoolPipe(e *env, what, path string) (remove func(), kind string, err error) {
	nothing := func() {}
	if !isPipe(path) {
		return nothing, "", nil
	}
	fail := func(err error) (func(), string, error) {
		return nothing, "", fmt.Errorf("%s %s: copying the pipe to a temporary file: %w", what, path, pathErr(err))
	}
	src, err := os.Open(path)
	if err != nil {
		return fail(err)
	}
	defer src.Close()
	dir, err := e.temps.MkdirTemp("", "memwall-pipe-")
	if err != nil {
		return fail(err)
	}
	local := filepath.Join(dir, filepath.Base(path))
	dst, err := os.OpenFile(local, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = io.Copy(dst, ctxReader{e.ctx, src})
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		kind, err = sniffFile(local)
	}
	if err != nil {
		e.temps.RemoveAll(dir)
		return fail(err)
	}
	if e.spooled == nil {
		e.spooled = map[string]string{}
	}
	e.spooled[path] = local
	return func() {
		delete(e.spooled, path)
		e.temps.RemoveAll(dir)
	}, kind, nil
}

// spoolModel is spoolPipe for a model (MODEL). It refuses what cannot come
// from a pipe, which has no directory: a sharded safetensors index (its
// shards are beside it) and, when config is set (a Llama model to run), a
// safetensors file (its config.json is beside it).
func spoolModel(e *env, path string, config bool) (remove func(), err error) {
	remove, kind, err := spoolPipe(e, "MODEL", path)
	if err != nil {
		return remove, err
	}
	switch {
	case kind == kindJSON:
		err = fmt.Errorf("%s: cannot read a sharded safetensors index from a pipe (its shards are files beside it); give the index's path", path)
	case kind == kindSafetensors && config:
		err = fmt.Errorf("%s: cannot read a safetensors model to run from a pipe (its config.json is a file beside it); give the file's path, or a GGUF file (it holds its config)", path)
	}
	if err != nil {
		remove()
		return func() {}, err
	}
	return remove, nil
}

// local is the path to read for the input path: the copy of a pipe that
// spoolPipe made, else path itself.
func (e *env) local(path string) string {
	if p, ok := e.spooled[path]; ok {
		return p
	}
	return path
}

// openInput opens the input path with open, reading the copy of a pipe
// (spoolPipe) in its place; an error naming the copy names path instead.
func openInput[T any](e *env, path string, open func(string) (T, error)) (T, error) {
	local := e.local(path)
	v, err := open(local)
	if err != nil && local != path {
		err = renamedError{err, local, path}
	}
	return v, err
}

// renamedError is err with one path in its message replaced by another;
// errors.Is and errors.As see err.
type renamedError struct {
	err      error
	from, to string
}

func (r renamedError) Error() string { return strings.ReplaceAll(r.err.Error(), r.from, r.to) }
func (r renamedError) Unwrap() error { return r.err }

// ctxReader reads from r until ctx is cancelled (between reads).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if c.ctx != nil {
		if err := c.ctx.Err(); err != nil {
			return 0, err
		}
	}
	return c.r.Read(p)
}

// modelInputs are the files a model at path is read from, for checkFiles:
// the path (a file, or a directory, all of which counts as read), and for a
// file the config.json and tokenizer.json beside it and, for a sharded
// safetensors index, its shards.
func modelInputs(what, path string) []input {
	ins := []input{{what, path}}
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return ins
	}
	dir := filepath.Dir(path)
	for _, name := range []string{"config.json", "tokenizer.json"} {
		ins = append(ins, input{what + "'s " + name, filepath.Join(dir, name)})
	}
	if !strings.HasSuffix(path, ".json") || st.Size() > 64<<20 {
		return ins
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ins
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if json.Unmarshal(b, &index) != nil {
		return ins
	}
	var shards []string
	for _, f := range index.WeightMap {
		shards = append(shards, f)
	}
	slices.Sort(shards)
	for _, f := range slices.Compact(shards) {
		ins = append(ins, input{what + "'s shard", filepath.Join(dir, f)})
	}
	return ins
}
