package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Group serves several models, one Server each, on one address: the
// requests' "model" field picks the server (the only one when the group
// has one and the field is empty); GET /v1/models lists them all; GET
// /health is 200 while every server is; GET /metrics serves the registry
// the servers share; GET and POST /admin/budget read and change the
// budget they share when the group has a BudgetControl.
type Group struct {
	servers []*Server
	o       GroupOptions
}

// GroupOptions configure a Group.
type GroupOptions struct {
	// APIKey, when set, is required on /v1/ and /admin/ (401 otherwise).
	APIKey string
	// Registry is the one the servers registered their metrics with
	// (Options.Registry); nil: the first server's.
	Registry *prometheus.Registry
	// Budget serves /admin/budget; nil: 404.
	Budget BudgetControl
}

// BudgetControl reads and changes the device budget several models share.
// Both results are written as JSON. A budget refused for being too small
// wraps ErrBudgetRefused (409); other errors are 500.
type BudgetControl interface {
	Budget() any
	SetBudget(ctx context.Context, vramBytes uint64) (any, error)
}

// ErrBudgetRefused marks a budget the models cannot run in.
var ErrBudgetRefused = errors.New("serve: budget refused")

// NewGroup returns a group over servers (at least one, distinct model
// names).
func NewGroup(servers []*Server, o GroupOptions) (*Group, error) {
	if len(servers) == 0 {
		return nil, errors.New("serve: a group of no servers")
	}
	seen := map[string]bool{}
	for _, s := range servers {
		if seen[s.o.ModelName] {
			return nil, fmt.Errorf("serve: two servers named %q", s.o.ModelName)
		}
		seen[s.o.ModelName] = true
	}
	if o.Registry == nil {
		o.Registry = servers[0].reg
	}
	return &Group{servers: slices.Clone(servers), o: o}, nil
}

// Handler serves the group's endpoints.
func (g *Group) Handler() http.Handler {
	auth := func(h http.HandlerFunc) http.HandlerFunc { return requireKey(g.o.APIKey, h) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", auth(func(w http.ResponseWriter, r *http.Request) { g.route(w, r, false) }))
	mux.HandleFunc("POST /v1/chat/completions", auth(func(w http.ResponseWriter, r *http.Request) { g.route(w, r, true) }))
	mux.HandleFunc("GET /v1/models", auth(g.models))
	mux.HandleFunc("GET /health", g.health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.o.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /admin/budget", auth(g.getBudget))
	mux.HandleFunc("POST /admin/budget", auth(g.setBudget))
	mux.HandleFunc("/v1/", auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", message: fmt.Sprintf("%s %s: no such endpoint", r.Method, r.URL.Path)})
	}))
	return mux
}

func (g *Group) names() string {
	var n []string
	for _, s := range g.servers {
		n = append(n, fmt.Sprintf("%q", s.o.ModelName))
	}
	return strings.Join(n, ", ")
}

// route reads the body's model field and hands the request, body
// restored, to that model's server.
func (g *Group) route(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", message: fmt.Sprintf("request body over %d bytes", maxBody)})
			return
		}
		writeError(w, badRequest("", "reading the body: %v", err))
		return
	}
	var q struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		writeError(w, badRequest("", "malformed JSON body: %v", err))
		return
	}
	var s *Server
	switch {
	case q.Model == "" && len(g.servers) == 1:
		s = g.servers[0]
	case q.Model == "":
		writeError(w, badRequest("model", "model is required: this server serves %s", g.names()))
		return
	default:
		for _, c := range g.servers {
			if c.o.ModelName == q.Model {
				s = c
			}
		}
	}
	if s == nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", param: "model",
			message: fmt.Sprintf("the model %q does not exist: this server serves %s", q.Model, g.names())})
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.complete(w, r, chat)
}

func (g *Group) models(w http.ResponseWriter, _ *http.Request) {
	var data []any
	for _, s := range g.servers {
		data = append(data, s.modelEntry())
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (g *Group) health(w http.ResponseWriter, r *http.Request) {
	for _, s := range g.servers {
		s.mu.Lock()
		down := s.draining || s.stopped
		s.mu.Unlock()
		if down {
			s.health(w, r)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (g *Group) getBudget(w http.ResponseWriter, _ *http.Request) {
	if g.o.Budget == nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", message: "this server's budget is fixed"})
		return
	}
	writeJSON(w, g.o.Budget.Budget())
}

// setBudget takes {"vram_bytes": N}: the process's device bytes, as
// --vram counts them.
func (g *Group) setBudget(w http.ResponseWriter, r *http.Request) {
	if g.o.Budget == nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", message: "this server's budget is fixed"})
		return
	}
	var q struct {
		VRAMBytes *uint64 `json:"vram_bytes"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		writeError(w, badRequest("", "malformed JSON body: %v (want {\"vram_bytes\": N})", err))
		return
	}
	if q.VRAMBytes == nil || *q.VRAMBytes == 0 {
		writeError(w, badRequest("vram_bytes", "vram_bytes is required: the process's device memory in bytes, as --vram counts it"))
		return
	}
	out, err := g.o.Budget.SetBudget(r.Context(), *q.VRAMBytes)
	switch {
	case errors.Is(err, ErrBudgetRefused):
		writeError(w, &apiError{status: http.StatusConflict, typ: "invalid_request_error", param: "vram_bytes", message: err.Error()})
	case err != nil:
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: "server_error", message: err.Error()})
	default:
		writeJSON(w, out)
	}
}
