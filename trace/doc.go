// Package trace reads and writes allocation traces: the sequence of
// allocs, frees and segment reservations an allocator went through, for
// replaying through memwall's pool and for comparing against PyTorch.
//
// # Reading
//
//	r, err := trace.Open("gpt2.csv.gz", trace.Options{})
//	if err != nil { ... }
//	defer r.Close()
//	for {
//		ev, err := r.Next()
//		if err == io.EOF { break }
//		if err != nil { return err } // a *trace.Error naming file and line/offset
//		...
//	}
//	m := r.Meta() // peak live bytes, PyTorch's reserved bytes, segment counts
//
// Readers stream: they never hold the file, and reading a CSV record
// allocates nothing. Three formats are read, gzip-compressed or not (gzip is
// detected by its magic bytes, the format by content, then extension):
//
//   - CSV, "action,addr,size,stream" with that header line: the traces in
//     testdata/traces, exported from PyTorch's history.
//   - PyTorch's memory snapshot, the pickle torch.cuda.memory._dump_snapshot
//     writes (protocols 2 to 5). Events come from its "device_traces" (one
//     list of TraceEntry dicts per device: "action", "addr", "size",
//     "stream", "time_us"; OOM entries hold "device_free" in place of
//     "addr"); Meta's snapshot figures come from its "segments" (what the
//     allocator held when the snapshot was taken). See below.
//   - memwall's event log, JSON lines written by Writer (below), so memwall
//     users can replay their own runs.
//
// Other snapshot keys are parsed and dropped: "allocator_settings",
// "external_annotations", and "host_segments"/"host_traces" (pinned host
// memory, which memwall's device pool does not serve).
//
// # Actions
//
// Kept: alloc, free_requested, free_completed, segment_alloc, segment_free,
// segment_map and segment_unmap (expandable segments growing and shrinking),
// and oom (an allocation PyTorch could not satisfy; its Size is what was
// asked for). Ignored, counted in Stats.Ignored: "snapshot" (a marker that a
// snapshot was taken) and "annotate" (metadata attached to a block); neither
// changes memory. Any other action is ErrUnknownAction.
//
// # Bad input
//
// Every error for bad input is a *Error naming the file and the position
// (a line, or a byte offset plus device_traces[d][i] for a snapshot entry)
// and wrapping a sentinel. Errors about one record — a malformed line, an
// unknown action, a negative size or one above MaxSize (1 TiB), and the
// Validator's free of an address not live, alloc at a live address, double
// free, free with a size other than the alloc's — end the read, or with
// Options.Lenient are skipped and counted in Stats. Truncated input (a cut
// gzip stream, a pickle without STOP), corruption, forbidden pickle opcodes
// and exceeded limits end the read in either mode. Snapshots recorded with
// a ring buffer smaller than the run (_record_memory_history's max_entries)
// begin with frees of blocks allocated before the buffer's start: read them
// leniently.
//
// # Snapshots
//
// A pickle is a program for a stack machine, and Python's unpickler runs
// whatever it says, imports and calls included. The decoder here runs only
// the opcodes a snapshot contains (PROTO, FRAME, MARK, the empty
// containers, APPEND(S), SETITEM(S), TUPLE*, the integers, BINFLOAT, the
// strings and bytes, NONE and booleans, the memo opcodes, STOP) and refuses
// GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ(_EX), PERSID,
// BINPERSID and EXT* with ErrForbidden naming the opcode and its offset.
//
// The pickle format cannot be skipped through: an entry's bytes are only
// known by running everything before them, and the memo lets any later
// opcode refer to any earlier object. So the decoder runs the whole pickle,
// but builds no tree: it knows the snapshot's schema, keeps state only for
// the containers that matter (the root dict, the segment dicts, the device
// lists and the entry dicts, and of those only the fields memwall needs),
// and yields each entry when the pickle appends it to its device list.
// Memory is the pickle stack (Python appends in batches of 1000), one
// 16-byte memo slot per memoized object (every dict, list and string), and
// short strings for error messages, all bounded by Options.MaxObjects; no
// string longer than 40 bytes is ever held, and no length field is trusted
// for an allocation. Nesting is bounded at 64 open MARKs.
//
// # memwall's event log
//
// One JSON object a line:
//
//	{"t":1700000000123,"action":"alloc","addr":139828359974912,"size":9568,"stream":0,"tenant":"llm","purpose":"activations"}
//
// "t" is int64 nanoseconds (optional), "action" one of the names above,
// "addr" required except for oom, "size" required; "stream", "device" and
// "device_free" (oom) are optional unsigned integers, "tenant" and "purpose"
// optional strings. Numbers are JSON integers. Unknown keys are skipped, so
// the format can grow; blank lines are skipped. Writer writes it: buffered,
// without reflection, no allocation per event, safe for concurrent use.
//
// # Recording memwall's pools
//
// The pool hands out plain records and knows no file format: EventLog
// writes its events (EventLog.Record as pool.Options.OnEvent, or
// EventLog.Wrap over any pool.Resource) and WriteSnapshot the Snapshot an
// out-of-memory pool.OOMError carries, both as the log above, which
// `memwall replay` replays and `memwall replay --html` draws.
package trace
