package sched

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
)

// Request is one line of a request file.
type Request struct {
	// ArrivalS is when the request arrives, in seconds from the start.
	ArrivalS     float64 `json:"arrival_s"`
	PromptTokens int     `json:"prompt_tokens"`
	// OutputTokens may be 0: a prefill-only request (scoring, embedding).
	OutputTokens int `json:"output_tokens"`
	// Requests with the same PrefixID share their first PrefixTokens
	// prompt tokens (a system prompt, a document): the blocks a prefix
	// cache can serve.
	PrefixID     string `json:"prefix_id,omitempty"`
	PrefixTokens int    `json:"prefix_tokens,omitempty"`
}

// Limits of a request file.
const (
	MaxTokens    = 1 << 24 // prompt or output tokens of one request
	MaxRequests  = 1 << 22
	MaxArrivalS  = 1e9
	maxLineBytes = 1 << 20
)

// FileError is a bad request file: the file, the line (from 1) and what is
// wrong, naming the field.
type FileError struct {
	File   string
	Line   int
	Reason string
}

func (e *FileError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
}

type requestJSON struct {
	ArrivalS     *float64        `json:"arrival_s"`
	PromptTokens *json.Number    `json:"prompt_tokens"`
	OutputTokens *json.Number    `json:"output_tokens"`
	PrefixID     json.RawMessage `json:"prefix_id"`
	PrefixTokens *json.Number    `json:"prefix_tokens"`
}

// ReadRequests parses a request file: JSON lines with arrival_s,
// prompt_tokens and output_tokens, and optionally prefix_id (a string or an
// integer) and prefix_tokens; other fields are ignored, blank lines skipped.
// Every error is a *FileError naming file, line and field. The requests come
// back sorted by arrival (stable).
func ReadRequests(r io.Reader, file string) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) >= MaxRequests {
			return nil, &FileError{file, line, fmt.Sprintf("more than %d requests", MaxRequests)}
		}
		req, reason := parseRequest(b)
		if reason != "" {
			return nil, &FileError{file, line, reason}
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &FileError{file, line + 1, fmt.Sprintf("line longer than %d bytes", maxLineBytes)}
		}
		return nil, &FileError{file, line, err.Error()}
	}
	if len(out) == 0 {
		return nil, &FileError{File: file, Reason: "no requests"}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ArrivalS < out[j].ArrivalS })
	return out, nil
}

func parseRequest(b []byte) (Request, string) {
	var j requestJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&j); err != nil {
		return Request{}, "not a JSON object: " + err.Error()
	}
	if dec.More() {
		return Request{}, "more than one JSON value on the line"
	}
	var r Request
	if j.ArrivalS == nil {
		return r, `missing field "arrival_s"`
	}
	if a := *j.ArrivalS; math.IsNaN(a) || a < 0 || a > MaxArrivalS {
		return r, fmt.Sprintf(`field "arrival_s": %v, want 0..%g`, a, MaxArrivalS)
	}
	r.ArrivalS = *j.ArrivalS
	var reason string
	if r.PromptTokens, reason = count("prompt_tokens", j.PromptTokens, 1, true); reason != "" {
		return r, reason
	}
	if r.OutputTokens, reason = count("output_tokens", j.OutputTokens, 0, true); reason != "" {
		return r, reason
	}
	if r.PrefixTokens, reason = count("prefix_tokens", j.PrefixTokens, 0, false); reason != "" {
		return r, reason
	}
	if len(j.PrefixID) > 0 && string(j.PrefixID) != "null" {
		var s string
		if err := json.Unmarshal(j.PrefixID, &s); err == nil {
			r.PrefixID = s
		} else if n, err := strconv.ParseInt(string(j.PrefixID), 10, 64); err == nil {
			r.PrefixID = strconv.FormatInt(n, 10)
		} else {
			return r, fmt.Sprintf(`field "prefix_id": %s, want a string or an integer`, clip(j.PrefixID))
		}
		if r.PrefixID == "" {
			return r, `field "prefix_id": empty`
		}
	}
	if r.PrefixTokens > r.PromptTokens {
		return r, fmt.Sprintf(`field "prefix_tokens": %d, more than prompt_tokens %d`, r.PrefixTokens, r.PromptTokens)
	}
	if r.PrefixTokens > 0 && r.PrefixID == "" {
		return r, `field "prefix_tokens" without "prefix_id"`
	}
	return r, ""
}

func count(field string, n *json.Number, lo int, required bool) (int, string) {
	if n == nil {
		if required {
			return 0, fmt.Sprintf("missing field %q", field)
		}
		return 0, ""
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return 0, fmt.Sprintf("field %q: %s, want an integer", field, clip([]byte(n.String())))
	}
	if v < int64(lo) || v > MaxTokens {
		return 0, fmt.Sprintf("field %q: %d, want %d..%d", field, v, lo, MaxTokens)
	}
	return int(v), ""
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// WriteRequests writes requests as JSON lines, the format ReadRequests reads.
func WriteRequests(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, r := range reqs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Synthetic mixes. Lengths are log-normal, with μ set so that the mean is
// the published one (μ = ln mean − σ²/2), and drawn again when outside
// [MinLen, MaxLen]:
//
//	sharegpt       prompt mean 161, σ 1.0; output mean 338, σ 0.8 (ShareGPT as the vLLM paper reports it)
//	alpaca         prompt mean 19,  σ 0.6; output mean 58,  σ 0.8 (Alpaca, same source)
//	shared-prefix  one of 8 system prompts of 1024–2048 tokens (uniform, fixed per seed), chosen uniformly,
//	               then a user part of mean 96, σ 0.8; output mean 128, σ 0.8
//
// Arrivals: all at 0 when RatePerS is 0, else a Poisson process of that rate.
type SyntheticOptions struct {
	Kind     string // "sharegpt", "alpaca" or "shared-prefix"
	Requests int    // default 1000
	Seed     uint64
	RatePerS float64
	// MaxLen bounds prompt + output (the model's context); default 4096.
	MaxLen int
}

// SyntheticDescription states a synthetic mix's distributions ("" for an
// unknown kind).
func SyntheticDescription(kind string) string {
	switch kind {
	case "sharegpt":
		return "log-normal prompt mean 161 σ 1.0, output mean 338 σ 0.8 (ShareGPT's published means)"
	case "alpaca":
		return "log-normal prompt mean 19 σ 0.6, output mean 58 σ 0.8 (Alpaca's published means)"
	case "shared-prefix":
		return "8 system prompts of 1024–2048 tokens, then a log-normal user part of mean 96 σ 0.8; output mean 128 σ 0.8"
	}
	return ""
}

// MinLen is the shortest synthetic prompt or output.
const MinLen = 4

// Synthetic returns a synthetic request mix. When ctx is done it stops
// with ctx's error, wrapped with the requests drawn.
func Synthetic(ctx context.Context, o SyntheticOptions) ([]Request, error) {
	if o.Requests == 0 {
		o.Requests = 1000
	}
	if o.Requests < 0 || o.Requests > MaxRequests {
		return nil, fmt.Errorf("sched: %d synthetic requests, want 1..%d", o.Requests, MaxRequests)
	}
	if o.MaxLen == 0 {
		o.MaxLen = 4096
	}
	if !(o.RatePerS >= 0) || math.IsInf(o.RatePerS, 0) {
		return nil, fmt.Errorf("sched: arrival rate %v, want ≥ 0", o.RatePerS)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	ln := func(mean, sigma float64, hi int) int {
		mu := math.Log(mean) - sigma*sigma/2
		for range 1000 {
			v := int(math.Round(math.Exp(mu + sigma*rng.NormFloat64())))
			if v >= MinLen && v <= hi {
				return v
			}
		}
		return min(max(int(mean), MinLen), hi)
	}
	var prefixes []int
	if o.Kind == "shared-prefix" {
		for range 8 {
			prefixes = append(prefixes, 1024+rng.IntN(1025))
		}
	}
	half := o.MaxLen / 2
	if half < MinLen {
		return nil, fmt.Errorf("sched: a context of %d tokens is too short for synthetic requests", o.MaxLen)
	}
	out := make([]Request, o.Requests)
	t := 0.0
	for i := range out {
		if i%1024 == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("sched: %d of %d synthetic requests drawn: %w", i, len(out), ctx.Err())
		}
		if o.RatePerS > 0 {
			t += rng.ExpFloat64() / o.RatePerS
		}
		r := Request{ArrivalS: t}
		switch o.Kind {
		case "sharegpt":
			r.PromptTokens, r.OutputTokens = ln(161, 1.0, half), ln(338, 0.8, half)
		case "alpaca":
			r.PromptTokens, r.OutputTokens = ln(19, 0.6, half), ln(58, 0.8, half)
		case "shared-prefix":
			p := rng.IntN(len(prefixes))
			pre := min(prefixes[p], o.MaxLen-2*MinLen)
			r.PrefixID, r.PrefixTokens = "system-"+strconv.Itoa(p), pre
			room := (o.MaxLen - pre) / 2
			r.PromptTokens = pre + ln(96, 0.8, room)
			r.OutputTokens = ln(128, 0.8, room)
		default:
			return nil, fmt.Errorf("sched: unknown synthetic mix %q (want sharegpt, alpaca or shared-prefix)", o.Kind)
		}
		out[i] = r
	}
	return out, nil
}
