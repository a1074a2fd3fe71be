// Default-model generation. Bits depend only on (config, seed, name): Philox integer words, an
// exact integer Irwin-Hall sum, one IEEE double multiply (and add), double->float->bf16 RNE. No
// std::*_distribution (their algorithms differ between standard libraries), no libm.
#include "engine/default_model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "engine/sha256.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

namespace fs = std::filesystem;

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 0x811c9dc5u;
  for (unsigned char c : s) h = (h ^ c) * 0x01000193u;
  return h;
}

// Standard deviation of a weight (0 marks a norm weight, drawn around 1). Projections reading a
// normalized input of RMS ~1 use 1/sqrt(fan_in) so their outputs are O(1); the embedding's
// 0.2·sqrt(128 / H) (exactly 0.2 for the built-in model's H = 128) makes tied logits (final-normed
// h · E) have a spread of about 0.2·sqrt(128) ≈ 2.3 at every H: peaked enough that sampling
// settings matter, flat enough that samples vary. (Until 2026-12-02 it was 0.2 at every H: the
// 0.6B shape's logits then had a spread of ~6.4, its warm-up loss started at 28 and GRPO's
// sampled distributions collapsed to one token within two steps.)
double weight_std(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return 0.0;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return 0.2 * std::sqrt(128.0 / double(shape[1]));  // shape [V, H]
  return 1.0 / std::sqrt(double(shape[1]));            // fan_in = in_features
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%016llx", (unsigned long long)v);
  return buf;
}

}  // namespace

Qwen3Config default_model_config() {
  Qwen3Config c;
  c.vocab_size = 2048;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = true;
  c.torch_dtype = "bfloat16";
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  c.validate();
  return c;
}

Weights random_qwen3_weights(const Qwen3Config& cfg, uint64_t seed) {
  return random_qwen3_weights(cfg, seed, nullptr);
}

Weights random_qwen3_weights(const Qwen3Config& cfg, uint64_t seed,
                             const std::function<void(int64_t, int64_t)>& progress) {
  const uint32_t key0 = uint32_t(seed), key1 = uint32_t(seed >> 32);
  const int64_t total = qwen3_num_parameters(cfg);
  int64_t done = 0;
  Weights out;
  for (const WeightSpec& w : qwen3_weight_specs(cfg)) {
    Tensor t(DType::kBF16, w.shape);
    bf16* p = t.ptr<bf16>();
    const uint32_t name_key = fnv1a32(w.name);
    const double std = weight_std(w.name, w.shape);
    const bool norm = std == 0.0;
    // z = (sum of four (k + 1/2)/2^24 uniforms - 2)·sqrt(3) = s·sqrt(3)/2^25 with the integer
    // s = sum(2k + 1) - 2^26; the constant folds the scale in so only one multiply rounds.
    const double c = (norm ? 0.05 : std) * std::sqrt(3.0) * 0x1p-25;
    // Each element depends only on (seed, name, j): any split over threads gives the same bytes.
    parallel_for(t.numel(), int64_t(1) << 16, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        Philox4 r = philox4x32_10(Philox4{{uint32_t(j), uint32_t(uint64_t(j) >> 32), name_key, 0}},
                                  key0, key1);
        int64_t s = -(int64_t(1) << 26);
        for (uint32_t word : r.v) s += 2 * int64_t(word >> 8) + 1;
        double v = double(s) * c;
        if (norm) v = 1.0 + v;
        p[j] = f32_to_bf16(float(v));
      }
    });
    done += t.numel();
    if (progress) progress(done, total);
    out.emplace_back(w.name, std::move(t));
  }
  return out;
}

Qwen3Config qwen3_shape_config(const std::string& shape) {
  if (shape == "default") return default_model_config();
  Qwen3Config c;
  c.vocab_size = 151936;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.torch_dtype = "bfloat16";
  c.bos_token_ids = {151643};
  c.eos_token_ids = {151645};
  if (shape == "qwen3-0.6b") {
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.tie_word_embeddings = true;
  } else if (shape == "qwen3-8b") {
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_hidden_layers = 36;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.tie_word_embeddings = false;
  } else {
    throw Error("model shape '" + shape + "' is not one of default, qwen3-0.6b, qwen3-8b");
  }
  c.validate();
  return c;
}

ModelFileBytes serialize_qwen3_model(const Qwen3Config& cfg, const Weights& weights,
                                     const std::map<std::string, std::string>& metadata) {
  const char* op = "serialize_qwen3_model";
  std::vector<WeightSpec> specs = qwen3_weight_specs(cfg);
  LS_CHECK(weights.size() == specs.size(), op, "expected ", specs.size(), " weights for ",
           cfg.to_string(), ", got ", weights.size());
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, t] = weights[i];
    LS_CHECK(name == specs[i].name, op, "weight ", i, " is '", name, "', expected '", specs[i].name,
             "'");
    LS_CHECK(t.shape() == specs[i].shape, op, "weight '", name, "' has shape ",
             t.view().shape_string(), ", expected ",
             TensorView::contiguous(nullptr, t.dtype(), specs[i].shape).shape_string());
    LS_CHECK(t.dtype() == DType::kBF16 || t.dtype() == DType::kF32, op, "weight '", name,
             "' must be bf16 or f32, got ", dtype_name(t.dtype()));
    named.push_back({name, t.view()});
  }
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";  // transformers refuses safetensors files without it
  ModelFileBytes files;
  files.config_json = cfg.to_json();
  files.safetensors = serialize_safetensors(named, meta);
  return files;
}

namespace {

// Writes both files into a fresh sibling directory and renames it to `dir`, so `dir` either does
// not exist or holds the complete model (an interrupted or failed write leaves no `dir`). Returns
// false, having removed its own temporary directory, if another writer created `dir` first.
bool create_model_dir(const std::string& dir, const ModelFileBytes& files,
                      const std::string& what) {
  static std::atomic<uint64_t> counter{0};
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "models/default/"
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    throw Error(what + ": cannot create the parent directory " + parent.string() + ": " +
                ec.message());
  const std::string tmp = detail::concat(target.string(), ".tmp.", ::getpid(), ".", counter++);
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    const int err = errno;
    throw Error(what + ": cannot create " + tmp + ": " + std::strerror(err));
  }
  try {
    write_file_atomic((fs::path(tmp) / "model.safetensors").string(), files.safetensors.data(),
                      files.safetensors.size());
    write_file_atomic((fs::path(tmp) / "config.json").string(), files.config_json.data(),
                      files.config_json.size());
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int err = errno;
      if (err != EEXIST && err != ENOTEMPTY)
        throw Error(what + ": cannot rename " + tmp + " to " + target.string() + ": " +
                    std::strerror(err));
      fs::remove_all(tmp, ec);
      return false;
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fsync_directory(parent.string(), what);
  return true;
}

}  // namespace

void write_model_files(const std::string& dir, const ModelFileBytes& files) {
  const std::string what = "write model " + dir;
  if (!stat_path(dir, what)) {
    if (create_model_dir(dir, files, what)) return;
  }
  require_directory(dir, what);
  // Into an existing directory: weights first, so a directory with config.json is complete.
  write_file_atomic((fs::path(dir) / "model.safetensors").string(), files.safetensors.data(),
                    files.safetensors.size());
  write_file_atomic((fs::path(dir) / "config.json").string(), files.config_json.data(),
                    files.config_json.size());
}

ModelFileBytes default_model_files() {
  Qwen3Config cfg = default_model_config();
  return serialize_qwen3_model(cfg, random_qwen3_weights(cfg, kDefaultModelSeed),
                               {{"lockstep_default_model", kDefaultModelVersion},
                                {"lockstep_seed", hex64(kDefaultModelSeed)}});
}

std::string ensure_default_model(const std::string& dir) {
  const std::string what = "default model " + dir;
  ModelFileBytes files = default_model_files();
  // Absent: created complete in one rename (a concurrent creator may win; then it is verified).
  if (!stat_path(dir, what) && create_model_dir(dir, files, what)) return dir;
  require_directory(dir, what);
  struct File {
    const char* name;
    const void* data;
    size_t size;
  };
  // Weights first (see write_model_files).
  const File list[] = {{"model.safetensors", files.safetensors.data(), files.safetensors.size()},
                       {"config.json", files.config_json.data(), files.config_json.size()}};
  for (const File& f : list) {
    const std::string path = (fs::path(dir) / f.name).string();
    std::optional<struct stat> st = stat_path(path, what);
    if (!st) {
      write_file_atomic(path, f.data, f.size);
      continue;
    }
    if (!S_ISREG(st->st_mode))
      throw Error(what + ": " + path + " is " + file_kind(st->st_mode) +
                  ", not a regular file; delete " + dir + " to regenerate it");
    const uint64_t size = uint64_t(st->st_size);
    if (size != f.size)
      throw Error(detail::concat(what, ": ", f.name, " is ", size, " bytes, the built-in default ",
                                 "model's is ", f.size, "; delete ", dir, " to regenerate it"));
    const std::string have = read_small_file(path, f.size, what);
    if (std::memcmp(have.data(), f.data, f.size) != 0)
      throw Error(what + ": " + f.name + " differs from the built-in default model (sha256 " +
                  sha256_hex(have.data(), have.size()) + ", expected " +
                  sha256_hex(f.data, f.size) + "); delete " + dir + " to regenerate it");
  }
  return dir;
}

std::string model_cache_root() {
  // XDG base directory spec: a relative XDG_CACHE_HOME is invalid and ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/lockstep";
  if (home && home[0] == '/') return std::string(home) + "/.cache/lockstep";
  throw Error(
      "default model: neither XDG_CACHE_HOME nor HOME is an absolute path, so there is no cache "
      "directory for the built-in model; give one (lockstep --model-cache DIR) or a model "
      "directory");
}

std::string default_model_dir(const std::string& cache_root) {
  return cache_root + "/default-v" + kDefaultModelVersion;
}

std::string default_model_cache_dir() { return default_model_dir(model_cache_root()); }

}  // namespace lockstep::engine
