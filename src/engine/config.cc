// Qwen3 config.json reader/writer. Strict: wrong types, out-of-range sizes and unsupported
// architecture features are errors naming the file and the field; unknown keys are ignored (HF
// configs carry many that do not affect the forward pass).
#include "engine/config.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/file_io.h"
#include "engine/text.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

using json = nlohmann::json;

// Sane caps: far above any real model, low enough that products of two sizes fit in int64.
constexpr int64_t kMaxDim = int64_t(1) << 24;        // V, H, I, D, heads
constexpr int64_t kMaxLayers = 1024;                 // L
constexpr int64_t kMaxPositions = int64_t(1) << 30;  // max_position_embeddings
constexpr int kMaxJsonDepth = 64;
constexpr uint64_t kMaxConfigBytes = uint64_t(16) << 20;  // real config.json files are a few KB

// Shortest decimal that reads back to the same double.
std::string fmt_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw Error(detail::concat("config ", source_, ": '", key, "' ", msg));
  }
  [[noreturn]] void fail_unsupported(const std::string& what) const {
    throw Error(detail::concat("config ", source_, ": unsupported: ", what));
  }

  // The value of `key`, or nullptr if absent or null.
  const json* get(const std::string& key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  int64_t as_int(const std::string& key, const json& v) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(key, "is too large");
      return int64_t(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    fail(key, "must be an integer, got " + describe(v));
  }
  int64_t get_int(const std::string& key, bool required, int64_t def) const {
    const json* v = get(key);
    if (!v) {
      if (required) fail(key, "is missing");
      return def;
    }
    return as_int(key, *v);
  }
  double get_number(const std::string& key, double def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_number()) fail(key, "must be a number, got " + describe(*v));
    return v->get<double>();
  }
  bool get_bool(const std::string& key, bool def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + describe(*v));
    return v->get<bool>();
  }
  std::string get_string(const std::string& key, const std::string& def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, "must be a string, got " + describe(*v));
    return v->get<std::string>();
  }
  // int, list of ints, or null/absent (empty).
  std::vector<int64_t> get_int_list(const std::string& key) const {
    const json* v = get(key);
    if (!v) return {};
    if (v->is_array()) {
      std::vector<int64_t> out;
      for (const json& e : *v) out.push_back(as_int(key, e));
      return out;
    }
    return {as_int(key, *v)};
  }

 private:
  const json& j_;
  const std::string& source_;
};

void check_architecture(const Fields& f) {
  std::string model_type = f.get_string("model_type", "");
  const json* archs = f.get("architectures");
  if (model_type.empty() && !archs)
    f.fail("model_type", "is missing (and so is 'architectures'): not a Qwen3 config.json");
  if (!model_type.empty() && model_type != "qwen3")
    f.fail("model_type", "is \"" + printable(model_type, false, 80) +
                             "\"; lockstep runs only \"qwen3\" (dense Qwen3)");
  if (archs) {
    if (!archs->is_array() || archs->empty())
      f.fail("architectures", "must be a non-empty list, got " + describe(*archs));
    for (const json& a : *archs) {
      if (!a.is_string()) f.fail("architectures", "must hold strings, got " + describe(a));
      if (a.get<std::string>() != "Qwen3ForCausalLM")
        f.fail("architectures",
               "lists " + describe(a) + "; lockstep runs only \"Qwen3ForCausalLM\" (dense Qwen3)");
    }
  }
}

// Everything Qwen3 configs can switch on that lockstep does not implement: a clear error each.
void check_unsupported(const Fields& f, int64_t layers) {
  if (f.get_bool("attention_bias", false))
    f.fail_unsupported("attention_bias: true (q/k/v/o projections with bias)");
  if (f.get_bool("mlp_bias", false)) f.fail_unsupported("mlp_bias: true");
  if (!f.get_bool("use_qk_norm", true)) f.fail_unsupported("use_qk_norm: false");
  std::string act = f.get_string("hidden_act", "silu");
  if (act != "silu")
    f.fail_unsupported("hidden_act \"" + printable(act, false, 80) + "\" (only \"silu\")");
  if (f.get("quantization_config")) f.fail_unsupported("quantization_config (quantized weights)");

  if (const json* rs = f.get("rope_scaling")) {
    if (!rs->is_object()) f.fail("rope_scaling", "must be an object or null, got " + describe(*rs));
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      auto it = rs->find(k);
      if (it != rs->end() && it->is_string()) type = it->get<std::string>();
    }
    if (type != "default")
      f.fail_unsupported("rope_scaling with rope_type \"" + printable(type, false, 80) +
                         "\" (only null or \"default\": plain RoPE)");
  }

  // Sliding-window layers, computed the way transformers' Qwen3Config does.
  if (const json* lt = f.get("layer_types")) {
    if (!lt->is_array()) f.fail("layer_types", "must be a list, got " + describe(*lt));
    if (int64_t(lt->size()) != layers)
      f.fail("layer_types", detail::concat("has ", lt->size(), " entries for ", layers, " layers"));
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (!t.is_string()) f.fail("layer_types", "must hold strings, got " + describe(t));
      if (t.get<std::string>() != "full_attention")
        f.fail_unsupported(detail::concat("layer_types[", i, "] = ", describe(t),
                                          " (only \"full_attention\"; no sliding window)"));
    }
  }
  if (f.get_bool("use_sliding_window", false)) {
    const json* sw = f.get("sliding_window");
    int64_t max_window_layers = f.get_int("max_window_layers", false, 28);
    if (sw && max_window_layers < layers)
      f.fail_unsupported(detail::concat(
          "sliding-window attention (use_sliding_window: true, sliding_window: ", describe(*sw),
          ", layers >= max_window_layers ", max_window_layers, " would slide)"));
  }
}

// rope_theta: top-level (transformers 4.x) or rope_parameters.rope_theta (transformers 5).
double read_rope_theta(const Fields& f) {
  double theta = f.get_number("rope_theta", 10000.0);
  const json* rp = f.get("rope_parameters");
  if (!rp) return theta;
  if (!rp->is_object())
    f.fail("rope_parameters", "must be an object or null, got " + describe(*rp));
  for (auto it = rp->begin(); it != rp->end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "rope_type") {
      if (!v.is_string() || v.get<std::string>() != "default")
        f.fail_unsupported("rope_parameters.rope_type " + describe(v) +
                           " (only \"default\": plain RoPE)");
    } else if (k == "rope_theta") {
      if (!v.is_number())
        f.fail("rope_parameters.rope_theta", "must be a number, got " + describe(v));
      double t = v.get<double>();
      if (f.get("rope_theta") && t != theta)
        f.fail("rope_parameters.rope_theta",
               "is " + fmt_double(t) + " but rope_theta is " + fmt_double(theta));
      theta = t;
    } else if (k == "partial_rotary_factor") {
      if (!v.is_number() || v.get<double>() != 1.0)
        f.fail_unsupported("rope_parameters.partial_rotary_factor " + describe(v) + " (only 1)");
    } else {
      f.fail_unsupported("rope_parameters key '" + printable(k, false, 80) + "'");
    }
  }
  return theta;
}

std::string read_dtype(const Fields& f) {
  std::string a = f.get_string("torch_dtype", "");
  std::string b = f.get_string("dtype", "");  // transformers 5 name
  if (!a.empty() && !b.empty() && a != b)
    f.fail("dtype", "is \"" + printable(b, false, 80) + "\" but torch_dtype is \"" +
                        printable(a, false, 80) + "\"");
  std::string d = b.empty() ? a : b;
  if (!d.empty() && d != "bfloat16" && d != "float32" && d != "float16")
    f.fail_unsupported("torch_dtype \"" + printable(d, false, 80) +
                       "\" (bfloat16, float32 or float16)");
  return d;
}

json ids_to_json(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

std::string describe(const nlohmann::json& v, bool values) {
  switch (v.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::null:
      return "null";
    case json::value_t::string:
      return values ? "\"" + printable(v.get_ref<const std::string&>(), false, 40) + "\""
                    : "a string";
    case json::value_t::boolean:
      return values ? (v.get<bool>() ? "true" : "false") : "a boolean";
    case json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float:
      return values ? fmt_double(v.get<double>()) : "a non-integer number";
    default:
      return "an unsupported value";
  }
}

void Qwen3Config::validate() const {
  auto positive = [](const char* name, int64_t v, int64_t cap) {
    LS_CHECK(v > 0 && v <= cap, "Qwen3Config", name, " must be in [1, ", cap, "], got ", v);
  };
  positive("vocab_size", vocab_size, kMaxDim);
  positive("hidden_size", hidden_size, kMaxDim);
  positive("intermediate_size", intermediate_size, kMaxDim);
  positive("num_hidden_layers", num_hidden_layers, kMaxLayers);
  positive("num_attention_heads", num_attention_heads, kMaxDim);
  positive("num_key_value_heads", num_key_value_heads, kMaxDim);
  positive("head_dim", head_dim, kMaxDim);
  positive("max_position_embeddings", max_position_embeddings, kMaxPositions);
  LS_CHECK(num_attention_heads % num_key_value_heads == 0, "Qwen3Config", "num_attention_heads (",
           num_attention_heads, ") must be a multiple of ", "num_key_value_heads (",
           num_key_value_heads, ")");
  LS_CHECK(head_dim % 2 == 0, "Qwen3Config", "head_dim must be even (RoPE rotates pairs), got ",
           head_dim);
  LS_CHECK(q_dim() <= kMaxDim, "Qwen3Config", "num_attention_heads * head_dim = ", q_dim(),
           " exceeds ", kMaxDim);
  LS_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps >= 0 && std::isfinite(float(rms_norm_eps)),
           "Qwen3Config", "rms_norm_eps must be finite and >= 0, got ", fmt_double(rms_norm_eps));
  LS_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "Qwen3Config",
           "rope_theta must be finite and > 0, got ", fmt_double(rope_theta));
  LS_CHECK(torch_dtype.empty() || torch_dtype == "bfloat16" || torch_dtype == "float32" ||
               torch_dtype == "float16",
           "Qwen3Config", "torch_dtype must be bfloat16, float32, float16 or empty, got \"",
           torch_dtype, "\"");
  for (const auto* ids : {&bos_token_ids, &eos_token_ids})
    for (int64_t id : *ids)
      LS_CHECK(id >= 0 && id < vocab_size, "Qwen3Config",
               ids == &bos_token_ids ? "bos_token_id " : "eos_token_id ", id,
               " is outside the vocab [0, ", vocab_size, ")");
}

std::string Qwen3Config::to_string() const {
  std::ostringstream os;
  os << "qwen3: V=" << vocab_size << " H=" << hidden_size << " I=" << intermediate_size
     << " L=" << num_hidden_layers << " Hq=" << num_attention_heads
     << " Hkv=" << num_key_value_heads << " D=" << head_dim << " eps=" << fmt_double(rms_norm_eps)
     << " theta=" << fmt_double(rope_theta) << " max_pos=" << max_position_embeddings
     << " tied=" << (tie_word_embeddings ? 1 : 0)
     << " dtype=" << (torch_dtype.empty() ? "?" : torch_dtype)
     << " bos=" << list_text(bos_token_ids, ",") << " eos=" << list_text(eos_token_ids, ",");
  return os.str();
}

std::string Qwen3Config::to_json() const {
  validate();
  json j;  // std::map-backed: keys come out sorted, as transformers writes them
  j["architectures"] = json::array({"Qwen3ForCausalLM"});
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = ids_to_json(bos_token_ids);
  j["eos_token_id"] = ids_to_json(eos_token_ids);
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["max_window_layers"] = num_hidden_layers;
  j["model_type"] = "qwen3";
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = rope_theta;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& source) {
  json j;
  // NOTE: nlohmann's lexer takes a NUL byte for the end of input; JSON text never holds one.
  if (auto nul = json_text.find('\0'); nul != std::string::npos)
    throw Error(detail::concat("config ", source, ": NUL byte at offset ", nul));
  try {
    // The depth callback bounds nesting (a config is two levels deep) before values pile up.
    j = json::parse(json_text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        throw Error(detail::concat("config ", source, ": JSON nested deeper than ", kMaxJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(
        detail::concat("config ", source, ": invalid JSON: ", printable(e.what(), true, 300)));
  }
  if (!j.is_object())
    throw Error(detail::concat("config ", source, ": expected a JSON object at the top level"));

  Fields f(j, source);
  check_architecture(f);
  Qwen3Config c;
  c.vocab_size = f.get_int("vocab_size", true, 0);
  c.hidden_size = f.get_int("hidden_size", true, 0);
  c.intermediate_size = f.get_int("intermediate_size", true, 0);
  c.num_hidden_layers = f.get_int("num_hidden_layers", true, 0);
  c.num_attention_heads = f.get_int("num_attention_heads", true, 0);
  // Absent or null: transformers' Qwen3Config uses num_attention_heads (no GQA) ...
  c.num_key_value_heads = f.get_int("num_key_value_heads", false, c.num_attention_heads);
  // ... and head_dim = 128 (its class default; NOT hidden/heads as Llama configs assume).
  c.head_dim = f.get_int("head_dim", false, 128);
  c.rms_norm_eps = f.get_number("rms_norm_eps", 1e-6);
  c.rope_theta = read_rope_theta(f);
  c.max_position_embeddings = f.get_int("max_position_embeddings", false, 32768);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  c.torch_dtype = read_dtype(f);
  c.bos_token_ids = f.get_int_list("bos_token_id");
  c.eos_token_ids = f.get_int_list("eos_token_id");
  if (c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxLayers)
    check_unsupported(f, c.num_hidden_layers);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(detail::concat("config ", source, ": ", e.what()));
  }
  return c;
}

Qwen3Config load_qwen3_config(const std::string& path) {
  return parse_qwen3_config(read_small_file(path, kMaxConfigBytes, "config " + path), path);
}

std::vector<WeightSpec> qwen3_weight_specs(const Qwen3Config& c) {
  c.validate();
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  std::vector<WeightSpec> s;
  s.push_back({"model.embed_tokens.weight", {V, H}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    s.push_back({p + "input_layernorm.weight", {H}});
    s.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), H}});
    s.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), H}});
    s.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), H}});
    s.push_back({p + "self_attn.o_proj.weight", {H, c.q_dim()}});
    s.push_back({p + "self_attn.q_norm.weight", {D}});
    s.push_back({p + "self_attn.k_norm.weight", {D}});
    s.push_back({p + "post_attention_layernorm.weight", {H}});
    s.push_back({p + "mlp.gate_proj.weight", {I, H}});
    s.push_back({p + "mlp.up_proj.weight", {I, H}});
    s.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  s.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {V, H}});
  return s;
}

int64_t qwen3_num_parameters(const Qwen3Config& c) {
  int64_t n = 0;
  for (const WeightSpec& w : qwen3_weight_specs(c)) {
    int64_t e = 1;
    for (int64_t d : w.shape) e *= d;
    n += e;
  }
  return n;
}

std::vector<GemmShape> qwen3_gemm_shapes(const Qwen3Config& cfg, bool with_lm_head) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  std::vector<GemmShape> g = {{"qkv", cfg.q_dim() + 2 * cfg.kv_dim(), H, false},
                              {"o_proj", H, cfg.q_dim(), true},
                              {"gate_up", 2 * I, H, false},
                              {"down", H, I, true}};
  if (with_lm_head) g.push_back({"lm_head", cfg.vocab_size, H, false});
  return g;
}

}  // namespace lockstep::engine
