package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"

	"github.com/memwall/memwall/engine"
)

// apiError is an OpenAI error response: its status and body.
type apiError struct {
	status  int
	typ     string
	code    string
	param   string
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, message: fmt.Sprintf(format, args...)}
}

// body is the JSON of an error.
func (e *apiError) body() []byte {
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": nullable(e.param), "code": nullable(e.code)}})
	return b
}

// completionRequest is the body of /v1/completions and, with Messages,
// /v1/chat/completions (OpenAI's fields memwall reads, and vLLM's top_k,
// ignore_eos and return_token_ids). Fields it does not know are ignored.
type completionRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                   *int            `json:"n"`
	Logprobs            json.RawMessage `json:"logprobs"`
	Echo                bool            `json:"echo"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	ReturnTokenIDs      bool            `json:"return_token_ids"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

// maxStops is OpenAI's limit on stop sequences.
const maxStops = 4

// sampling checks the sampling fields and returns them (MaxNew is set by
// the caller).
func (q *completionRequest) sampling() (engine.Sampling, error) {
	s := engine.Sampling{Temperature: 1, TopP: 1}
	if q.Temperature != nil {
		if t := *q.Temperature; !(t >= 0 && t <= 2) {
			return s, badRequest("temperature", "temperature %v: want 0..2", t)
		}
		s.Temperature = *q.Temperature
	}
	if q.TopP != nil {
		if p := *q.TopP; !(p > 0 && p <= 1) {
			return s, badRequest("top_p", "top_p %v: want a number in (0, 1]", p)
		}
		s.TopP = *q.TopP
	}
	if q.TopK != nil {
		if k := *q.TopK; k < -1 || k > 1<<20 {
			return s, badRequest("top_k", "top_k %d: want -1 (all), 0 (all) or 1..%d", k, 1<<20)
		}
		s.TopK = max(*q.TopK, 0)
	}
	if q.Seed != nil {
		s.Seed = uint64(*q.Seed)
	} else {
		s.Seed = rand.Uint64()
	}
	if q.N != nil && *q.N != 1 {
		return s, badRequest("n", "n = %d: this server returns one choice per request", *q.N)
	}
	if l := bytes.TrimSpace(q.Logprobs); len(l) > 0 && string(l) != "null" && string(l) != "false" && string(l) != "0" {
		return s, badRequest("logprobs", "logprobs are not supported")
	}
	if q.Echo {
		return s, badRequest("echo", "echo is not supported")
	}
	s.IgnoreEOS = q.IgnoreEOS
	return s, nil
}

// maxNew returns max_tokens (or max_completion_tokens), bounded below by 1;
// def when neither is given.
func (q *completionRequest) maxNew(def int) (int, error) {
	v := q.MaxTokens
	if v == nil {
		v = q.MaxCompletionTokens
	}
	if v == nil {
		return def, nil
	}
	if *v < 1 {
		return 0, badRequest("max_tokens", "max_tokens %d: want at least 1", *v)
	}
	return *v, nil
}

// stops reads stop: a string or a list of at most four.
func (q *completionRequest) stops() ([]string, error) {
	raw := bytes.TrimSpace(q.Stop)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("stop", "stop: want a string or a list of strings")
	}
	if len(list) > maxStops {
		return nil, badRequest("stop", "stop: %d sequences, at most %d", len(list), maxStops)
	}
	return slicesDeleteEmpty(list), nil
}

func slicesDeleteEmpty(l []string) []string {
	out := l[:0]
	for _, s := range l {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// promptIDs reads prompt: a string, a list of token ids, or a list of one
// of either (OpenAI's batch forms with one element).
func (s *Server) promptIDs(raw json.RawMessage) ([]int32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return s.encode(text, true)
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return s.checkIDs(ids)
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) != 1 {
			return nil, badRequest("prompt", "%d prompts: this server takes one per request", len(texts))
		}
		return s.encode(texts[0], true)
	}
	var lists [][]int64
	if err := json.Unmarshal(raw, &lists); err == nil {
		if len(lists) != 1 {
			return nil, badRequest("prompt", "%d prompts: this server takes one per request", len(lists))
		}
		return s.checkIDs(lists[0])
	}
	return nil, badRequest("prompt", "prompt: want a string or a list of token ids")
}

func (s *Server) checkIDs(ids []int64) ([]int32, error) {
	if len(ids) == 0 {
		return nil, badRequest("prompt", "the prompt is empty")
	}
	vocab := s.shape.vocab
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(vocab) || id > math.MaxInt32 {
			return nil, badRequest("prompt", "prompt token %d at position %d is outside the vocabulary of %d", id, i, vocab)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// encode tokenizes text (with the tokenizer's BOS when special).
func (s *Server) encode(text string, special bool) ([]int32, error) {
	if s.o.Tokenizer == nil {
		return nil, badRequest("prompt", "the model has no tokenizer: give the prompt as token ids")
	}
	ids := s.o.Tokenizer.Encode(text, special)
	if len(ids) == 0 {
		return nil, badRequest("prompt", "the prompt encodes to no tokens")
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

// chatPrompt renders messages with the chat template and encodes the
// result (the template writes the special tokens itself).
func (s *Server) chatPrompt(raw json.RawMessage, addGen bool) ([]int32, error) {
	if s.o.Chat == nil {
		return nil, badRequest("messages", "the model %s has no chat template (no chat_template in tokenizer_config.json, no tokenizer.chat_template in GGUF metadata): use /v1/completions", s.o.ModelName)
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) == 0 {
		return nil, badRequest("messages", "messages: want a non-empty list of {role, content}")
	}
	list := make([]Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages", "message %d has no role", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest("messages", "message %d: %v", i, err)
		}
		list[i] = Message{Role: m.Role, Content: text}
	}
	prompt, err := s.o.Chat.Render(list, addGen)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	return s.encode(prompt, false)
}

// contentText reads a message's content: a string, null, or a list of
// parts of which only {"type": "text"} ones are read.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content: want a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q: only text is supported", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// usage is OpenAI's token counts.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	PromptDetails    *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
}

func newUsage(prompt, completion, cached int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	u.PromptDetails = &struct {
		CachedTokens int `json:"cached_tokens"`
	}{cached}
	return u
}
