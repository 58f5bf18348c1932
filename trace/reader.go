package trace

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Format is a trace file format.
type Format uint8

// Formats. FormatAuto (the zero value) asks Open to detect the format.
const (
	FormatAuto     Format = iota
	FormatCSV             // action,addr,size,stream (the shared PyTorch traces)
	FormatSnapshot        // PyTorch's pickled snapshot (torch.cuda.memory._dump_snapshot)
	FormatJSONL           // memwall's event log, one JSON object per line (see Writer)
)

func (f Format) String() string {
	switch f {
	case FormatCSV:
		return "csv"
	case FormatSnapshot:
		return "snapshot"
	case FormatJSONL:
		return "jsonl"
	}
	return "auto"
}

// Options tune a Reader. The zero value is strict, validating and
// detecting the format.
type Options struct {
	// Lenient skips bad records (errors wrapping ErrMalformed,
	// ErrUnknownAction, ErrBadSize, ErrUnknownAddress, ErrDoubleAlloc,
	// ErrDoubleFree, ErrSizeMismatch) and counts them in Stats instead of
	// ending the read. Structural errors (truncation, corruption, forbidden
	// opcodes, limits) end the read in either mode.
	Lenient bool
	// NoValidate skips the Validator: events are returned as the file has
	// them (format errors are still reported) and Meta's live figures are
	// computed from the sizes the events carry.
	NoValidate bool
	// Format forces a format instead of detecting it.
	Format Format
	// MaxObjects bounds a snapshot's decoder state: pickle memo entries and
	// stack items together. Zero means DefaultMaxObjects.
	MaxObjects int
}

// DefaultMaxObjects is the default Options.MaxObjects: 2^26 objects, at
// most 1 GiB of decoder state (16 bytes an object). A real snapshot memoizes
// about one object per trace entry and per distinct stack frame.
const DefaultMaxObjects = 1 << 26

// Stats counts what a Reader has read so far.
type Stats struct {
	Events  int64 // events returned by Next
	Ignored int64 // records dropped by design: "snapshot" and "annotate" markers
	Skipped int64 // bad records dropped in lenient mode (the sum of the counts below)

	Malformed      int64 // ErrMalformed
	UnknownAction  int64 // ErrUnknownAction
	BadSize        int64 // ErrBadSize
	UnknownAddress int64 // ErrUnknownAddress
	DoubleAlloc    int64 // ErrDoubleAlloc
	DoubleFree     int64 // ErrDoubleFree
	SizeMismatch   int64 // ErrSizeMismatch

	// FirstSkipped is the first skipped record's error, with its position;
	// nil if none was skipped.
	FirstSkipped error
	// Bytes is the input consumed so far, after decompression.
	Bytes int64
}

// Meta is what a trace says about memory, beyond single events.
//
// The event figures cover the events Next has returned so far and are final
// once Next returns io.EOF. The snapshot figures come from a snapshot's
// "segments" list (the allocator's state when the snapshot was taken);
// PyTorch writes that list before "device_traces", so they are available as
// soon as Open returns.
type Meta struct {
	Format Format

	Allocs   int64  // Alloc events
	Live     uint64 // bytes in blocks allocated and not yet free_completed
	PeakLive uint64 // the largest Live seen: the program's peak demand

	SegmentAllocs int64 // SegmentAlloc events (cudaMalloc calls)
	SegmentFrees  int64 // SegmentFree events
	// Reserved is what the allocator held from the driver: SegmentAlloc and
	// SegmentMap sizes minus SegmentFree and SegmentUnmap sizes.
	Reserved     uint64
	PeakReserved uint64 // the largest Reserved seen
	OOMs         int64  // OOM events

	// Snapshot only.
	HasSegments       bool   // the snapshot had a "segments" list
	Segments          int    // its entries
	SegmentsReserved  uint64 // the sum of their total_size
	SegmentsAllocated uint64 // the sum of their allocated_size
	Devices           int    // device_traces lists seen so far
}

// decoder is one format's record parser.
type decoder interface {
	// next decodes the next record into ev (a zero Event). It returns
	// io.EOF at the end; errIgnored for a marker record; an error wrapping
	// a record sentinel for one bad record, after which it can go on; any
	// other error is fatal.
	next(ev *Event) error
	// pos is the position of the record last decoded, or of the error.
	pos() Pos
	// consumed is the number of input bytes read, after decompression.
	consumed() int64
}

// snapshotMeta is implemented by decoders that learn Meta's snapshot
// figures from the file itself.
type snapshotMeta interface {
	fillMeta(m *Meta)
}

var errIgnored = errors.New("ignored record")

// Reader streams the events of one trace. Memory use does not grow with the
// trace length, except for the Validator's live set and a snapshot's pickle
// memo (bounded by Options.MaxObjects). A Reader is not safe for concurrent
// use.
type Reader struct {
	name   string
	format Format
	opts   Options
	dec    decoder
	val    *Validator
	file   *os.File
	gz     *gzip.Reader
	stats  Stats
	meta   Meta
	err    error // sticky: io.EOF or the error that ended the read
	cur    Event // the event being decoded
}

// Open opens the trace file at path. The format is detected from the
// content (gzip by its magic bytes, then a pickle's PROTO opcode, a JSON
// object, or the CSV header), falling back on the extension (.csv, .pickle,
// .pkl, .jsonl, .ndjson, .json, each optionally followed by .gz). The
// returned Reader owns the file: Close it. On error nothing stays open.
func Open(path string, opts Options) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	r, err := NewReader(f, path, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.file = f
	return r, nil
}

// NewReader reads a trace from src; name is used in errors and for the
// extension fallback of format detection. The Reader does not close src.
func NewReader(src io.Reader, name string, opts Options) (*Reader, error) {
	r := &Reader{name: name, opts: opts}
	if opts.MaxObjects <= 0 {
		r.opts.MaxObjects = DefaultMaxObjects
	}
	br := bufio.NewReaderSize(src, 64<<10)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, &Error{File: name, Pos: Pos{Offset: 0}, Err: gzipError(err)}
		}
		r.gz = gz
		br = bufio.NewReaderSize(gzipReader{gz}, 64<<10)
	}
	format := opts.Format
	if format == FormatAuto {
		var err error
		if format, err = detect(br, name); err != nil {
			return nil, &Error{File: name, Pos: Pos{Offset: 0}, Err: err}
		}
	}
	r.format = format
	r.meta.Format = format
	switch format {
	case FormatCSV:
		r.dec = newCSVDecoder(br)
	case FormatJSONL:
		r.dec = newJSONLDecoder(br)
	case FormatSnapshot:
		r.dec = newPickleDecoder(br, r.opts.MaxObjects)
	default:
		return nil, &Error{File: name, Err: fmt.Errorf("%w: format %d", ErrFormat, format)}
	}
	if !opts.NoValidate {
		r.val = NewValidator()
	}
	if p, ok := r.dec.(*pickleDecoder); ok {
		// Decode up to the first event so that the snapshot's segments are
		// in Meta before the first Next.
		p.prime()
	}
	return r, nil
}

// detect guesses the format from the first bytes of br, then from name.
func detect(br *bufio.Reader, name string) (Format, error) {
	head, err := br.Peek(512)
	if len(head) == 0 && err != nil && err != io.EOF {
		return FormatAuto, fmt.Errorf("reading: %w", err)
	}
	trimmed := bytes.TrimLeft(head, " \t\r\n")
	switch {
	case len(head) >= 2 && head[0] == pickleProto && head[1] >= 2:
		return FormatSnapshot, nil
	case len(trimmed) > 0 && trimmed[0] == '{':
		return FormatJSONL, nil
	case bytes.HasPrefix(head, []byte("action,")):
		return FormatCSV, nil
	}
	base := strings.ToLower(filepath.Base(name))
	base = strings.TrimSuffix(base, ".gz")
	switch filepath.Ext(base) {
	case ".csv":
		return FormatCSV, nil
	case ".pickle", ".pkl":
		return FormatSnapshot, nil
	case ".jsonl", ".ndjson", ".json":
		return FormatJSONL, nil
	}
	if len(head) == 0 {
		return FormatAuto, fmt.Errorf("%w: empty input and no known extension", ErrFormat)
	}
	if len(head) > 16 {
		head = head[:16]
	}
	return FormatAuto, fmt.Errorf("%w: starts with %q (want a pickle, a JSON object or the CSV header \"action,addr,size,stream\")", ErrFormat, head)
}

// Format returns the format being read.
func (r *Reader) Format() Format { return r.format }

// Next returns the next event, or io.EOF after the last one. Bad input
// yields an *Error naming the position; in lenient mode, record errors are
// skipped and counted instead. After an error other than a skipped one,
// Next keeps returning that error.
func (r *Reader) Next() (Event, error) {
	if r.err != nil {
		return Event{}, r.err
	}
	ev := &r.cur // a field, not a local: a local passed to an interface method escapes
	for {
		*ev = Event{}
		err := r.dec.next(ev)
		if err == nil && r.val != nil {
			err = r.val.Check(ev)
		}
		if err == nil {
			r.account(ev)
			r.stats.Events++
			return *ev, nil
		}
		if err == errIgnored {
			r.stats.Ignored++
			continue
		}
		if err == io.EOF {
			r.err = io.EOF
			return Event{}, io.EOF
		}
		e := &Error{File: r.name, Pos: r.dec.pos(), Err: err}
		if r.opts.Lenient && r.skip(e) {
			continue
		}
		r.err = e
		return Event{}, e
	}
}

// skip counts a record error and reports whether it is one.
func (r *Reader) skip(e *Error) bool {
	counts := [...]*int64{
		&r.stats.Malformed, &r.stats.UnknownAction, &r.stats.BadSize, &r.stats.UnknownAddress,
		&r.stats.DoubleAlloc, &r.stats.DoubleFree, &r.stats.SizeMismatch,
	}
	for i, sentinel := range recordErrors {
		if errors.Is(e.Err, sentinel) {
			*counts[i]++
			r.stats.Skipped++
			if r.stats.FirstSkipped == nil {
				r.stats.FirstSkipped = e
			}
			return true
		}
	}
	return false
}

// account folds ev into Meta's running figures.
func (r *Reader) account(ev *Event) {
	m := &r.meta
	switch ev.Action {
	case Alloc:
		m.Allocs++
		m.Live += ev.Size
		if m.Live > m.PeakLive {
			m.PeakLive = m.Live
		}
	case FreeCompleted:
		m.Live -= min(ev.Size, m.Live)
	case SegmentAlloc, SegmentMap:
		if ev.Action == SegmentAlloc {
			m.SegmentAllocs++
		}
		m.Reserved += ev.Size
		if m.Reserved > m.PeakReserved {
			m.PeakReserved = m.Reserved
		}
	case SegmentFree, SegmentUnmap:
		if ev.Action == SegmentFree {
			m.SegmentFrees++
		}
		m.Reserved -= min(ev.Size, m.Reserved)
	case OOM:
		m.OOMs++
	}
}

// Pos returns the position of the event Next last returned, or of the
// error that ended the read: a line for CSV and JSON lines, a byte offset
// (of the trace entry's dict) for a snapshot.
func (r *Reader) Pos() Pos { return r.dec.pos() }

// Stats returns the counts so far.
func (r *Reader) Stats() Stats {
	s := r.stats
	s.Bytes = r.dec.consumed()
	return s
}

// Meta returns what the trace says about memory so far (see Meta).
func (r *Reader) Meta() Meta {
	m := r.meta
	if sm, ok := r.dec.(snapshotMeta); ok {
		sm.fillMeta(&m)
	}
	return m
}

// Close releases the file opened by Open and the decompressor. It does not
// close the io.Reader given to NewReader.
func (r *Reader) Close() error {
	var err error
	if r.gz != nil {
		err = r.gz.Close()
	}
	if r.file != nil {
		if cerr := r.file.Close(); err == nil {
			err = cerr
		}
		r.file = nil
	}
	if r.err == nil {
		r.err = errors.New("trace " + r.name + ": reader closed")
	}
	return err
}

// gzipReader turns the gzip package's errors into ours: a cut stream is
// ErrTruncated, a bad checksum or header ErrCorrupt.
type gzipReader struct{ gz *gzip.Reader }

func (g gzipReader) Read(p []byte) (int, error) {
	n, err := g.gz.Read(p)
	if err != nil && err != io.EOF {
		err = gzipError(err)
	}
	return n, err
}

func gzipError(err error) error {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), err == io.EOF:
		return fmt.Errorf("%w: gzip stream ends early", ErrTruncated)
	case errors.Is(err, gzip.ErrChecksum), errors.Is(err, gzip.ErrHeader):
		return fmt.Errorf("%w: gzip: %v", ErrCorrupt, err)
	}
	var corrupt flate.CorruptInputError
	if errors.As(err, &corrupt) {
		return fmt.Errorf("%w: gzip: %v", ErrCorrupt, err)
	}
	return fmt.Errorf("gzip: %w", err)
}
