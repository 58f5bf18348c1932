package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// File kinds sniffFile tells apart by their first bytes.
const (
	kindEmpty       = "empty"
	kindGGUF        = "GGUF"
	kindSafetensors = "safetensors"
	kindJSON        = "JSON"
	kindONNX        = "ONNX"
	kindGzip        = "gzip"
	kindZip         = "zip"
	kindText        = "text"
	kindBinary      = "binary"
)

// sniff names the kind of a file from its first bytes (head) and its size:
// GGUF by its magic, safetensors by its 8-byte header length and the '{'
// that follows, gzip and zip by their magic, JSON by its first non-space
// byte, ONNX by the protobuf key of ModelProto's first field (ir_version,
// field 1, varint: 0x08) followed by a small version, text when the bytes
// are printable UTF-8, and binary otherwise.
func sniff(head []byte, size int64) string {
	switch {
	case size == 0 || len(head) == 0:
		return kindEmpty
	case bytes.HasPrefix(head, []byte("GGUF")):
		return kindGGUF
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return kindGzip
	case bytes.HasPrefix(head, []byte("PK\x03\x04")):
		return kindZip
	case len(head) >= 9 && head[8] == '{' && binary.LittleEndian.Uint64(head) <= uint64(size-8):
		return kindSafetensors
	case len(head) >= 2 && head[0] == 0x08 && head[1] > 0 && head[1] < 0x40:
		return kindONNX
	}
	t := bytes.TrimLeft(head, " \t\r\n\ufeff")
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') && printable(head) {
		return kindJSON
	}
	if printable(head) {
		return kindText
	}
	return kindBinary
}

// printable reports whether b is UTF-8 text without control bytes other
// than tab, newline and carriage return (a rune cut at the end is allowed).
func printable(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f {
			return false
		}
		b = b[n:]
	}
	return true
}

// sniffFile reads the first bytes of path and returns its kind (see sniff).
func sniffFile(path string) (string, error) {
	f, _, kind, err := openSniffed(path)
	if err != nil {
		return "", err
	}
	f.Close()
	return kind, nil
}

// sniffBytes is how many bytes sniff looks at.
const sniffBytes = 512

// openSniffed opens path and finds its kind (see sniff) from its first
// bytes without consuming them: the file is read through the returned
// reader, from its first byte, whether it is a file, a pipe or a device
// (a pipe's size is what it holds until its end). Close the file.
func openSniffed(path string) (*os.File, *bufio.Reader, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, "", err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, "", err
	}
	if st.IsDir() {
		f.Close()
		return nil, nil, "", fmt.Errorf("%s: is a directory", path)
	}
	r := bufio.NewReaderSize(f, 64<<10)
	head, err := r.Peek(sniffBytes)
	if err != nil && err != io.EOF {
		f.Close()
		return nil, nil, "", err
	}
	size := st.Size()
	if !st.Mode().IsRegular() {
		size = math.MaxInt64
		if len(head) < sniffBytes {
			size = int64(len(head))
		}
	}
	return f, r, sniff(head, size), nil
}

// kindPhrase describes a kind for a message: "a text file", "an empty
// file", "a gzip-compressed file".
func kindPhrase(kind string) string {
	switch kind {
	case kindEmpty:
		return "an empty file"
	case kindGzip:
		return "a gzip-compressed file"
	case kindZip:
		return "a zip archive"
	case kindText:
		return "a text file"
	case kindBinary:
		return "a binary file of no format memwall knows"
	case kindJSON:
		return "a JSON file"
	case kindONNX:
		return "an ONNX model"
	}
	return "a " + kind + " file"
}

// modelKinds is what fit and stream open.
const modelKinds = "safetensors, a sharded safetensors index (.json), GGUF or ONNX"

// checkModelFile refuses a file that is not a model by its contents,
// naming what it is instead; it returns the kind found.
func checkModelFile(path string) (string, error) {
	kind, err := sniffFile(path)
	if err != nil {
		return "", err
	}
	switch kind {
	case kindGGUF, kindSafetensors, kindONNX:
		return kind, nil
	case kindJSON:
		if strings.HasSuffix(path, ".json") {
			return kind, nil // an index; its reader names what is wrong
		}
	case kindBinary:
		if strings.HasSuffix(path, ".onnx") {
			return kindONNX, nil // protobuf has no magic: the decoder names what is wrong
		}
	}
	return "", fmt.Errorf("%s: not a model file: it is %s (memwall reads %s)", path, kindPhrase(kind), modelKinds)
}
