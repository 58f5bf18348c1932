package trace

import (
	"errors"
	"strconv"
)

// Sentinel errors. Every error a Reader returns for bad input is an *Error
// wrapping one of these, so callers branch with errors.Is.
//
// Record errors (ErrMalformed, ErrUnknownAction, ErrBadSize and the
// Validator's ErrUnknownAddress, ErrDoubleAlloc, ErrDoubleFree,
// ErrSizeMismatch) concern one event: in lenient mode the Reader skips that
// event and counts it. The others end the read in either mode.
var (
	// ErrFormat: the input is none of the known formats.
	ErrFormat = errors.New("unrecognized trace format")
	// ErrTruncated: the input ends early (a cut gzip stream, a pickle
	// without its STOP opcode).
	ErrTruncated = errors.New("truncated")
	// ErrCorrupt: the structure is broken beyond one record (a gzip checksum
	// mismatch, a pickle whose stack does not hold what an opcode needs).
	ErrCorrupt = errors.New("corrupt")
	// ErrForbidden: a pickle opcode that imports or calls code (GLOBAL,
	// REDUCE, BUILD, ...). A snapshot never contains one.
	ErrForbidden = errors.New("forbidden pickle opcode")
	// ErrLimit: the input exceeds a bound the reader keeps on memory,
	// nesting or line length.
	ErrLimit = errors.New("limit exceeded")

	// ErrMalformed: one record does not parse (wrong field count, a number
	// that is not one, a snapshot entry without an action).
	ErrMalformed = errors.New("malformed record")
	// ErrUnknownAction: an action name no format defines.
	ErrUnknownAction = errors.New("unknown action")
	// ErrBadSize: a negative size, or one above MaxSize.
	ErrBadSize = errors.New("bad size")
	// ErrUnknownAddress: a free of an address that is not live.
	ErrUnknownAddress = errors.New("unknown address")
	// ErrDoubleAlloc: an alloc (or segment_alloc) at an address already live.
	ErrDoubleAlloc = errors.New("double alloc")
	// ErrDoubleFree: a second free_requested of the same live block.
	ErrDoubleFree = errors.New("double free")
	// ErrSizeMismatch: a free whose size differs from its alloc's.
	ErrSizeMismatch = errors.New("size mismatch")
)

// recordErrors are the sentinels a lenient Reader skips, in Stats order.
var recordErrors = [...]error{
	ErrMalformed, ErrUnknownAction, ErrBadSize, ErrUnknownAddress,
	ErrDoubleAlloc, ErrDoubleFree, ErrSizeMismatch,
}

// Pos is a position in a trace: Line (1-based) for the text formats (CSV,
// JSON lines), Offset (bytes into the decompressed stream) for a pickle.
// The unused one is zero. For a snapshot's trace entry, Entry is its index
// in device_traces[Device] plus one (zero when the position is not an
// entry's).
type Pos struct {
	Line   int64
	Offset int64
	Device int
	Entry  int64
}

// String returns "line N", "offset N" or "offset N (device_traces[D][E])".
func (p Pos) String() string {
	if p.Line > 0 {
		return "line " + strconv.FormatInt(p.Line, 10)
	}
	s := "offset " + strconv.FormatInt(p.Offset, 10)
	if p.Entry > 0 {
		s += " (device_traces[" + strconv.Itoa(p.Device) + "][" + strconv.FormatInt(p.Entry-1, 10) + "])"
	}
	return s
}

// Error is a bad-input error with the file and position it was found at.
type Error struct {
	File string // the name given to Open or NewReader
	Pos  Pos
	Err  error // wraps one of the sentinel errors
}

func (e *Error) Error() string {
	return "trace " + e.File + ": " + e.Pos.String() + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }
