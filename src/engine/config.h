// Qwen3 model configuration, read from (and written as) a Hugging Face `config.json`. Only the
// dense Qwen3 architecture (Qwen3ForCausalLM) is accepted; every feature lockstep does not
// implement (rope scaling, sliding-window layers, attention/MLP bias, quantization, ...) is a clear
// error, never silently ignored. docs/model-files.md lists what is read and what is rejected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::engine {

// Dimension names used below and by the engine:
//   V vocab_size, H hidden_size, I intermediate_size, L num_hidden_layers,
//   Hq num_attention_heads, Hkv num_key_value_heads, D head_dim.
struct Qwen3Config {
  int64_t vocab_size = 0;           // V
  int64_t hidden_size = 0;          // H
  int64_t intermediate_size = 0;    // I (SwiGLU MLP width)
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // Hq
  int64_t num_key_value_heads = 0;  // Hkv (GQA: Hq % Hkv == 0)
  int64_t head_dim = 128;           // D (Qwen3 states it; Hq·D need not equal H)
  double rms_norm_eps = 1e-6;       // as written; the norms use float(rms_norm_eps)
  double rope_theta = 10000.0;      // RoPE base
  int64_t max_position_embeddings = 32768;
  bool tie_word_embeddings = false;    // lm_head shares model.embed_tokens.weight
  std::string torch_dtype;             // "bfloat16" | "float32" | "float16" | "" (unspecified)
  std::vector<int64_t> bos_token_ids;  // bos_token_id: int, list or null (empty)
  std::vector<int64_t> eos_token_ids;  // eos_token_id: int, list or null (empty)

  // Throws lockstep::Error naming the field and the problem (sizes positive and below sane caps,
  // Hq % Hkv == 0, D even, eps and theta finite and positive, token ids inside the vocab, ...).
  void validate() const;
  // One line, e.g. "qwen3: V=2048 H=128 I=384 L=4 Hq=8 Hkv=4 D=32 eps=1e-06 theta=1e+06 ...".
  std::string to_string() const;
  // A Hugging Face compatible config.json (pretty-printed, keys sorted, trailing newline) that
  // parse_qwen3_config() and transformers' Qwen3Config both read back to the same values.
  std::string to_json() const;

  int64_t q_dim() const { return num_attention_heads * head_dim; }   // Hq·D
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }  // Hkv·D
  float rms_norm_eps_f32() const { return float(rms_norm_eps); }
};

// Parses config.json text. `source` names the file in error messages. Validates.
Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& source);
// Reads and parses a config.json file (at most 16 MiB; opened with open_regular_file, so a FIFO,
// a device or a directory is refused before reading, and a symlink loop is named).
Qwen3Config load_qwen3_config(const std::string& path);

// One weight tensor of the architecture: its Hugging Face name and shape (torch Linear layout,
// [out_features, in_features]).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every weight a Qwen3ForCausalLM checkpoint holds, in a fixed order:
//   model.embed_tokens.weight                         [V, H]
//   per layer i (model.layers.{i}.):
//     input_layernorm.weight                          [H]
//     self_attn.q_proj.weight                         [Hq·D, H]
//     self_attn.k_proj.weight                         [Hkv·D, H]
//     self_attn.v_proj.weight                         [Hkv·D, H]
//     self_attn.o_proj.weight                         [H, Hq·D]
//     self_attn.q_norm.weight                         [D]
//     self_attn.k_norm.weight                         [D]
//     post_attention_layernorm.weight                 [H]
//     mlp.gate_proj.weight                            [I, H]
//     mlp.up_proj.weight                              [I, H]
//     mlp.down_proj.weight                            [H, I]
//   model.norm.weight                                 [H]
//   lm_head.weight                                    [V, H]   (only if !tie_word_embeddings)
std::vector<WeightSpec> qwen3_weight_specs(const Qwen3Config& cfg);
// Total number of parameters (elements) over qwen3_weight_specs(cfg).
int64_t qwen3_num_parameters(const Qwen3Config& cfg);

// One GEMM of the forward as the engine launches it: y[M, n] = x[M, k] · w[n, k]ᵀ (q|k|v and
// gate|up fused). Row-parallel GEMMs split k across TP ranks, the others split n.
struct GemmShape {
  const char* name;  // "qkv", "o_proj", "gate_up", "down", "lm_head"
  int64_t n, k;
  bool row_parallel;
};
// The forward's GEMMs, in order: a decoder layer's qkv [Hq·D + 2·Hkv·D, H], o_proj [H, Hq·D],
// gate_up [2·I, H], down [H, I]; then the lm_head [V, H] if `with_lm_head`. The one list the
// plan command, the GEMM benchmarks and the GEMM parity tests read (qwen3_shape_config("qwen3-8b")
// for the Qwen3-8B layer shapes).
std::vector<GemmShape> qwen3_gemm_shapes(const Qwen3Config& cfg, bool with_lm_head = false);

}  // namespace lockstep::engine
