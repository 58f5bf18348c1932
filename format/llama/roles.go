package llama

import (
	"strconv"
	"strings"
)

// Role is what a tensor is for in the forward pass.
type Role int

// Roles of a Llama-family model's tensors.
const (
	RoleNone      Role = iota
	RoleEmbedding      // vocab × hidden
	RoleAttnNorm       // hidden
	RoleQ              // heads·head_dim × hidden
	RoleK              // kv_heads·head_dim × hidden
	RoleV              // kv_heads·head_dim × hidden
	RoleO              // hidden × heads·head_dim
	RoleMLPNorm        // hidden
	RoleGate           // intermediate × hidden
	RoleUp             // intermediate × hidden
	RoleDown           // hidden × intermediate
	RoleFinalNorm      // hidden
	RoleLMHead         // vocab × hidden
)

var roleNames = [...]string{"none", "embedding", "attention norm", "q", "k", "v", "o", "mlp norm", "gate", "up", "down", "final norm", "lm head"}

func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return "role(" + strconv.Itoa(int(r)) + ")"
	}
	return roleNames[r]
}

// PerLayer reports whether the role occurs once per block.
func (r Role) PerLayer() bool { return r >= RoleAttnNorm && r <= RoleDown }

var hfBlock = map[string]Role{
	"input_layernorm.weight":          RoleAttnNorm,
	"self_attn.q_proj.weight":         RoleQ,
	"self_attn.k_proj.weight":         RoleK,
	"self_attn.v_proj.weight":         RoleV,
	"self_attn.o_proj.weight":         RoleO,
	"post_attention_layernorm.weight": RoleMLPNorm,
	"mlp.gate_proj.weight":            RoleGate,
	"mlp.up_proj.weight":              RoleUp,
	"mlp.down_proj.weight":            RoleDown,
}

var ggufBlock = map[string]Role{
	"attn_norm.weight":   RoleAttnNorm,
	"attn_q.weight":      RoleQ,
	"attn_k.weight":      RoleK,
	"attn_v.weight":      RoleV,
	"attn_output.weight": RoleO,
	"ffn_norm.weight":    RoleMLPNorm,
	"ffn_gate.weight":    RoleGate,
	"ffn_up.weight":      RoleUp,
	"ffn_down.weight":    RoleDown,
}

var global = map[string]Role{
	"model.embed_tokens.weight": RoleEmbedding,
	"model.norm.weight":         RoleFinalNorm,
	"lm_head.weight":            RoleLMHead,
	"token_embd.weight":         RoleEmbedding,
	"output_norm.weight":        RoleFinalNorm,
	"output.weight":             RoleLMHead,
}

// RoleOf maps a Hugging Face or GGUF tensor name to its block number (-1
// for tensors outside the blocks) and role; ok is false for names that are
// not part of a Llama model (rotary caches, rope_freqs, ...).
func RoleOf(name string) (layer int, role Role, ok bool) {
	if r, ok := global[name]; ok {
		return -1, r, true
	}
	for _, pre := range []struct {
		prefix string
		roles  map[string]Role
	}{{"model.layers.", hfBlock}, {"blk.", ggufBlock}} {
		rest, found := strings.CutPrefix(name, pre.prefix)
		if !found {
			continue
		}
		num, tail, found := strings.Cut(rest, ".")
		if !found || num == "" || len(num) > 6 {
			return -1, RoleNone, false
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 || strconv.Itoa(n) != num {
			return -1, RoleNone, false
		}
		r, found := pre.roles[tail]
		if !found {
			return -1, RoleNone, false
		}
		return n, r, true
	}
	return -1, RoleNone, false
}
