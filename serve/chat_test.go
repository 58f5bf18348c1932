package serve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Templates as the models' tokenizer_config.json files carry them.
const (
	chatML = `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
	llama3 = `{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`
	llama2 = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`
)

func TestChatTemplates(t *testing.T) {
	conv := []Message{{"system", "Be brief."}, {"user", " Hi there "}, {"assistant", "Hello."}, {"user", "Sum 2+2."}}
	for _, c := range []struct {
		name, src string
		msgs      []Message
		gen       bool
		want      string
	}{
		{"chatml", chatML, conv[1:2], true, "<|im_start|>user\n Hi there <|im_end|>\n<|im_start|>assistant\n"},
		{"chatml-no-prompt", chatML, conv[1:3], false, "<|im_start|>user\n Hi there <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"},
		{"llama3", llama3, conv[:2], true, "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama2", llama2, conv, false, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello. </s><s>[INST] Sum 2+2. [/INST]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct, err := ParseChatTemplate(c.src, "test", "<s>", "</s>")
			if err != nil {
				t.Fatal(err)
			}
			got, err := ct.Render(c.msgs, c.gen)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
	ct, err := ParseChatTemplate(llama2, "test", "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ct.Render([]Message{{"assistant", "x"}}, true)
	var te *templateError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "must alternate") {
		t.Errorf("raise_exception: %v", err)
	}
	ct, err = ParseChatTemplate(`{% include "/etc/hostname" %}`, "test", "", "")
	if err == nil {
		if _, err = ct.Render(nil, true); err == nil {
			t.Error("a template included a file")
		}
	}
}

func TestLoadChatTemplate(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadChatTemplate(dir, nil, "", ""); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
	ct, err := LoadChatTemplate("", map[string]any{"tokenizer.chat_template": chatML}, "", "")
	if err != nil || !strings.Contains(ct.source, "GGUF") {
		t.Fatalf("GGUF: %v", err)
	}
	for _, c := range []struct{ cfg, want string }{
		{`{"chat_template": "A{{ messages[0]['content'] }}"}`, "Ax"},
		{`{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]}`, "D1"},
	} {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(c.cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		ct, err := LoadChatTemplate(dir, nil, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ct.Render([]Message{{"user", "x"}}, true); err != nil || got != c.want {
			t.Errorf("%s: %q, %v", c.cfg, got, err)
		}
	}
	for _, bad := range []string{`{"chat_template": 3}`, `{"chat_template": [{"name": "x", "template": "y"}]}`, `{`, `{"chat_template": "{% for %}"}`} {
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(bad), 0o644)
		if _, err := LoadChatTemplate(dir, nil, "", ""); err == nil || errors.Is(err, ErrNoTemplate) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
