package serve

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memwall/memwall/engine"
)

// maxBody bounds a request body.
const maxBody = 16 << 20

// Handler serves the OpenAI API (POST /v1/completions, POST
// /v1/chat/completions, GET /v1/models), GET /health and GET /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.auth(func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, false) }))
	mux.HandleFunc("POST /v1/chat/completions", s.auth(func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) }))
	mux.HandleFunc("GET /v1/models", s.auth(s.models))
	mux.HandleFunc("GET /health", s.health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/v1/", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", message: fmt.Sprintf("%s %s: no such endpoint", r.Method, r.URL.Path)})
	}))
	return mux
}

// auth requires the server's API key, when there is one.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc { return requireKey(s.o.APIKey, h) }

// requireKey wraps h to answer 401 unless the request carries
// "Authorization: Bearer key" (key "": h as it is).
func requireKey(key string, h http.HandlerFunc) http.HandlerFunc {
	if key == "" {
		return h
	}
	want := []byte("Bearer " + key)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
				message: "missing or wrong API key: send Authorization: Bearer KEY"})
			return
		}
		h(w, r)
	}
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.status)
	w.Write(e.body())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	down := s.draining || s.stopped
	s.mu.Unlock()
	if down {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", message: errDraining.Error()})
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": []any{s.modelEntry()}})
}

// modelEntry is the server's model in /v1/models.
func (s *Server) modelEntry() map[string]any {
	return map[string]any{"id": s.o.ModelName, "object": "model", "created": s.made.Unix(), "owned_by": "memwall", "max_model_len": s.shape.seqTokens}
}

// job is one request as the handler sees it.
type job struct {
	chat      bool
	id        string
	created   int64
	prompt    []int32
	maxNew    int
	stops     []string
	stream    bool
	usage     bool
	returnIDs bool
	sampling  engine.Sampling
}

// parse reads and checks a request body into a job.
func (s *Server) parse(r *http.Request, chat bool) (*job, error) {
	var q completionRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(&q); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", message: fmt.Sprintf("request body over %d bytes", maxBody)}
		}
		return nil, badRequest("", "malformed JSON body: %v", err)
	}
	if q.Model != "" && q.Model != s.o.ModelName {
		return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", param: "model",
			message: fmt.Sprintf("the model %q does not exist: this server serves %q", q.Model, s.o.ModelName)}
	}
	j := &job{chat: chat, created: time.Now().Unix(), stream: q.Stream, returnIDs: q.ReturnTokenIDs}
	j.usage = q.StreamOptions != nil && q.StreamOptions.IncludeUsage
	var err error
	if j.sampling, err = q.sampling(); err != nil {
		return nil, err
	}
	if j.stops, err = q.stops(); err != nil {
		return nil, err
	}
	limit := s.shape.seqTokens
	if chat {
		addGen := q.AddGenerationPrompt == nil || *q.AddGenerationPrompt
		if j.prompt, err = s.chatPrompt(q.Messages, addGen); err != nil {
			return nil, err
		}
	} else if j.prompt, err = s.promptIDs(q.Prompt); err != nil {
		return nil, err
	}
	def := 16 // OpenAI's default for completions; chat runs to the context's end
	if chat {
		def = max(limit-len(j.prompt), 1)
	}
	if j.maxNew, err = q.maxNew(def); err != nil {
		return nil, err
	}
	if len(j.prompt)+j.maxNew > limit {
		return nil, badRequest("max_tokens", "this model's maximum context length is %d tokens; the prompt has %d tokens and max_tokens asks for %d more (%d in all)",
			limit, len(j.prompt), j.maxNew, len(j.prompt)+j.maxNew)
	}
	return j, nil
}

// complete serves /v1/completions and /v1/chat/completions.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	j, err := s.parse(r, chat)
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = badRequest("", "%v", err)
		}
		writeError(w, ae)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	req := &request{ctx: ctx, tokens: j.prompt, prompt: len(j.prompt), maxNew: j.maxNew, ignoreEOS: j.sampling.IgnoreEOS,
		sampler: engine.NewSampler(j.sampling), out: make(chan event, j.maxNew+1), arrival: time.Now()}
	if err := s.submit(req); err != nil {
		if errors.Is(err, errQueueFull) {
			writeError(w, &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full",
				message: fmt.Sprintf("%d requests are waiting, the most this server queues: retry later", s.o.MaxQueue)})
		} else {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", message: err.Error()})
		}
		return
	}
	defer s.done()
	j.id = fmt.Sprintf("%s-%x", map[bool]string{false: "cmpl", true: "chatcmpl"}[chat], j.sampling.Seed^uint64(req.arrival.UnixNano()))
	if j.stream {
		s.streamOut(w, j, req, cancel)
		return
	}
	s.wholeOut(w, j, req, cancel)
}

// textDecoder is what output needs of a tokenizer.StreamDecoder.
type textDecoder interface {
	Add(id int) string
	Flush() string
}

// output turns a request's tokens into text, holding back what could be
// the start of a stop string, and stops at the first stop string.
type output struct {
	dec   textDecoder
	stops []string
	text  string // decoded so far, up to a stop string
	sent  int    // bytes of text handed out
	ids   []int
	stop  bool // a stop string was met
}

// add takes a token and returns the text that can be handed out now.
func (o *output) add(id int) string {
	o.ids = append(o.ids, id)
	if o.dec == nil {
		return ""
	}
	o.text += o.dec.Add(id)
	return o.ready(false)
}

// ready returns the text up to a stop string or, unless final, up to the
// last bytes that could begin one.
func (o *output) ready(final bool) string {
	// Text handed out never holds the start of a stop string (it is held
	// back below until it can no longer begin one), so the search starts
	// at sent.
	cut := len(o.text)
	for _, st := range o.stops {
		if i := strings.Index(o.text[o.sent:], st); i >= 0 && o.sent+i < cut {
			cut, o.stop = o.sent+i, true
		}
	}
	if o.stop {
		o.text = o.text[:cut]
		final = true
	}
	if !final {
		hold := 0
		for _, st := range o.stops {
			for k := min(len(st)-1, len(o.text)-o.sent); k > hold; k-- {
				if strings.HasSuffix(o.text, st[:k]) {
					hold = k
					break
				}
			}
		}
		// The held suffix equals a stop string's first bytes, so it
		// starts on a character boundary.
		cut = len(o.text) - hold
	}
	out := o.text[o.sent:cut]
	o.sent = cut
	return out
}

// flush returns the text held back at the end.
func (o *output) flush() string {
	if o.dec != nil && !o.stop {
		o.text += o.dec.Flush()
	}
	return o.ready(true)
}

func (s *Server) newOutput(j *job) *output {
	o := &output{stops: j.stops}
	if s.o.Tokenizer != nil {
		o.dec = s.o.Tokenizer.NewDecoder()
	}
	return o
}

// next returns req's next event, or false when its client went away (the
// scheduler then frees its sequence before the next step) or the events
// ended.
func next(req *request) (event, bool) {
	select {
	case ev, ok := <-req.out:
		return ev, ok
	case <-req.ctx.Done():
		return event{}, false
	}
}

// collect reads req's events into o until the request ends: each token's
// text and id go to emit (which returns false when the client is gone), an
// error to fail unless the client went away. It returns the finish reason
// and the prompt tokens found cached; ok is false when the request ended
// without a finish.
func (o *output) collect(req *request, cancel func(), emit func(text string, ids []int) bool, fail func(error)) (finish string, cached int, ok bool) {
	for finish == "" {
		ev, more := next(req)
		if !more {
			return "", 0, false
		}
		cached = ev.cached
		switch {
		case ev.err != nil:
			if req.ctx.Err() == nil {
				fail(ev.err)
			}
			return "", 0, false
		case ev.finish != "":
			finish = ev.finish
		default:
			n := len(o.ids)
			text := o.add(ev.id)
			if o.stop {
				finish = "stop"
				cancel() // the scheduler frees the sequence before its next step
			}
			if !emit(text, o.ids[n:]) {
				return "", 0, false
			}
		}
	}
	return finish, cached, true
}

// wholeOut answers a request without streaming.
func (s *Server) wholeOut(w http.ResponseWriter, j *job, req *request, cancel func()) {
	o := s.newOutput(j)
	var text strings.Builder
	finish, cached, ok := o.collect(req, cancel, func(t string, _ []int) bool { text.WriteString(t); return true }, func(err error) {
		status := http.StatusInternalServerError
		if errors.Is(err, errLoad) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, &apiError{status: status, typ: "server_error", message: err.Error()})
	})
	if !ok {
		return
	}
	text.WriteString(o.flush())
	s.o.Logger.Debug("serve request", "id", j.id, "prompt", len(j.prompt), "tokens", len(o.ids), "finish", finish)
	writeJSON(w, map[string]any{"id": j.id, "object": objectName(j.chat, false), "created": j.created, "model": s.o.ModelName,
		"choices": []any{s.choice(j, text.String(), o.ids, &finish, false)}, "usage": newUsage(len(j.prompt), len(o.ids), cached)})
}

func objectName(chat, chunk bool) string {
	switch {
	case chat && chunk:
		return "chat.completion.chunk"
	case chat:
		return "chat.completion"
	}
	return "text_completion"
}

// choice is one choice of a response or chunk; finish nil is JSON null.
func (s *Server) choice(j *job, text string, ids []int, finish *string, chunk bool) map[string]any {
	c := map[string]any{"index": 0, "finish_reason": finish}
	if j.chat {
		if chunk {
			delta := map[string]any{}
			if text != "" || finish == nil {
				delta["content"] = text
			}
			c["delta"] = delta
		} else {
			c["message"] = map[string]any{"role": "assistant", "content": text}
		}
	} else {
		c["text"], c["logprobs"] = text, nil
	}
	if j.returnIDs {
		if ids == nil {
			ids = []int{}
		}
		c["token_ids"] = ids
	}
	return c
}

// streamOut answers a request as server-sent events: a chunk per token
// that completes text (every token with return_token_ids), one with the
// finish reason, the usage when asked, then data: [DONE].
func (s *Server) streamOut(w http.ResponseWriter, j *job, req *request, cancel func()) {
	fl, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			cancel()
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	chunk := func(text string, ids []int, finish *string) map[string]any {
		return map[string]any{"id": j.id, "object": objectName(j.chat, true), "created": j.created, "model": s.o.ModelName,
			"choices": []any{s.choice(j, text, ids, finish, true)}}
	}
	if j.chat {
		first := chunk("", nil, nil)
		first["choices"].([]any)[0].(map[string]any)["delta"] = map[string]any{"role": "assistant", "content": ""}
		if !send(first) {
			return
		}
	}
	o := s.newOutput(j)
	finish, cached, ok := o.collect(req, cancel, func(text string, ids []int) bool {
		return text == "" && !j.returnIDs || send(chunk(text, ids, nil))
	}, func(err error) {
		send(map[string]any{"error": map[string]any{"message": err.Error(), "type": "server_error"}})
		io.WriteString(w, "data: [DONE]\n\n")
	})
	if !ok {
		return
	}
	tail := o.flush()
	if !send(chunk(tail, []int{}, &finish)) {
		return
	}
	if j.usage {
		if !send(map[string]any{"id": j.id, "object": objectName(j.chat, true), "created": j.created, "model": s.o.ModelName,
			"choices": []any{}, "usage": newUsage(len(j.prompt), len(o.ids), cached)}) {
			return
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}
