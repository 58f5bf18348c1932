package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrNoTemplate says that a model has no chat template.
var ErrNoTemplate = errors.New("serve: the model has no chat template")

// Message is one chat message as the template sees it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatTemplate renders chat messages into a prompt with a model's Jinja
// chat template (Hugging Face's apply_chat_template semantics: trim_blocks
// and lstrip_blocks on, the variables messages, bos_token, eos_token and
// add_generation_prompt, and raise_exception). A template cannot include
// or import other templates. Render may be called from many goroutines.
type ChatTemplate struct {
	tpl      *exec.Template
	source   string // where it came from, for errors
	bos, eos string
}

// ParseChatTemplate compiles src (from source, named in errors); bos and
// eos are the tokenizer's special tokens as text ("" when it has none).
func ParseChatTemplate(src, source, bos, eos string) (*ChatTemplate, error) {
	cfg := config.New()
	cfg.TrimBlocks, cfg.LeftStripBlocks = true, true
	env := &exec.Environment{
		Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	tpl, err := exec.NewTemplate("chat_template", cfg, oneTemplate{src}, env)
	if err != nil {
		return nil, fmt.Errorf("serve: chat template in %s: %w", source, err)
	}
	return &ChatTemplate{tpl: tpl, source: source, bos: bos, eos: eos}, nil
}

// oneTemplate is a loader holding the chat template alone: include,
// import and extends find nothing (no file is ever read).
type oneTemplate struct{ src string }

func (l oneTemplate) Read(path string) (io.Reader, error) {
	if path != "chat_template" {
		return nil, fmt.Errorf("a chat template cannot load %q", path)
	}
	return strings.NewReader(l.src), nil
}

func (l oneTemplate) Resolve(path string) (string, error) { return path, nil }

func (l oneTemplate) Inherit(string) (loaders.Loader, error) { return l, nil }

// templateError is a template's raise_exception.
type templateError struct{ msg string }

func (e *templateError) Error() string { return e.msg }

// Render renders msgs, with the assistant's turn opened when
// addGenerationPrompt. A template's raise_exception comes back as an error
// holding its message.
func (c *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	var raised *templateError
	ctx := exec.NewContext(map[string]any{
		"messages":              list,
		"bos_token":             c.bos,
		"eos_token":             c.eos,
		"add_generation_prompt": addGenerationPrompt,
		"raise_exception": func(msg string) (string, error) {
			raised = &templateError{msg}
			return "", raised
		},
	})
	var out bytes.Buffer
	if err := c.tpl.Execute(&out, ctx); err != nil {
		if raised != nil {
			return "", raised
		}
		return "", fmt.Errorf("serve: chat template in %s: %w", c.source, err)
	}
	return out.String(), nil
}

// LoadChatTemplate finds a model's chat template: the chat_template of the
// tokenizer_config.json in dir (a string, or a list of {name, template}
// whose "default" entry is taken), else GGUF metadata's
// tokenizer.chat_template in meta. It returns ErrNoTemplate when neither
// holds one.
func LoadChatTemplate(dir string, meta map[string]any, bos, eos string) (*ChatTemplate, error) {
	if dir != "" {
		path := filepath.Join(dir, "tokenizer_config.json")
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			src, err := configTemplate(b)
			if err != nil {
				return nil, fmt.Errorf("serve: %s: chat_template: %w", path, err)
			}
			if src != "" {
				return ParseChatTemplate(src, path, bos, eos)
			}
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	if s, ok := meta["tokenizer.chat_template"].(string); ok && s != "" {
		return ParseChatTemplate(s, "GGUF metadata tokenizer.chat_template", bos, eos)
	}
	return nil, ErrNoTemplate
}

// configTemplate reads tokenizer_config.json's chat_template ("" when
// absent).
func configTemplate(b []byte) (string, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return "", err
	}
	raw := bytes.TrimSpace(cfg.ChatTemplate)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of {name, template}")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New(`a list of templates without a "default" one`)
}

// Source says where the template came from (a file, or GGUF metadata).
func (c *ChatTemplate) Source() string { return c.source }
