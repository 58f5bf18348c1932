package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/memwall/memwall/kvcache/sched"
)

// ServeOptions configure Serve. URL and Requests are required.
type ServeOptions struct {
	// URL is the server's base URL (http://host:port); requests go to
	// URL/v1/completions.
	URL string
	// Model is the request's model field ("" leaves it out).
	Model string
	// APIKey, when set, is sent as Authorization: Bearer KEY.
	APIKey string
	// Requests give each request's prompt and output length (and shared
	// prefix); arrival times are ignored: Concurrency clients send them in
	// order, each the next as soon as its last one ended (a closed loop).
	Requests []sched.Request
	// Concurrency is the number of clients (default 1).
	Concurrency int
	// Vocab bounds the prompt token ids drawn: 10 <= id < Vocab (default
	// 1000, so that any model's vocabulary holds them).
	Vocab int
	// Seed draws the ids.
	Seed uint64
	// Client sends the requests (default: a client without a timeout).
	Client *http.Client
	// Progress, when set, is called after each request with the number
	// done and the total.
	Progress func(done, total int)
}

// ServeResult is what Serve measured. Times are seconds.
type ServeResult struct {
	Requests     int     `json:"requests"`
	Failed       int     `json:"failed"`
	Concurrency  int     `json:"concurrency"`
	WallSeconds  float64 `json:"wall_seconds"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	// OutputTokensPerS is every request's output tokens over the wall time.
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	// TTFT is from sending a request to its first token; ITL the time
	// between two chunks of tokens of one request; RequestTokensPerS one
	// request's output tokens after the first over the time after it.
	TTFTP50              float64 `json:"ttft_p50_s"`
	TTFTP99              float64 `json:"ttft_p99_s"`
	ITLP50               float64 `json:"itl_p50_s"`
	ITLP99               float64 `json:"itl_p99_s"`
	E2EP50               float64 `json:"e2e_p50_s"`
	E2EP99               float64 `json:"e2e_p99_s"`
	RequestTokensPerSP50 float64 `json:"request_tokens_per_s_p50"`
	RequestTokensPerSP99 float64 `json:"request_tokens_per_s_p99"`
	// FirstError is the first failure's message.
	FirstError string `json:"first_error,omitempty"`
}

// serveSample is one request's timings.
type serveSample struct {
	ttft, e2e, decode float64
	itl               []float64
	prompt, output    int
	err               error
}

// Serve sends opts.Requests to an OpenAI-compatible server as streamed
// completions (prompts as token ids, ignore_eos, max_tokens the request's
// output) and measures them. A request that fails is counted in Failed; a
// server that fails every request is an error. When ctx is done the
// requests in flight are cancelled and ctx's error returned.
func Serve(ctx context.Context, o ServeOptions) (ServeResult, error) {
	if o.URL == "" || len(o.Requests) == 0 {
		return ServeResult{}, errors.New("bench: serve: no URL or no requests")
	}
	o.Concurrency = max(o.Concurrency, 1)
	if o.Vocab <= 10 {
		o.Vocab = 1000
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	url := strings.TrimRight(o.URL, "/") + "/v1/completions"
	samples := make([]serveSample, len(o.Requests))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	began := time.Now()
	for range o.Concurrency {
		wg.Go(func() {
			for i := range next {
				samples[i] = o.one(ctx, url, i)
				if o.Progress != nil {
					mu.Lock()
					done++
					o.Progress(done, len(o.Requests))
					mu.Unlock()
				}
			}
		})
	}
feed:
	for i := range o.Requests {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return ServeResult{}, fmt.Errorf("bench: serve: %w", err)
	}
	res := summarize(samples, time.Since(began).Seconds())
	res.Concurrency = o.Concurrency
	if res.Failed == res.Requests {
		return res, fmt.Errorf("bench: serve: all %d requests failed; the first: %s", res.Requests, res.FirstError)
	}
	return res, nil
}

// prompt draws request i's token ids: its shared prefix from the prefix id,
// the rest from the seed and i.
func (o *ServeOptions) prompt(i int) []int {
	q := o.Requests[i]
	h := fnv.New64a()
	h.Write([]byte(q.PrefixID))
	pre := rand.New(rand.NewPCG(h.Sum64(), o.Seed))
	own := rand.New(rand.NewPCG(o.Seed, uint64(i)+1))
	ids := make([]int, q.PromptTokens)
	for k := range ids {
		r := own
		if k < q.PrefixTokens && q.PrefixID != "" {
			r = pre
		}
		ids[k] = 10 + r.IntN(o.Vocab-10)
	}
	return ids
}

// one sends request i and times it.
func (o *ServeOptions) one(ctx context.Context, url string, i int) (s serveSample) {
	q := o.Requests[i]
	body := map[string]any{"prompt": o.prompt(i), "max_tokens": max(q.OutputTokens, 1), "temperature": 0, "ignore_eos": true,
		"stream": true, "stream_options": map[string]any{"include_usage": true}}
	if o.Model != "" {
		body["model"] = o.Model
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		return serveSample{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	s.prompt = q.PromptTokens
	t0 := time.Now()
	resp, err := o.Client.Do(req)
	if err != nil {
		return serveSample{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return serveSample{err: fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))}
	}
	var first, last time.Time
	chunks, usage := 0, -1
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return serveSample{err: fmt.Errorf("chunk %q: %w", clip(data), err)}
		}
		if len(c.Error) > 0 {
			return serveSample{err: fmt.Errorf("server error: %s", clip(string(c.Error)))}
		}
		if c.Usage != nil {
			usage = c.Usage.CompletionTokens
		}
		if len(c.Choices) == 0 || c.Choices[0].Text == "" && chunks > 0 {
			continue
		}
		now := time.Now()
		if chunks == 0 {
			first = now
			s.ttft = now.Sub(t0).Seconds()
		} else {
			s.itl = append(s.itl, now.Sub(last).Seconds())
		}
		last = now
		chunks++
	}
	if err := sc.Err(); err != nil {
		return serveSample{err: err}
	}
	if chunks == 0 {
		return serveSample{err: errors.New("the stream held no token")}
	}
	s.e2e = time.Since(t0).Seconds()
	s.output = chunks
	if usage >= 0 {
		s.output = usage
	}
	if d := last.Sub(first).Seconds(); d > 0 && s.output > 1 {
		s.decode = float64(s.output-1) / d
	}
	return s
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// summarize turns the samples into the result.
func summarize(samples []serveSample, wall float64) ServeResult {
	res := ServeResult{Requests: len(samples), WallSeconds: wall}
	var ttft, itl, e2e, rate []float64
	for _, s := range samples {
		if s.err != nil {
			if res.Failed == 0 {
				res.FirstError = s.err.Error()
			}
			res.Failed++
			continue
		}
		res.PromptTokens += s.prompt
		res.OutputTokens += s.output
		ttft, e2e = append(ttft, s.ttft), append(e2e, s.e2e)
		itl = append(itl, s.itl...)
		if s.decode > 0 {
			rate = append(rate, s.decode)
		}
	}
	if wall > 0 {
		res.OutputTokensPerS = float64(res.OutputTokens) / wall
		res.RequestsPerS = float64(res.Requests-res.Failed) / wall
	}
	res.TTFTP50, res.TTFTP99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
	res.ITLP50, res.ITLP99 = quantile(itl, 0.5), quantile(itl, 0.99)
	res.E2EP50, res.E2EP99 = quantile(e2e, 0.5), quantile(e2e, 0.99)
	// The slow end of per-request rates is the low quantile.
	res.RequestTokensPerSP50, res.RequestTokensPerSP99 = quantile(rate, 0.5), quantile(rate, 0.01)
	return res
}
