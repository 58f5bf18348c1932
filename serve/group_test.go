package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeBudget is a BudgetControl that refuses budgets below min and fails
// on fail.
type fakeBudget struct{ vram, min, fail uint64 }

func (f *fakeBudget) Budget() any { return map[string]uint64{"vram_bytes": f.vram} }

func (f *fakeBudget) SetBudget(_ context.Context, v uint64) (any, error) {
	switch {
	case v < f.min:
		return nil, fmt.Errorf("%w: %d below %d", ErrBudgetRefused, v, f.min)
	case v == f.fail:
		return nil, errors.New("the move failed")
	}
	f.vram = v
	return f.Budget(), nil
}

// TestGroup: a group routes by model (the only one when none is named),
// lists its models, guards /v1/ and /admin/ with the key, and maps the
// budget control's answers to 200, 409 and 500 (404 without one).
func TestGroup(t *testing.T) {
	r, _ := newRig(t, rigOptions{maxSeqs: 2, apiKey: "k", noChat: true})
	if _, err := NewGroup([]*Server{r.s, r.s}, GroupOptions{}); err == nil {
		t.Fatal("a group of two servers of one name accepted")
	}
	if _, err := NewGroup(nil, GroupOptions{}); err == nil {
		t.Fatal("an empty group accepted")
	}
	fb := &fakeBudget{vram: 100, min: 10, fail: 13}
	for _, withBudget := range []bool{true, false} {
		o := GroupOptions{APIKey: "k"}
		if withBudget {
			o.Budget = fb
		}
		g, err := NewGroup([]*Server{r.s}, o)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(g.Handler())
		rr := &rig{http: hs}
		key := []string{"Authorization", "Bearer k"}
		cases := []struct {
			method, path, body string
			header             []string
			code               int
			want               string
		}{
			{"GET", "/v1/models", "", nil, 401, "invalid_api_key"},
			{"GET", "/admin/budget", "", nil, 401, "invalid_api_key"},
			{"GET", "/v1/models", "", key, 200, `"id":"tiny"`},
			{"POST", "/v1/completions", `{"prompt": [5, 6], "max_tokens": 2, "return_token_ids": true}`, key, 200, "token_ids"},
			{"POST", "/v1/completions", `{"model": "tiny", "prompt": [5, 6], "max_tokens": 2}`, key, 200, "text_completion"},
			{"POST", "/v1/completions", `{"model": "other", "prompt": [5, 6], "max_tokens": 2}`, key, 404, `serves \"tiny\"`},
			{"POST", "/v1/completions", `{"model": 3}`, key, 400, "malformed"},
			{"GET", "/health", "", nil, 200, ""},
		}
		if withBudget {
			cases = append(cases, []struct {
				method, path, body string
				header             []string
				code               int
				want               string
			}{
				{"GET", "/admin/budget", "", key, 200, `"vram_bytes":100`},
				{"POST", "/admin/budget", `{"vram_bytes": 50}`, key, 200, `"vram_bytes":50`},
				{"POST", "/admin/budget", `{"vram_bytes": 5}`, key, 409, "below 10"},
				{"POST", "/admin/budget", `{"vram_bytes": 13}`, key, 500, "the move failed"},
				{"POST", "/admin/budget", `{"vram_bytes": 0}`, key, 400, "vram_bytes is required"},
				{"POST", "/admin/budget", `{"vram_bytes": 1, "x": 2}`, key, 400, "malformed"},
			}...)
		} else {
			cases = append(cases, struct {
				method, path, body string
				header             []string
				code               int
				want               string
			}{"POST", "/admin/budget", `{"vram_bytes": 50}`, key, 404, "fixed"})
		}
		for _, c := range cases {
			code, _, out := rr.do(t, c.method, c.path, []byte(c.body), c.header...)
			if code != c.code || !strings.Contains(string(out), c.want) {
				t.Errorf("budget %v: %s %s %s: %d %s, want %d with %q", withBudget, c.method, c.path, c.body, code, out, c.code, c.want)
			}
		}
		hs.Close()
	}
}
