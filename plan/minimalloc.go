package plan

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrFormat marks input that is not a valid MiniMalloc CSV file; the
// *CSVError values ReadMinimallocCSV returns unwrap to it.
var ErrFormat = errors.New("bad minimalloc csv")

// CSVError is a problem at one place of a MiniMalloc CSV file. Its message
// reads
//
//	minimalloc B.1048576.csv:17: field "size": "12x": invalid number
type CSVError struct {
	File   string // the name the caller gave
	Line   int    // 1-based; 0 when the problem is the file as a whole
	Field  string // the column concerned, "" if none
	Reason string
}

func (e *CSVError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "minimalloc %s", e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %q", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns ErrFormat.
func (e *CSVError) Unwrap() error { return ErrFormat }

// Limits of ReadMinimallocCSV besides MaxBuffers and MaxBufferBytes.
const (
	maxCSVIDBytes = 1 << 10
	maxCSVTime    = 1 << 52 // |lower|, |upper|
)

// ReadMinimallocCSV reads an offset-assignment instance in Google
// MiniMalloc's CSV format: a header naming the columns id, lower, upper and
// size (in any order; an "offset" column, as MiniMalloc writes in its
// solutions, is allowed and ignored), then one buffer a line, live on the
// half-open interval [lower, upper). name is the file's name for errors.
// It returns the buffers in file order, or a *CSVError (wrapping ErrFormat)
// that names the line and field: a bad number, upper <= lower, size 0 or
// above MaxBufferBytes, a duplicate id, more than MaxBuffers rows, a
// missing or unknown column. I/O errors from r are returned wrapped.
func ReadMinimallocCSV(r io.Reader, name string) ([]Buffer, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	fail := func(line int, field, format string, a ...any) error {
		return &CSVError{File: name, Line: line, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	readErr := func(err error) error {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return fail(pe.Line, "", "%v", pe.Err)
		}
		return fmt.Errorf("minimalloc %s: %w", name, err)
	}
	header, err := cr.Read()
	if err == io.EOF {
		return nil, fail(0, "", "empty file: want a header id,lower,upper,size")
	}
	if err != nil {
		return nil, readErr(err)
	}
	col := map[string]int{"id": -1, "lower": -1, "upper": -1, "size": -1}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		switch _, known := col[h]; {
		case h == "offset":
		case !known:
			return nil, fail(1, h, "unknown column (want id,lower,upper,size)")
		case col[h] >= 0:
			return nil, fail(1, h, "column given twice")
		default:
			col[h] = i
		}
	}
	for _, h := range []string{"id", "lower", "upper", "size"} {
		if col[h] < 0 {
			return nil, fail(1, h, "missing column (want id,lower,upper,size)")
		}
	}
	var bufs []Buffer
	seen := map[string]int{}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return bufs, nil
		}
		if err != nil {
			return nil, readErr(err)
		}
		line, _ := cr.FieldPos(0)
		if len(bufs) == MaxBuffers {
			return nil, fail(line, "", "more than %d buffers", MaxBuffers)
		}
		id := strings.TrimSpace(rec[col["id"]])
		if id == "" {
			return nil, fail(line, "id", "empty")
		}
		if len(id) > maxCSVIDBytes {
			return nil, fail(line, "id", "%d bytes long, more than %d", len(id), maxCSVIDBytes)
		}
		if prev, dup := seen[id]; dup {
			return nil, fail(line, "id", "%q already used on line %d", id, prev)
		}
		seen[id] = line
		var t [2]int64
		for k, f := range []string{"lower", "upper"} {
			s := strings.TrimSpace(rec[col[f]])
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fail(line, f, "%q: not an integer", s)
			}
			if v > maxCSVTime || v < -maxCSVTime {
				return nil, fail(line, f, "%d: magnitude above the limit of %d", v, int64(maxCSVTime))
			}
			t[k] = v
		}
		if t[1] <= t[0] {
			return nil, fail(line, "upper", "%d not above lower %d", t[1], t[0])
		}
		s := strings.TrimSpace(rec[col["size"]])
		size, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fail(line, "size", "%q: not a non-negative integer", s)
		}
		if size == 0 {
			return nil, fail(line, "size", "0: a buffer must have a size")
		}
		if size > MaxBufferBytes {
			return nil, fail(line, "size", "%d exceeds the limit of %d", size, uint64(MaxBufferBytes))
		}
		bufs = append(bufs, Buffer{ID: id, Start: int(t[0]), End: int(t[1]), Size: size})
	}
}

// WriteMinimallocCSV writes bufs in MiniMalloc's CSV format; with a layout
// (offsets indexed like bufs) it adds MiniMalloc's solution column
// "offset". It returns the first write error.
func WriteMinimallocCSV(w io.Writer, bufs []Buffer, layout *Layout) error {
	cw := csv.NewWriter(w)
	header := []string{"id", "lower", "upper", "size"}
	if layout != nil {
		if len(layout.Offsets) != len(bufs) {
			return fmt.Errorf("minimalloc: %d offsets for %d buffers: %w", len(layout.Offsets), len(bufs), ErrInvalid)
		}
		header = append(header, "offset")
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	rec := make([]string, len(header))
	for i, b := range bufs {
		rec[0], rec[1], rec[2], rec[3] = b.ID, strconv.Itoa(b.Start), strconv.Itoa(b.End), strconv.FormatUint(b.Size, 10)
		if layout != nil {
			rec[4] = strconv.FormatUint(layout.Offsets[i], 10)
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
