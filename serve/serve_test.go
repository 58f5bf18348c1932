package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/tokenizer"
)

var (
	modelOnce sync.Once
	modelDir  string
	modelErr  error
)

// tinyModel writes (once per test binary) the tiny model as safetensors
// with a synthetic tokenizer and a ChatML template beside it.
func tinyModel(t *testing.T) string {
	t.Helper()
	modelOnce.Do(func() {
		if modelDir, modelErr = os.MkdirTemp("", "serve-model"); modelErr != nil {
			return
		}
		cfg := synth.Tiny()
		if _, modelErr = synth.Generate(context.Background(), cfg, filepath.Join(modelDir, "model.safetensors"), synth.Options{Workers: 2}); modelErr != nil {
			return
		}
		var tj []byte
		if tj, modelErr = tokenizer.Synthetic(cfg.Vocab); modelErr != nil {
			return
		}
		if modelErr = os.WriteFile(filepath.Join(modelDir, "tokenizer.json"), tj, 0o644); modelErr != nil {
			return
		}
		tc, _ := json.Marshal(map[string]any{"bos_token": "<s>", "eos_token": "</s>", "chat_template": chatML})
		modelErr = os.WriteFile(filepath.Join(modelDir, "tokenizer_config.json"), tc, 0o644)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if modelDir != "" {
		os.RemoveAll(modelDir)
	}
	os.Exit(code)
}

// rig is a server over the tiny model on the simulator.
type rig struct {
	m      *llama.Model
	e      *engine.Engine
	b      *engine.Batch
	s      *Server
	http   *httptest.Server
	dev    *pool.Pool
	cancel context.CancelFunc
	ran    chan error
	un     *batchUnloader
}

type rigOptions struct {
	maxSeqs, kvBlocks, maxQueue int
	apiKey                      string
	noChat, noRun               bool
	refs                        [][]int32 // prompts to generate alone first (greedy, ignoring EOS)
	refNew                      int
	unloadAfter                 time.Duration // with a batchUnloader (rig.unloader)
}

const rigMaxTokens = 64

// newRig starts a server; refs' greedy tokens from Generate come back.
func newRig(t *testing.T, o rigOptions) (*rig, [][]int) {
	t.Helper()
	ctx := context.Background()
	m, err := llama.Open(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	so := sim.DefaultOptions()
	so.TotalBytes = 1 << 30
	so.Kernels = kernels.Sim()
	d := sim.New(so)
	t.Cleanup(func() { d.Close() })
	ks, err := kernels.Load(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	dev, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		t.Fatal(err)
	}
	host, err := pool.NewHost(d, pool.Options{Name: "host"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); dev.Close() })
	eo := engine.Options{Budget: 256 << 20, MaxTokens: rigMaxTokens, PrefillChunk: 32, KVBlocks: o.kvBlocks, PrefixCache: true}
	eo.ReserveBytes = engine.BatchBytes(m.Config, eo, o.maxSeqs)
	e, err := engine.New(ctx, d, ks, dev, host, m, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	var refs [][]int
	for _, p := range o.refs {
		ids := make([]int, len(p))
		for i, v := range p {
			ids[i] = int(v)
		}
		res, err := e.Generate(ctx, ids, engine.Sampling{MaxNew: o.refNew, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, res.Tokens)
	}
	b, err := e.NewBatch(o.maxSeqs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	tok, err := tokenizer.Load(m.TokenizerPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{ModelName: "tiny", MaxQueue: o.maxQueue, APIKey: o.apiKey, Tokenizer: tok, IsEOS: m.Config.IsEOS, Pools: nil}
	if !o.noChat {
		bos, _ := tok.Token(1)
		eos, _ := tok.Token(2)
		if opts.Chat, err = LoadChatTemplate(filepath.Dir(m.TokenizerPath), nil, bos, eos); err != nil {
			t.Fatal(err)
		}
	}
	var un *batchUnloader
	if o.unloadAfter > 0 {
		un = &batchUnloader{e: e, maxSeqs: o.maxSeqs}
		opts.Unloader, opts.UnloadAfter = un, o.unloadAfter
	}
	s, err := New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Batch().Close() })
	r := &rig{m: m, e: e, b: b, s: s, dev: dev, ran: make(chan error, 1), un: un}
	r.http = httptest.NewServer(s.Handler())
	runCtx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	if !o.noRun {
		go func() { r.ran <- s.Run(runCtx) }()
	} else {
		r.ran <- nil
	}
	t.Cleanup(func() {
		r.http.Close()
		cancel()
		if err := <-r.ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r, refs
}

func randomPrompt(rng *rand.Rand, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(3 + rng.IntN(vocab-3))
	}
	return p
}

// post sends a JSON body and returns the status and body.
func (r *rig) post(t *testing.T, path string, body any, header ...string) (int, http.Header, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	return r.do(t, "POST", path, b, header...)
}

func (r *rig) do(t *testing.T, method, path string, body []byte, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, r.http.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out
}

// readSSE returns a stream's data payloads, up to and including [DONE].
func readSSE(t *testing.T, body io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q", line)
		}
		out = append(out, data)
		if data == "[DONE]" {
			break
		}
	}
	return out
}

// streamIDs reads a streamed completion: its token ids, finish reason and
// usage (nil when not sent).
func streamIDs(t *testing.T, events []string) (ids []int, finish string, u *usage) {
	t.Helper()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end in [DONE]: %q", events)
	}
	for _, e := range events[:len(events)-1] {
		var c struct {
			Choices []struct {
				TokenIDs     []int   `json:"token_ids"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("%v: %s", err, e)
		}
		if c.Usage != nil {
			u = c.Usage
		}
		for _, ch := range c.Choices {
			ids = append(ids, ch.TokenIDs...)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return ids, finish, u
}

// waitIdle waits (bounded) until the scheduler holds nothing and the KV
// cache is empty.
func (r *rig) waitIdle(t *testing.T) {
	t.Helper()
	var c Counts
	for range 500 {
		if c = r.s.Counts(); c.Running == 0 && c.Waiting == 0 && c.KVUsage == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("not idle after 5 s: %+v", c)
}

// TestConcurrentRequests sends streamed and whole completions at once, more
// than the batch holds and with fewer KV blocks than they need together (so
// sequences wait and are preempted), and checks each one's greedy tokens
// against Generate's for its prompt alone, then that nothing is left held.
func TestConcurrentRequests(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n, maxNew = 8, 14
	var prompts [][]int32
	for i := range n {
		prompts = append(prompts, randomPrompt(rng, 1+rng.IntN(rigMaxTokens-maxNew-1), 1024))
		if i == 0 {
			prompts[0] = prompts[0][:0]
			prompts[0] = randomPrompt(rng, 40, 1024)
		}
		if i == 3 { // a shared prefix: prefix cache hits
			prompts[i] = append(append([]int32(nil), prompts[0]...), prompts[i]...)[:min(len(prompts[0])+4, rigMaxTokens-maxNew)]
		}
	}
	// Whether sequences are preempted depends on how the requests' arrivals
	// interleave with the steps (on a loaded machine they can come one after
	// another): the tokens are checked on every try, preemption and prefix
	// hits on one of up to three.
	var metrics []byte
	for try := 1; ; try++ {
		metrics = concurrentTry(t, prompts, maxNew)
		preempted := !bytes.Contains(metrics, []byte(`vllm:num_preemptions_total{model_name="tiny"} 0`))
		hit := !bytes.Contains(metrics, []byte(`vllm:prefix_cache_hits_total{model_name="tiny"} 0`))
		if preempted && hit || try == 3 || t.Failed() {
			break
		}
		t.Logf("try %d: preempted %v, prefix hit %v", try, preempted, hit)
	}
	if !bytes.Contains(metrics, []byte(`vllm:num_preemptions_total{model_name="tiny"}`)) || bytes.Contains(metrics, []byte(`vllm:num_preemptions_total{model_name="tiny"} 0`)) {
		t.Errorf("no preemption with 10 blocks for 4 sequences of up to 4 blocks:\n%s", grep(metrics, "preemptions"))
	}
	if bytes.Contains(metrics, []byte(`vllm:prefix_cache_hits_total{model_name="tiny"} 0`)) {
		t.Errorf("no prefix cache hit:\n%s", grep(metrics, "prefix"))
	}
}

// concurrentTry is one round of TestConcurrentRequests on a new server:
// every request's tokens checked, then the metrics once idle.
func concurrentTry(t *testing.T, prompts [][]int32, maxNew int) []byte {
	t.Helper()
	n := len(prompts)
	r, refs := newRig(t, rigOptions{maxSeqs: 4, kvBlocks: 10, refs: prompts, refNew: maxNew})
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := range n {
		wg.Go(func() {
			stream := i%2 == 0
			body := map[string]any{"model": "tiny", "prompt": prompts[i], "max_tokens": maxNew, "temperature": 0, "ignore_eos": true,
				"return_token_ids": true, "stream": stream, "stream_options": map[string]any{"include_usage": true}}
			b, _ := json.Marshal(body)
			resp, err := http.Post(r.http.URL+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				errs[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				msg, _ := io.ReadAll(resp.Body)
				errs[i] = fmt.Sprintf("status %d: %s", resp.StatusCode, msg)
				return
			}
			var ids []int
			var u *usage
			var finish string
			if stream {
				ids, finish, u = streamIDs(t, readSSE(t, resp.Body))
			} else {
				var c struct {
					Choices []struct {
						TokenIDs     []int  `json:"token_ids"`
						FinishReason string `json:"finish_reason"`
					} `json:"choices"`
					Usage *usage `json:"usage"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
					errs[i] = err.Error()
					return
				}
				ids, finish, u = c.Choices[0].TokenIDs, c.Choices[0].FinishReason, c.Usage
			}
			if fmt.Sprint(ids) != fmt.Sprint(refs[i]) {
				errs[i] = fmt.Sprintf("tokens %v, Generate gave %v", ids, refs[i])
			} else if finish != "length" || u == nil || u.CompletionTokens != maxNew || u.PromptTokens != len(prompts[i]) {
				errs[i] = fmt.Sprintf("finish %q, usage %+v", finish, u)
			}
		})
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("request %d (stream %v, prompt %d tokens): %s", i, i%2 == 0, len(prompts[i]), e)
		}
	}
	r.waitIdle(t)
	_, _, metrics := r.do(t, "GET", "/metrics", nil)
	return metrics
}

func grep(b []byte, word string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// errorOf decodes an OpenAI error body.
func errorOf(t *testing.T, body []byte) (msg, typ string, code any) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error: %s", body)
	}
	return e.Error.Message, e.Error.Type, e.Error.Code
}

func TestErrors(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2, apiKey: "sesame", noChat: true})
	key := []string{"Authorization", "Bearer sesame"}
	for _, c := range []struct {
		name, path string
		body       string
		header     []string
		status     int
		want       string
	}{
		{"no key", "/v1/completions", `{"prompt": [5]}`, nil, 401, "API key"},
		{"wrong key", "/v1/completions", `{"prompt": [5]}`, []string{"Authorization", "Bearer nope"}, 401, "API key"},
		{"models without key", "/v1/models", ``, nil, 401, "API key"},
		{"malformed", "/v1/completions", `{"prompt": [5`, key, 400, "malformed JSON"},
		{"not an object", "/v1/completions", `[1, 2]`, key, 400, "malformed JSON"},
		{"no prompt", "/v1/completions", `{"max_tokens": 3}`, key, 400, "prompt is required"},
		{"bad prompt", "/v1/completions", `{"prompt": {"a": 1}}`, key, 400, "want a string or a list of token ids"},
		{"id outside vocab", "/v1/completions", `{"prompt": [5, 1024]}`, key, 400, "outside the vocabulary of 1024"},
		{"two prompts", "/v1/completions", `{"prompt": ["a", "b"]}`, key, 400, "one per request"},
		{"context overflow", "/v1/completions", `{"prompt": [5, 6, 7, 8], "max_tokens": 61}`, key, 400, "maximum context length is 64 tokens; the prompt has 4 tokens and max_tokens asks for 61 more (65 in all)"},
		{"max_tokens 0", "/v1/completions", `{"prompt": [5], "max_tokens": 0}`, key, 400, "max_tokens 0"},
		{"temperature", "/v1/completions", `{"prompt": [5], "temperature": 3}`, key, 400, "temperature 3"},
		{"top_p", "/v1/completions", `{"prompt": [5], "top_p": 0}`, key, 400, "top_p 0"},
		{"top_k", "/v1/completions", `{"prompt": [5], "top_k": -2}`, key, 400, "top_k -2"},
		{"n", "/v1/completions", `{"prompt": [5], "n": 2}`, key, 400, "one choice"},
		{"stop", "/v1/completions", `{"prompt": [5], "stop": ["a","b","c","d","e"]}`, key, 400, "at most 4"},
		{"logprobs", "/v1/completions", `{"prompt": [5], "logprobs": 2}`, key, 400, "logprobs"},
		{"unknown model", "/v1/completions", `{"model": "gpt-9", "prompt": [5]}`, key, 404, `"gpt-9" does not exist`},
		{"no chat template", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}]}`, key, 400, "has no chat template"},
		{"no endpoint", "/v1/embeddings", `{}`, key, 404, "no such endpoint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			method := "POST"
			if c.body == "" {
				method = "GET"
			}
			status, _, body := r.do(t, method, c.path, []byte(c.body), c.header...)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			if msg, _, _ := errorOf(t, body); !strings.Contains(msg, c.want) {
				t.Errorf("message %q lacks %q", msg, c.want)
			}
		})
	}
	status, _, body := r.do(t, "GET", "/v1/models", nil, key...)
	if status != 200 || !bytes.Contains(body, []byte(`"id":"tiny"`)) || !bytes.Contains(body, []byte(`"max_model_len":64`)) {
		t.Errorf("models: %d %s", status, body)
	}
	if status, _, _ := r.do(t, "GET", "/health", nil); status != 200 {
		t.Errorf("health: %d", status)
	}
}

// TestQueueFull fills the queue of a server whose scheduler is not running.
func TestQueueFull(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2, maxQueue: 2, noRun: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, "POST", r.http.URL+"/v1/completions", strings.NewReader(`{"prompt": [5, 6], "max_tokens": 2}`))
		go http.DefaultClient.Do(req)
	}
	for i := 0; r.s.Counts().Waiting < 2; i++ {
		if i > 500 {
			t.Fatal("the two requests never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	status, h, body := r.post(t, "/v1/completions", map[string]any{"prompt": []int{5}})
	if status != 429 || h.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q: %s", status, h.Get("Retry-After"), body)
	}
	if _, typ, code := errorOf(t, body); typ != "rate_limit_error" || code != "queue_full" {
		t.Errorf("type %q code %v", typ, code)
	}
}

// TestDisconnect drops a streaming client and checks that its sequence
// stops and its blocks are freed at once.
func TestDisconnect(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"prompt": [5, 6, 7, 8, 9], "max_tokens": 58, "ignore_eos": true, "stream": true, "return_token_ids": true}`
		if strings.Contains(path, "chat") {
			body = `{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "ignore_eos": true, "stream": true, "return_token_ids": true}`
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", r.http.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		sc := bufio.NewScanner(resp.Body)
		for got := 0; got < 3 && sc.Scan(); {
			if strings.HasPrefix(sc.Text(), "data: ") {
				got++
			}
		}
		if c := r.s.Counts(); c.KVUsage == 0 {
			t.Errorf("%s: a running stream holds no KV blocks: %+v", path, c)
		}
		cancel()
		resp.Body.Close()
		r.waitIdle(t)
	}
	_, _, metrics := r.do(t, "GET", "/metrics", nil)
	if !bytes.Contains(metrics, []byte("memwall_serve_aborted_requests_total{model_name=\"tiny\"} 2")) {
		t.Errorf("aborted requests:\n%s", grep(metrics, "aborted"))
	}
}

// TestMetricNames checks that /metrics carries vLLM's names with
// model_name and memwall's own.
func TestMetricNames(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2})
	if status, _, body := r.post(t, "/v1/completions", map[string]any{"prompt": []int{5, 6, 7}, "max_tokens": 3, "temperature": 0}); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	_, _, m := r.do(t, "GET", "/metrics", nil)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
		"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
		`vllm:request_success_total{finished_reason="length",model_name="tiny"} 1`, `vllm:generation_tokens_total{model_name="tiny"} 3`,
		`vllm:prompt_tokens_total{model_name="tiny"} 3`,
		"memwall_serve_budget_bytes", "memwall_serve_resident_weight_bytes", "memwall_serve_streamed_weight_bytes_per_step",
		"memwall_serve_host_weight_bytes_per_step", "memwall_kv_usage_ratio", "memwall_kv_blocks"} {
		if !bytes.Contains(m, []byte(name)) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	for _, l := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(l, "vllm:") && !strings.Contains(l, `model_name="tiny"`) {
			t.Errorf("no model_name: %s", l)
		}
	}
}

// TestChat runs a chat completion through the template, whole and
// streamed, and checks that the two agree and that stop ends both.
func TestChat(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2})
	msgs := []map[string]any{{"role": "user", "content": "What time is it?"}}
	status, _, body := r.post(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "return_token_ids": true})
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	var whole struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &whole); err != nil {
		t.Fatal(err)
	}
	tok := r.s.o.Tokenizer
	want, _ := r.s.o.Chat.Render([]Message{{"user", "What time is it?"}}, true)
	if whole.Object != "chat.completion" || whole.Choices[0].Message.Role != "assistant" || whole.Usage.PromptTokens != len(tok.Encode(want, false)) ||
		len(whole.Choices[0].TokenIDs) != 12 {
		t.Errorf("chat: %s", body)
	}
	// (The made-up model's tokens need not decode to whole characters:
	// streamed and whole text come from the same stream decoder.)
	b, _ := json.Marshal(map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true})
	resp, err := http.Post(r.http.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	var text strings.Builder
	for _, e := range events[:len(events)-1] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		json.Unmarshal([]byte(e), &c)
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %s", e)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if text.String() != whole.Choices[0].Message.Content {
		t.Errorf("streamed %q, whole %q", text.String(), whole.Choices[0].Message.Content)
	}
	full := whole.Choices[0].Message.Content
	runes := []rune(full)
	if len(runes) < 4 {
		t.Fatalf("too little text (%q) to test stop", full)
	}
	stop := string(runes[len(runes)/2 : len(runes)/2+2])
	for _, stream := range []bool{false, true} {
		status, _, body := r.post(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stop": stop, "stream": stream})
		if status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		wantText := full[:strings.Index(full, stop)]
		if !stream {
			var c struct {
				Choices []struct {
					Message      struct{ Content string } `json:"message"`
					FinishReason string                   `json:"finish_reason"`
				} `json:"choices"`
			}
			json.Unmarshal(body, &c)
			if c.Choices[0].Message.Content != wantText || c.Choices[0].FinishReason != "stop" {
				t.Errorf("stop %q: %q (%s), want %q", stop, c.Choices[0].Message.Content, c.Choices[0].FinishReason, wantText)
			}
			continue
		}
		var got strings.Builder
		for _, e := range readSSE(t, bytes.NewReader(body)) {
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			json.Unmarshal([]byte(e), &c)
			if len(c.Choices) > 0 {
				got.WriteString(c.Choices[0].Delta.Content)
			}
		}
		if got.String() != wantText {
			t.Errorf("streamed with stop %q: %q, want %q", stop, got.String(), wantText)
		}
	}
	r.waitIdle(t)
}

// TestDrain drains a server while a request runs: it finishes, new ones
// get 503, and /health says so.
func TestDrain(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2})
	done := make(chan int, 1)
	go func() {
		status, _, _ := r.post(t, "/v1/completions", map[string]any{"prompt": []int{5, 6}, "max_tokens": 40, "ignore_eos": true, "temperature": 0})
		done <- status
	}()
	for i := 0; r.s.Counts().Running == 0; i++ {
		if i > 500 {
			t.Fatal("the request never ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.s.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if status := <-done; status != 200 {
		t.Errorf("the running request ended with %d", status)
	}
	if status, _, body := r.post(t, "/v1/completions", map[string]any{"prompt": []int{5}}); status != 503 {
		t.Errorf("after drain: %d %s", status, body)
	}
	if status, _, _ := r.do(t, "GET", "/health", nil); status != 503 {
		t.Errorf("health after drain: %d", status)
	}
}

// batchUnloader unloads a server's batch by closing it and loads it again
// from the same engine; fail makes Load fail.
type batchUnloader struct {
	e              *engine.Engine
	maxSeqs        int
	fail           atomic.Bool
	unloads, loads atomic.Int32
}

func (u *batchUnloader) Unload(_ context.Context, b *engine.Batch) error {
	u.unloads.Add(1)
	if used := b.Cache().Stats().UsedBlocks; used != 0 {
		return fmt.Errorf("unloading a batch whose cache holds %d blocks", used)
	}
	return b.Close()
}

func (u *batchUnloader) Load(context.Context) (*engine.Batch, error) {
	u.loads.Add(1)
	if u.fail.Load() {
		return nil, errors.New("no room")
	}
	return u.e.NewBatch(u.maxSeqs)
}

// TestUnload: a server idle past UnloadAfter unloads its batch (once),
// reports itself unloaded in /metrics and Counts, and loads it again for
// the next request, whose tokens equal Generate's; a load that fails ends
// the waiting request with a 503 and the server goes on serving.
func TestUnload(t *testing.T) {
	prompt := []int32{5, 6, 7, 8, 9, 10}
	const maxNew = 6
	r, refs := newRig(t, rigOptions{maxSeqs: 2, refs: [][]int32{prompt}, refNew: maxNew, unloadAfter: 50 * time.Millisecond})
	ask := func() (int, []byte, []int) {
		status, _, body := r.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": maxNew, "temperature": 0, "ignore_eos": true, "return_token_ids": true})
		var c struct {
			Choices []struct {
				TokenIDs []int `json:"token_ids"`
			} `json:"choices"`
		}
		if json.Unmarshal(body, &c) != nil || len(c.Choices) == 0 {
			return status, body, nil
		}
		return status, body, c.Choices[0].TokenIDs
	}
	unloaded := func(n int32) {
		t.Helper()
		for range 300 {
			if !r.s.Loaded() && r.un.unloads.Load() == n {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("not unloaded %d times after 3 s: loaded %v, unloads %d", n, r.s.Loaded(), r.un.unloads.Load())
	}
	for round := int32(1); round <= 2; round++ {
		if status, body, ids := ask(); status != 200 || fmt.Sprint(ids) != fmt.Sprint(refs[0]) {
			t.Fatalf("round %d: %d %s, Generate gave %v", round, status, body, refs[0])
		}
		unloaded(round)
		if c := r.s.Counts(); c.KVUsage != 0 || c.Running != 0 {
			t.Fatalf("unloaded: %+v", c)
		}
		_, _, m := r.do(t, "GET", "/metrics", nil)
		if !bytes.Contains(m, []byte(`memwall_serve_loaded{model_name="tiny"} 0`)) ||
			!bytes.Contains(m, []byte(fmt.Sprintf(`memwall_serve_unloads_total{model_name="tiny"} %d`, round))) {
			t.Fatalf("unloaded, /metrics:\n%s", grep(m, "memwall_serve_"))
		}
	}
	time.Sleep(150 * time.Millisecond) // an unloaded server does not unload again
	if n := r.un.unloads.Load(); n != 2 {
		t.Fatalf("%d unloads", n)
	}
	r.un.fail.Store(true)
	if status, body, _ := ask(); status != 503 || !bytes.Contains(body, []byte("could not be loaded")) {
		t.Fatalf("a failed load: %d %s", status, body)
	}
	if status, _, body := r.do(t, "GET", "/health", nil); status != 200 {
		t.Fatalf("after a failed load /health is %d %s", status, body)
	}
	r.un.fail.Store(false)
	if status, body, ids := ask(); status != 200 || fmt.Sprint(ids) != fmt.Sprint(refs[0]) {
		t.Fatalf("after a failed load: %d %s, Generate gave %v", status, body, refs[0])
	}
	if l := r.un.loads.Load(); l != 3 { // round 2, the failure, the last
		t.Fatalf("loads %d, unloads %d", l, r.un.unloads.Load())
	}
}
