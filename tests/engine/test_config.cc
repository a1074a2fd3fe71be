// Qwen3 config.json: parsing real configs (transformers 4.x and 5.x styles), defaults, the
// to_json() round trip, weight specs, and one clear error per malformed or unsupported input.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "engine/config.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

// Qwen/Qwen3-0.6B's config.json as published (transformers 4.51).
const char* kQwen3_06B = R"({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// A small config as key -> raw JSON value; edit entries, then render.
using Fields = std::map<std::string, std::string>;
Fields small_fields() {
  return {{"architectures", R"(["Qwen3ForCausalLM"])"},
          {"model_type", R"("qwen3")"},
          {"vocab_size", "1000"},
          {"hidden_size", "64"},
          {"intermediate_size", "160"},
          {"num_hidden_layers", "3"},
          {"num_attention_heads", "4"},
          {"num_key_value_heads", "2"},
          {"head_dim", "16"},
          {"rms_norm_eps", "1e-05"},
          {"rope_theta", "10000.0"},
          {"max_position_embeddings", "512"},
          {"tie_word_embeddings", "false"},
          {"torch_dtype", R"("float32")"},
          {"bos_token_id", "0"},
          {"eos_token_id", "[1, 2]"}};
}
std::string render(const Fields& f) {
  std::string s = "{";
  for (const auto& [k, v] : f) s += (s.size() > 1 ? ",\n  \"" : "\n  \"") + k + "\": " + v;
  return s + "\n}";
}

// Expects parse to throw a lockstep::Error mentioning the source and every `needles` entry.
void expect_error(const std::string& text, std::initializer_list<const char*> needles) {
  try {
    Qwen3Config c = parse_qwen3_config(text, "test/config.json");
    ADD_FAILURE() << "expected an error for:\n" << text << "\ngot " << c.to_string();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("test/config.json"), std::string::npos) << msg;
    for (const char* n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}
void expect_field_error(const std::string& key, const std::string& value,
                        std::initializer_list<const char*> needles) {
  Fields f = small_fields();
  f[key] = value;
  SCOPED_TRACE(key + " = " + value);
  expect_error(render(f), needles);
}

TEST(Qwen3Config, ParsesQwen3_0_6B) {
  Qwen3Config c = parse_qwen3_config(kQwen3_06B, "Qwen3-0.6B/config.json");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);  // != hidden: o_proj is [1024, 2048]
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rms_norm_eps_f32(), 1e-6f);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_ids, std::vector<int64_t>{151643});
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  // The published parameter count of Qwen3-0.6B (tied embeddings counted once).
  EXPECT_EQ(qwen3_num_parameters(c), 596049920);
  EXPECT_EQ(c.to_string(),
            "qwen3: V=151936 H=1024 I=3072 L=28 Hq=16 Hkv=8 D=128 eps=1e-06 theta=1e+06 "
            "max_pos=40960 tied=1 dtype=bfloat16 bos=[151643] eos=[151645]");
}

TEST(Qwen3Config, ParsesTransformers5Style) {
  // transformers 5 writes "dtype" and "rope_parameters", and spells out layer_types.
  Fields f = small_fields();
  f.erase("torch_dtype");
  f.erase("rope_theta");
  f["dtype"] = R"("bfloat16")";
  f["rope_parameters"] = R"({"rope_theta": 5000000.0, "rope_type": "default"})";
  f["layer_types"] = R"(["full_attention", "full_attention", "full_attention"])";
  f["use_sliding_window"] = "false";
  f["sliding_window"] = "null";
  Qwen3Config c = parse_qwen3_config(render(f), "v5.json");
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(Qwen3Config, DefaultsFollowTransformers) {
  Fields f = small_fields();
  for (const char* k :
       {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
        "tie_word_embeddings", "torch_dtype", "bos_token_id", "eos_token_id", "architectures"})
    f.erase(k);
  Qwen3Config c = parse_qwen3_config(render(f), "defaults.json");
  EXPECT_EQ(c.num_key_value_heads, c.num_attention_heads);
  EXPECT_EQ(c.head_dim, 128);  // transformers' Qwen3Config default, not hidden / heads
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_TRUE(c.eos_token_ids.empty());
  // null means absent, as in transformers.
  f = small_fields();
  f["num_key_value_heads"] = "null";
  f["eos_token_id"] = "null";
  c = parse_qwen3_config(render(f), "nulls.json");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_TRUE(c.eos_token_ids.empty());
  // A sliding-window flag that makes no layer slide (max_window_layers >= layers) is accepted.
  f = small_fields();
  f["use_sliding_window"] = "true";
  f["sliding_window"] = "4096";
  f["max_window_layers"] = "3";
  EXPECT_NO_THROW(parse_qwen3_config(render(f), "sw.json"));
  f["rope_scaling"] = R"({"rope_type": "default"})";
  EXPECT_NO_THROW(parse_qwen3_config(render(f), "sw.json"));
}

TEST(Qwen3Config, JsonRoundTrip) {
  for (const std::string& text : {std::string(kQwen3_06B), render(small_fields())}) {
    Qwen3Config a = parse_qwen3_config(text, "a.json");
    std::string js = a.to_json();
    Qwen3Config b = parse_qwen3_config(js, "b.json");
    EXPECT_EQ(a.to_string(), b.to_string());
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);  // bit-exact doubles
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    EXPECT_EQ(b.to_json(), js);  // stable
    EXPECT_EQ(js.back(), '\n');
  }
  // Several eos ids come back as a list, one as an int.
  Qwen3Config c = parse_qwen3_config(render(small_fields()), "x.json");
  EXPECT_NE(c.to_json().find("\"eos_token_id\": [\n    1,\n    2\n  ]"), std::string::npos)
      << c.to_json();
  EXPECT_NE(c.to_json().find("\"bos_token_id\": 0,"), std::string::npos);
  // An odd eps survives exactly.
  c.rms_norm_eps = 1.0 / 3.0;
  EXPECT_EQ(parse_qwen3_config(c.to_json(), "y.json").rms_norm_eps, 1.0 / 3.0);
}

TEST(Qwen3Config, FileLoad) {
  std::string path = ::testing::TempDir() + "lockstep_test_config.json";
  {
    std::ofstream out(path);
    out << kQwen3_06B;
  }
  EXPECT_EQ(load_qwen3_config(path).hidden_size, 1024);
  std::remove(path.c_str());
  try {
    load_qwen3_config(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open " + path), std::string::npos) << e.what();
  }
  // Size is capped before reading (a config.json is a few KB); a directory is refused.
  {
    std::ofstream out(path);
    out << std::string((16 << 20) + 1, ' ');
  }
  try {
    load_qwen3_config(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is 16777217 bytes (cap 16777216)"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
  try {
    load_qwen3_config(::testing::TempDir());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory, not a regular file"), std::string::npos)
        << e.what();
  }
}

TEST(Qwen3Config, MalformedJson) {
  expect_error("", {"invalid JSON"});
  expect_error("{\"vocab_size\": 12", {"invalid JSON"});
  expect_error("{} trailing", {"invalid JSON"});
  expect_error("[1, 2]", {"expected a JSON object"});
  expect_error(std::string("{}\0{\"x\": 1}", 11), {"NUL byte at offset 2"});
  expect_error("\"qwen3\"", {"expected a JSON object"});
  expect_error(std::string(100, '[') + std::string(100, ']'), {"nested deeper"});
  Fields f = small_fields();
  f["extra"] = std::string(100, '[') + std::string(100, ']');
  expect_error(render(f), {"nested deeper"});
}

TEST(Qwen3Config, RejectsOtherArchitectures) {
  expect_field_error("model_type", R"("llama")", {"model_type", "\"llama\"", "qwen3"});
  expect_field_error("model_type", R"("qwen3_moe")", {"qwen3_moe"});
  expect_field_error("architectures", R"(["Qwen2ForCausalLM"])",
                     {"architectures", "Qwen2ForCausalLM", "Qwen3ForCausalLM"});
  expect_field_error("architectures", R"(["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])",
                     {"Qwen3MoeForCausalLM"});
  expect_field_error("architectures", "[]", {"non-empty list"});
  expect_field_error("architectures", R"("Qwen3ForCausalLM")", {"non-empty list"});
  expect_field_error("architectures", "[3]", {"must hold strings"});
  expect_field_error("model_type", "7", {"'model_type' must be a string"});
  Fields f = small_fields();
  f.erase("model_type");
  f.erase("architectures");
  expect_error(render(f), {"not a Qwen3 config.json"});
}

TEST(Qwen3Config, RejectsUnsupportedFeatures) {
  expect_field_error("attention_bias", "true", {"unsupported", "attention_bias"});
  expect_field_error("mlp_bias", "true", {"unsupported", "mlp_bias"});
  expect_field_error("use_qk_norm", "false", {"unsupported", "use_qk_norm"});
  expect_field_error("hidden_act", R"("gelu")", {"unsupported", "gelu"});
  expect_field_error("quantization_config", R"({"quant_method": "fp8"})",
                     {"unsupported", "quantization_config"});
  expect_field_error("rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})",
                     {"unsupported", "rope_scaling", "yarn"});
  expect_field_error("rope_scaling", R"({"type": "linear", "factor": 2.0})", {"linear"});
  expect_field_error("rope_scaling", "1.5", {"rope_scaling", "must be an object"});
  auto rope_parameters_error = [](const std::string& value,
                                  std::initializer_list<const char*> needles) {
    Fields f = small_fields();
    f.erase("rope_theta");  // transformers 5 style: theta only inside rope_parameters
    f["rope_parameters"] = value;
    SCOPED_TRACE(value);
    expect_error(render(f), needles);
  };
  rope_parameters_error(R"({"rope_type": "llama3", "rope_theta": 1e6})", {"unsupported", "llama3"});
  rope_parameters_error(R"({"rope_theta": 1e6, "factor": 8})", {"unsupported", "'factor'"});
  rope_parameters_error(R"({"rope_theta": 1e6, "partial_rotary_factor": 0.5})",
                        {"partial_rotary_factor"});
  rope_parameters_error(R"({"rope_theta": "big"})", {"must be a number"});
  rope_parameters_error("[1e6]", {"'rope_parameters' must be an object"});
  // Both spellings present and disagreeing.
  expect_field_error("rope_parameters", R"({"rope_theta": 50.0})",
                     {"rope_parameters.rope_theta", "is 50 but rope_theta is 10000"});
  expect_field_error("layer_types", R"(["full_attention", "sliding_attention", "full_attention"])",
                     {"unsupported", "layer_types[1]", "sliding_attention"});
  expect_field_error("layer_types", R"(["full_attention"])", {"1 entries for 3 layers"});
  Fields f = small_fields();
  f["use_sliding_window"] = "true";
  f["sliding_window"] = "4096";
  f["max_window_layers"] = "1";
  expect_error(render(f), {"unsupported", "sliding-window", "4096"});
  expect_field_error("torch_dtype", R"("float8_e4m3fn")", {"unsupported", "float8_e4m3fn"});
  Fields g = small_fields();
  g["dtype"] = R"("bfloat16")";
  expect_error(render(g), {"'dtype'", "\"bfloat16\"", "torch_dtype is \"float32\""});
}

TEST(Qwen3Config, RejectsBadValues) {
  Fields f = small_fields();
  f.erase("hidden_size");
  expect_error(render(f), {"'hidden_size' is missing"});
  expect_field_error("hidden_size", R"("64")", {"'hidden_size' must be an integer", "\"64\""});
  expect_field_error("hidden_size", "64.0", {"'hidden_size' must be an integer", "64"});
  expect_field_error("hidden_size", "true", {"must be an integer", "true"});
  expect_field_error("hidden_size", "[64]", {"must be an integer", "an array"});
  expect_field_error("hidden_size", "-64", {"hidden_size must be in [1,", "got -64"});
  expect_field_error("hidden_size", "0", {"hidden_size must be in [1,", "got 0"});
  expect_field_error("vocab_size", "99999999999", {"vocab_size must be in [1,"});
  expect_field_error("vocab_size", "18446744073709551615", {"'vocab_size' is too large"});
  expect_field_error("num_hidden_layers", "100000", {"num_hidden_layers must be in [1, 1024]"});
  expect_field_error("num_attention_heads", "5",
                     {"num_attention_heads (5)", "multiple of", "num_key_value_heads (2)"});
  expect_field_error("num_key_value_heads", "0", {"num_key_value_heads must be in [1,"});
  expect_field_error("head_dim", "15", {"head_dim must be even"});
  expect_field_error("intermediate_size", "-1", {"intermediate_size"});
  expect_field_error("max_position_embeddings", "0", {"max_position_embeddings"});
  expect_field_error("rms_norm_eps", "-1e-6", {"rms_norm_eps must be finite and >= 0"});
  expect_field_error("rms_norm_eps", "1e300", {"rms_norm_eps"});  // not finite as float
  expect_field_error("rms_norm_eps", R"("1e-6")", {"'rms_norm_eps' must be a number"});
  expect_field_error("rope_theta", "0", {"rope_theta must be finite and > 0"});
  expect_field_error("rope_theta", "-5", {"rope_theta"});
  expect_field_error("tie_word_embeddings", "1", {"'tie_word_embeddings' must be true or false"});
  expect_field_error("eos_token_id", "1000", {"eos_token_id 1000 is outside the vocab [0, 1000)"});
  expect_field_error("eos_token_id", "[1, -2]", {"eos_token_id -2"});
  expect_field_error("eos_token_id", R"("</s>")", {"'eos_token_id' must be an integer"});
  expect_field_error("bos_token_id", "[[1]]", {"'bos_token_id' must be an integer"});
  expect_field_error("bos_token_id", "5000", {"bos_token_id 5000"});
}

TEST(Qwen3Config, ValidateNamesTheField) {
  Qwen3Config c = parse_qwen3_config(render(small_fields()), "x.json");
  EXPECT_NO_THROW(c.validate());
  auto expect_invalid = [](Qwen3Config c, const char* needle) {
    try {
      c.validate();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Qwen3Config bad = c;
  bad.head_dim = 7;
  expect_invalid(bad, "head_dim must be even");
  bad = c;
  bad.rope_theta = std::nan("");
  expect_invalid(bad, "rope_theta");
  bad = c;
  bad.torch_dtype = "int4";
  expect_invalid(bad, "torch_dtype");
  bad = c;
  bad.num_attention_heads = 1 << 22;  // · head_dim 16 = 2^26 > the 2^24 cap
  bad.num_key_value_heads = 1 << 22;
  expect_invalid(bad, "num_attention_heads * head_dim");
  // to_json refuses to write an invalid config.
  bad = c;
  bad.vocab_size = 0;
  EXPECT_THROW(bad.to_json(), Error);
}

TEST(Qwen3Config, WeightSpecs) {
  Qwen3Config c = parse_qwen3_config(render(small_fields()), "x.json");  // untied, 3 layers
  std::vector<WeightSpec> s = qwen3_weight_specs(c);
  ASSERT_EQ(s.size(), size_t(1 + 11 * 3 + 1 + 1));
  EXPECT_EQ(s.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(s.front().shape, (std::vector<int64_t>{1000, 64}));
  EXPECT_EQ(s.back().name, "lm_head.weight");
  std::map<std::string, std::vector<int64_t>> m;
  for (const WeightSpec& w : s) EXPECT_TRUE(m.emplace(w.name, w.shape).second) << w.name;
  EXPECT_EQ(m.at("model.layers.2.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(m.at("model.layers.2.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(m.at("model.layers.2.self_attn.v_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(m.at("model.layers.2.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight"), (std::vector<int64_t>{16}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_norm.weight"), (std::vector<int64_t>{16}));
  EXPECT_EQ(m.at("model.layers.1.input_layernorm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(m.at("model.layers.1.post_attention_layernorm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(m.at("model.layers.1.mlp.gate_proj.weight"), (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(m.at("model.layers.1.mlp.up_proj.weight"), (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(m.at("model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{64, 160}));
  EXPECT_EQ(m.at("model.norm.weight"), (std::vector<int64_t>{64}));
  c.tie_word_embeddings = true;
  EXPECT_EQ(qwen3_weight_specs(c).size(), s.size() - 1);
}

// Random edits of a valid config.json: parsing either succeeds (then the config is valid) or
// throws lockstep::Error; nothing else.
TEST(Qwen3Config, MutatedTextOnlyThrowsError) {
  auto g = test::rng(7);
  const std::string base = kQwen3_06B;
  const std::string alphabet = "{}[]\":,0123456789-+.eE truefalsnul\\\x01\xff";
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = base;
    int edits = 1 + int(g() % 4);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      size_t pos = g() % s.size();
      switch (g() % 4) {
        case 0:
          s[pos] = alphabet[g() % alphabet.size()];
          break;
        case 1:
          s.insert(pos, 1, alphabet[g() % alphabet.size()]);
          break;
        case 2:
          s.erase(pos, 1 + g() % 8);
          break;
        case 3:
          s.resize(pos);
          break;
      }
    }
    try {
      Qwen3Config c = parse_qwen3_config(s, "mutant.json");
      c.validate();
      ++ok;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      FAIL() << "non-lockstep exception " << e.what() << " for:\n" << s;
    }
  }
  EXPECT_GT(errors, 1000);
  std::printf("[lockstep] config mutants: %d parsed, %d rejected with lockstep::Error\n", ok,
              errors);
}

}  // namespace
}  // namespace lockstep::engine
