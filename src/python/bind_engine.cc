// lockstep._C.Engine: the rollout engine (engine/rollout.h) and the training forward
// (engine/trainer.h, as `lockstep score` runs it) over one Qwen3 model on the invariant CPU
// backend, for python/lockstep/engine.py. The engine keeps the current weights as host bf16 views
// (its own tensors, or the checkpoint's mapping); update_weights checks and converts the new ones,
// builds a new Model from them and swaps it in only when everything succeeded, so a failed update
// leaves the old weights. generate / score run without the GIL on a snapshot of the model.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "engine/backend.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/rollout.h"
#include "engine/safetensors.h"
#include "engine/train.h"
#include "engine/trainer.h"
#ifdef LOCKSTEP_PYTHON_CUDA
#include "engine/cuda/backends.h"
#endif
#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "python/bindings.h"
#include "python/tensor_args.h"

namespace lockstep::python {

namespace {

using engine::Model;
using engine::Qwen3Config;

constexpr const char* kGenerate = "Engine.generate";
constexpr const char* kScore = "Engine.score";
constexpr const char* kUpdate = "Engine.update_weights";
constexpr const char* kEngine = "Engine";
constexpr const char* kGradients = "Engine.gradients";

// A 1-D numpy array owning `v`.
template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T> v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

// A numpy f32 array owning a copy of a host f32 tensor (its shape).
nb::ndarray<nb::numpy, float> f32_numpy(const TensorView& v) {
  auto* t = new Tensor(DType::kF32, std::vector<int64_t>(v.shape, v.shape + v.ndim));
  std::memcpy(t->data(), v.data, size_t(t->nbytes()));
  nb::capsule owner(t, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t->shape().begin(), t->shape().end());
  return nb::ndarray<nb::numpy, float>(t->data(), shape.size(), shape.data(), owner);
}

// A token id of request / sequence `i` at position `j`, checked against the vocab.
int32_t token_id(const char* op, const char* what, size_t i, size_t j, int64_t id, int64_t vocab) {
  LS_CHECK(id >= 0 && id < vocab, op, what, " ", i, ": token ", j, " is ", id,
           ", outside the vocab [0, ", vocab, ")");
  return int32_t(id);
}

// A contiguous bf16 copy of a checked host weight (bf16 copied, f32 rounded RNE once).
Tensor bf16_copy(const TensorView& v) {
  std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
  Tensor t(DType::kBF16, shape);
  const int64_t C = v.ndim == 0 ? 1 : v.shape[v.ndim - 1];
  const int64_t R = C == 0 ? 0 : t.numel() / C;
  const int64_t rs = v.ndim == 2 ? v.stride[0] : C;
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      bf16* d = t.ptr<bf16>() + r * C;
      if (v.dtype == DType::kBF16) {
        std::memcpy(d, v.ptr<const bf16>() + r * rs, size_t(C) * sizeof(bf16));
      } else {
        const float* s = v.ptr<const float>() + r * rs;
        for (int64_t c = 0; c < C; ++c) d[c] = f32_to_bf16(s[c]);
      }
    }
  });
  return t;
}

// Throws when a checked host weight holds a NaN or an Inf (or an f32 value that rounds to Inf),
// naming the first such element.
void check_finite(const std::string& name, const TensorView& v) {
  const int64_t C = v.ndim == 0 ? 1 : v.shape[v.ndim - 1];
  const int64_t R = C == 0 ? 0 : v.numel() / C;
  const int64_t rs = v.ndim == 2 ? v.stride[0] : C;
  const auto bits_at = [&](int64_t r, int64_t c) {  // the element's bf16 (rounded) bits
    return v.dtype == DType::kBF16 ? v.ptr<const bf16>()[r * rs + c].bits
                                   : f32_to_bf16(v.ptr<const float>()[r * rs + c]).bits;
  };
  const auto value_at = [&](int64_t r, int64_t c) {
    return v.dtype == DType::kBF16 ? bf16_to_f32(v.ptr<const bf16>()[r * rs + c])
                                   : v.ptr<const float>()[r * rs + c];
  };
  std::vector<uint8_t> bad_row(size_t(R), 0);
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < C && !bad_row[size_t(r)]; ++c)
        bad_row[size_t(r)] = (bits_at(r, c) & 0x7f80u) == 0x7f80u;
  });
  for (int64_t r = 0; r < R; ++r) {
    if (!bad_row[size_t(r)]) continue;
    for (int64_t c = 0; c < C; ++c)
      LS_CHECK((bits_at(r, c) & 0x7f80u) != 0x7f80u, kUpdate, "weight ", name, " holds ",
               value_at(r, c), " at element ", r * C + c,
               ", not finite in bf16: weights must be finite");
  }
}

class Engine {
 public:
  // The built-in default model (engine/default_model.h), generated in memory.
  static std::unique_ptr<Engine> default_model(const ContractConfig& contract, int tp,
                                               const std::string& device) {
    std::unique_ptr<Engine> e(new Engine(engine::default_model_config(), contract, tp, device));
    engine::Weights w = engine::random_qwen3_weights(e->cfg_, engine::kDefaultModelSeed);
    for (auto& [name, t] : w) {
      e->views_[name] = t.view();
      e->owned_[name] = std::move(t);
    }
    e->model_ = std::make_shared<const Model>(e->cfg_, e->views_, e->opt_, e->backend());
    return e;
  }

  // A checkpoint directory (config.json + safetensors), checked as `lockstep score` loads it.
  static std::unique_ptr<Engine> from_dir(const std::string& dir, const ContractConfig& contract,
                                          int tp, const std::string& device) {
    engine::Checkpoint ckpt = engine::Checkpoint::load(dir);
    std::unique_ptr<Engine> e(new Engine(ckpt.config(), contract, tp, device));
    for (const engine::WeightSpec& spec : engine::qwen3_weight_specs(e->cfg_)) {
      if (ckpt.info(spec.name).dtype == "BF16") {
        e->views_[spec.name] = ckpt.get(spec.name, DType::kBF16, spec.shape);
      } else {
        Tensor t = ckpt.get_converted(spec.name, DType::kBF16, spec.shape);
        e->views_[spec.name] = t.view();
        e->owned_[spec.name] = std::move(t);
      }
    }
    e->model_ = std::make_shared<const Model>(e->cfg_, ckpt, e->opt_, e->backend());
    e->ckpt_.emplace(std::move(ckpt));
    return e;
  }

  // Named weights (HF names) for a config (config.json text; empty: the default model's config).
  static std::unique_ptr<Engine> from_weights(const nb::dict& weights,
                                              const std::string& config_json,
                                              const ContractConfig& contract, int tp,
                                              const std::string& device) {
    const Qwen3Config cfg = config_json.empty()
                                ? engine::default_model_config()
                                : engine::parse_qwen3_config(config_json, "Engine(config=...)");
    std::unique_ptr<Engine> e(new Engine(cfg, contract, tp, device));
    e->install(weights, /*partial=*/false, std::nullopt);
    e->version_ = 0;
    return e;
  }

  const Qwen3Config& config() const { return cfg_; }
  int64_t weight_version() const {
    std::lock_guard<std::mutex> lock(mu_);
    return version_;
  }
  int tp() const { return opt_.tp; }
  std::string options() const { return opt_.to_string() + "; " + rollout_.to_string(); }

  void set_rollout(int64_t page_size, int64_t num_pages, int64_t max_running,
                   int64_t max_batched_tokens, bool prefix_sharing, int kv_splits, bool cascade) {
    engine::RolloutConfig r;
    r.kv.page_size = page_size;
    r.kv.num_pages = num_pages;
    r.scheduler.max_running = max_running;
    r.scheduler.max_batched_tokens = max_batched_tokens;
    r.scheduler.prefix_sharing = prefix_sharing;
    r.step.kv_splits = kv_splits;
    r.step.cascade = cascade;
    r.validate();
    rollout_ = r;
  }

  // Per request: tokens (i32), logp, lse, entropy (f32), finish ("stop" | "length").
  nb::list generate(const std::vector<std::vector<int64_t>>& prompts,
                    const std::vector<int64_t>& request_ids, const std::vector<uint64_t>& seeds,
                    const std::vector<double>& temperatures, const std::vector<int64_t>& top_ks,
                    const std::vector<double>& top_ps, const std::vector<double>& min_ps,
                    const std::vector<int64_t>& max_new_tokens,
                    const std::vector<int>& stop_on_eos) {
    const size_t n = prompts.size();
    LS_CHECK(n > 0, kGenerate, "no prompts");
    for (size_t len : {request_ids.size(), seeds.size(), temperatures.size(), top_ks.size(),
                       top_ps.size(), min_ps.size(), max_new_tokens.size(), stop_on_eos.size()})
      LS_CHECK(len == n, kGenerate, "per-request settings for ", len, " requests, ", n, " prompts");
    std::vector<engine::RolloutRequest> reqs(n);
    std::map<std::vector<int32_t>, int64_t> groups;  // equal prompts share their prefix
    for (size_t i = 0; i < n; ++i) {
      engine::RolloutRequest& r = reqs[i];
      r.id = request_ids[i];
      LS_CHECK(!prompts[i].empty(), kGenerate, "request ", i, ": the prompt is empty");
      for (size_t j = 0; j < prompts[i].size(); ++j)
        r.prompt.push_back(token_id(kGenerate, "request", i, j, prompts[i][j], cfg_.vocab_size));
      r.sampling.seed = seeds[i];
      r.sampling.temperature = float(temperatures[i]);
      r.sampling.top_k = top_ks[i];
      r.sampling.top_p = float(top_ps[i]);
      r.sampling.min_p = float(min_ps[i]);
      LS_CHECK(max_new_tokens[i] >= 1, kGenerate, "request ", i, ": max_new_tokens is ",
               max_new_tokens[i], ", must be >= 1");
      r.max_new_tokens = max_new_tokens[i];
      r.stop_on_eos = stop_on_eos[i] != 0;
      r.group = groups.emplace(r.prompt, int64_t(groups.size())).first->second;
    }
    // A group of one shares nothing.
    std::map<int64_t, int> members;
    for (const auto& r : reqs) ++members[r.group];
    for (auto& r : reqs)
      if (members[r.group] == 1) r.group = -1;

    const std::shared_ptr<const Model> model = current_model();
    engine::RolloutResult res;
    released([&] { res = engine::run_rollout(*model, reqs, rollout_); });

    nb::list out;
    for (engine::Completion& c : res.completions) {
      const char* finish = c.finish == engine::FinishReason::kStop ? "stop" : "length";
      out.append(nb::make_tuple(to_numpy(std::move(c.tokens)), to_numpy(std::move(c.logp)),
                                to_numpy(std::move(c.lse)), to_numpy(std::move(c.entropy)),
                                finish));
    }
    return out;
  }

  // Per sequence: logp, lse, entropy (f32) of tokens [prompt_len, len) by the packed training
  // forward at the sequence's temperature.
  nb::list score(const std::vector<std::vector<int64_t>>& sequences,
                 const std::vector<int64_t>& prompt_lens, const std::vector<double>& temperatures) {
    const size_t n = sequences.size();
    LS_CHECK(n > 0, kScore, "no sequences");
    LS_CHECK(prompt_lens.size() == n && temperatures.size() == n, kScore, n, " sequences, ",
             prompt_lens.size(), " prompt lengths, ", temperatures.size(), " temperatures");
    std::vector<engine::TrainSequence> seqs(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = int64_t(sequences[i].size()), p = prompt_lens[i];
      LS_CHECK(p >= 1 && p < len, kScore, "sequence ", i, ": prompt length ", p, " with ", len,
               " tokens (needs 1 <= prompt length < tokens: at least one scored token)");
      std::vector<int32_t> ids;
      for (size_t j = 0; j < size_t(len); ++j)
        ids.push_back(token_id(kScore, "sequence", i, j, sequences[i][j], cfg_.vocab_size));
      seqs[i].id = int64_t(i);
      seqs[i].prompt.assign(ids.begin(), ids.begin() + p);
      seqs[i].completion.assign(ids.begin() + p, ids.end());
      seqs[i].temperature = float(temperatures[i]);
    }
    engine::PackingConfig pc;
    pc.micro_batch_tokens = 4096;  // packing never changes a bit
    const std::shared_ptr<const Model> model = current_model();
    engine::TrainResult res;
    released([&] { res = engine::run_training_forward(*model, seqs, pc); });
    nb::list out;
    for (engine::TrainTokens& t : res.sequences)
      out.append(nb::make_tuple(to_numpy(std::move(t.logp)), to_numpy(std::move(t.lse)),
                                to_numpy(std::move(t.entropy))));
    return out;
  }

  // The C++ model backward (engine::Backprop, docs/contract.md §B.10) over micro-batches, for
  // tests and for checking a trainer: micro_batches[m] lists the sequences (indices into
  // `sequences`) packed in micro-batch m, in that order; the step index of sequence i is i (B.1),
  // so the micro-batches must come in step order (else lockstep.Error). Per token: targets in
  // [0, V) or -1 (no target), g_lp and g_ent (empty: no entropy gradient) the upstream gradients
  // of the log-prob head at `temperature`. Returns (grads: HF name -> f32 array, after
  // Gradients::finish, per sequence logp and entropy).
  nb::tuple gradients(const std::vector<std::vector<int64_t>>& sequences,
                      const std::vector<std::vector<int64_t>>& targets,
                      const std::vector<std::vector<float>>& g_lp,
                      const std::vector<std::vector<float>>& g_ent,
                      const std::vector<std::vector<int64_t>>& micro_batches, double temperature) {
    const size_t n = sequences.size();
    LS_CHECK(n > 0, kGradients, "no sequences");
    LS_CHECK(backend_->device() == Device::kCPU, kGradients,
             "the model backward runs on a CPU engine only (device='cpu')");
    LS_CHECK(targets.size() == n && g_lp.size() == n && (g_ent.empty() || g_ent.size() == n),
             kGradients, n, " sequences, ", targets.size(), " target lists, ", g_lp.size(),
             " g_lp lists, ", g_ent.size(), " g_ent lists (0: no entropy gradient)");
    std::vector<std::vector<int32_t>> ids(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t len = sequences[i].size();
      LS_CHECK(targets[i].size() == len && g_lp[i].size() == len &&
                   (g_ent.empty() || g_ent[i].size() == len),
               kGradients, "sequence ", i, " has ", len,
               " tokens: targets, g_lp and g_ent need one entry per token");
      for (size_t j = 0; j < len; ++j) {
        ids[i].push_back(token_id(kGradients, "sequence", i, j, sequences[i][j], cfg_.vocab_size));
        LS_CHECK(targets[i][j] == -1 || (targets[i][j] >= 0 && targets[i][j] < cfg_.vocab_size),
                 kGradients, "sequence ", i, ": target ", j, " is ", targets[i][j],
                 ", neither -1 nor in the vocab [0, ", cfg_.vocab_size, ")");
      }
    }
    for (const auto& mb : micro_batches)
      for (int64_t i : mb)
        LS_CHECK(i >= 0 && size_t(i) < n, kGradients, "micro-batch sequence index ", i,
                 " is outside [0, ", n, ")");
    LogprobParams params;
    params.temperature = float(temperature);
    params.ignore_index = -1;
    std::unique_ptr<engine::Gradients> grads;
    std::vector<std::vector<float>> logp(n), ent(n);
    released([&] {
      std::lock_guard<std::mutex> lock(mu_);
      // A model of its own: the backward's forward sets a trace on it.
      Model model(cfg_, views_, opt_, backend_);
      const engine::Backprop bp(cfg_, views_, opt_, *backend_);
      grads = std::make_unique<engine::Gradients>(cfg_);
      for (const auto& mb : micro_batches) {
        int64_t T = 0;
        for (int64_t i : mb) T += int64_t(ids[size_t(i)].size());
        const int64_t B = int64_t(mb.size());
        Tensor tok(DType::kI32, {T}), cu(DType::kI32, {B + 1}), tg(DType::kI32, {T});
        Tensor glp(DType::kF32, {T}), gent(DType::kF32, {T});
        Tensor lp(DType::kF32, {T}), lse(DType::kF32, {T}), en(DType::kF32, {T});
        std::vector<int64_t> steps;
        int64_t r = 0;
        cu.ptr<int32_t>()[0] = 0;
        for (int64_t b = 0; b < B; ++b) {
          const size_t i = size_t(mb[size_t(b)]);
          for (size_t j = 0; j < ids[i].size(); ++j, ++r) {
            tok.ptr<int32_t>()[r] = ids[i][j];
            tg.ptr<int32_t>()[r] = int32_t(targets[i][j]);
            glp.ptr<float>()[r] = g_lp[i][j];
            gent.ptr<float>()[r] = g_ent.empty() ? 0.0f : g_ent[i][j];
          }
          cu.ptr<int32_t>()[b + 1] = int32_t(r);
          steps.push_back(int64_t(i));
        }
        const engine::SavedForward f = bp.forward(model, tok.view(), cu.view());
        model.logprob(f.hidden.view(), tg.view(), params.temperature, lp.view(), lse.view(),
                      en.view());
        const TensorView gent_v = gent.view();
        bp.backward(f, tg.view(), params, lse.view(), en.view(), glp.view(),
                    g_ent.empty() ? nullptr : &gent_v, steps, *grads);
        r = 0;
        for (int64_t b = 0; b < B; ++b) {
          const size_t i = size_t(mb[size_t(b)]);
          const int64_t len = int64_t(ids[i].size());
          logp[i].assign(lp.ptr<float>() + r, lp.ptr<float>() + r + len);
          ent[i].assign(en.ptr<float>() + r, en.ptr<float>() + r + len);
          r += len;
        }
      }
      grads->finish();
    });
    nb::dict d;
    for (const auto& [name, t] : grads->all()) d[name.c_str()] = f32_numpy(t.view());
    nb::list lps, ens;
    for (size_t i = 0; i < n; ++i) {
      lps.append(to_numpy(std::move(logp[i])));
      ens.append(to_numpy(std::move(ent[i])));
    }
    return nb::make_tuple(d, lps, ens);
  }

  // Replaces the named weights (all of them unless `partial`); the version becomes `version`
  // (> the current one) or the current one + 1.
  int64_t update_weights(const nb::dict& weights, bool partial, std::optional<int64_t> version) {
    install(weights, partial, version);
    return weight_version();
  }

  // Copies of the current weights (bf16, HF names) as DLPack arrays.
  nb::dict weights() const {
    std::lock_guard<std::mutex> lock(mu_);
    nb::dict d;
    for (const auto& [name, v] : views_) {
      auto* t = new Tensor(bf16_copy(v));
      nb::capsule owner(t, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
      std::vector<size_t> shape(t->shape().begin(), t->shape().end());
      const nb::dlpack::dtype bf16_dtype{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
      d[name.c_str()] =
          nb::ndarray<>(t->data(), shape.size(), shape.data(), owner, nullptr, bf16_dtype);
    }
    return d;
  }

 private:
  Engine(const Qwen3Config& cfg, const ContractConfig& contract, int tp, const std::string& device)
      : cfg_(cfg) {
    LS_CHECK(device == "cpu" || device == "cuda", kEngine, "device '", device,
             "': expected 'cpu' or 'cuda'");
#ifdef LOCKSTEP_PYTHON_CUDA
    if (device == "cuda") backend_ = engine::make_cuda_invariant_backend();
#else
    LS_CHECK(device == "cpu", kEngine,
             "device 'cuda' needs a CUDA build of the module (pip install . -C "
             "cmake.define.LOCKSTEP_CUDA=ON); this one runs on the CPU only");
#endif
    if (!backend_) backend_ = engine::make_invariant_backend();
    contract.validate();
    LS_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, kEngine, "tp is ", tp,
             ", must be 1, 2, 4 or 8");
    opt_.contract = contract;
    opt_.tp = tp;
  }

  // Checks `weights` (name -> DLPack host array, bf16 or f32, the config's shapes, finite),
  // converts them to bf16, builds a model over them and the kept ones, then commits.
  void install(const nb::dict& weights, bool partial, std::optional<int64_t> version) {
    const std::vector<engine::WeightSpec> specs = engine::qwen3_weight_specs(cfg_);
    std::map<std::string, TensorView> given;
    std::map<std::string, Array> arrays;  // keep the caller's arrays alive while we read them
    for (auto [key, value] : weights) {
      LS_CHECK(nb::isinstance<nb::str>(key), kUpdate, "weight names must be strings, got ",
               Py_TYPE(key.ptr())->tp_name);
      const std::string name = nb::cast<std::string>(key);
      Array a;
      LS_CHECK(nb::try_cast<Array>(value, a), kUpdate, "weight ", name,
               " is not an array (a numpy array or a CPU torch tensor), got ",
               Py_TYPE(value.ptr())->tp_name);
      given[name] = view_of(kUpdate, name.c_str(), a);
      arrays[name] = a;
    }
    // A tied model's state_dict (transformers) also names lm_head.weight: the same tensor.
    if (cfg_.tie_word_embeddings && given.count("lm_head.weight")) {
      const TensorView lm = given.at("lm_head.weight");
      auto emb = given.find("model.embed_tokens.weight");
      LS_CHECK(emb != given.end() && (emb->second.data == lm.data ||
                                      (same_shape(lm, emb->second) && same_bits(lm, emb->second))),
               kUpdate,
               "weight lm_head.weight: this config ties the embeddings (tie_word_embeddings), so "
               "lm_head.weight must be model.embed_tokens.weight itself (or equal to it), given "
               "with it");
      given.erase("lm_head.weight");
    }
    // The checks, the conversion and the new model run without the GIL (the caller's arrays are
    // kept alive above), under the engine's lock.
    released([&] {
      std::lock_guard<std::mutex> lock(mu_);
      install_views(specs, given, partial, version);
    });
  }

  void install_views(const std::vector<engine::WeightSpec>& specs,
                     const std::map<std::string, TensorView>& given, bool partial,
                     std::optional<int64_t> version) {
    LS_CHECK(!version || *version > version_, kUpdate, "version ", version.value_or(0),
             " is not above the current weight version ", version_);
    std::map<std::string, const engine::WeightSpec*> by_name;
    for (const engine::WeightSpec& s : specs) by_name[s.name] = &s;
    for (const auto& [name, v] : given) {
      auto it = by_name.find(name);
      LS_CHECK(it != by_name.end(), kUpdate, "weight ", name,
               " is not part of this Qwen3 model (names as in a Hugging Face Qwen3ForCausalLM, "
               "e.g. model.layers.0.self_attn.q_proj.weight)");
      const std::vector<int64_t>& shape = it->second->shape;
      std::vector<int64_t> got(v.shape, v.shape + v.ndim);
      LS_CHECK(got == shape, kUpdate, "weight ", name, " has shape ", v.shape_string(),
               ", the model's config expects ",
               TensorView::contiguous(nullptr, v.dtype, shape).shape_string());
      LS_CHECK(v.dtype == DType::kBF16 || v.dtype == DType::kF32, kUpdate, "weight ", name,
               " has dtype ", dtype_name(v.dtype), ": expected bf16 or f32");
      LS_CHECK(v.device == Device::kCPU, kUpdate, "weight ", name, " is on ", device_name(v.device),
               ": expected a CPU array");
      LS_CHECK(v.inner_contiguous(), kUpdate, "weight ", name, " (", v.describe(),
               ") has a strided last dimension: pass a contiguous array");
      check_finite(name, v);
    }
    if (!partial) {
      for (const engine::WeightSpec& s : specs)
        LS_CHECK(given.count(s.name), kUpdate, "missing weight ", s.name,
                 " (pass every weight of the model, or partial=True)");
    }
    std::map<std::string, Tensor> fresh;
    for (const auto& [name, v] : given) fresh[name] = bf16_copy(v);
    std::map<std::string, TensorView> views = views_;
    for (const auto& [name, t] : fresh) views[name] = t.view();
    auto model = std::make_shared<const Model>(cfg_, views, opt_, backend());
    // Commit: nothing below throws.
    for (auto& [name, t] : fresh) owned_[name] = std::move(t);
    views_ = std::move(views);
    model_ = std::move(model);
    version_ = version ? *version : version_ + 1;
  }

  std::shared_ptr<const Model> current_model() const {
    std::lock_guard<std::mutex> lock(mu_);
    return model_;
  }

  // The invariant backend of the engine's device, made once and shared by its models.
  std::shared_ptr<engine::OpsBackend> backend() const { return backend_; }

  static bool same_shape(const TensorView& a, const TensorView& b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; ++i)
      if (a.shape[i] != b.shape[i]) return false;
    return true;
  }
  static bool same_bits(const TensorView& a, const TensorView& b) {
    if (a.dtype != b.dtype || !a.inner_contiguous() || !b.inner_contiguous() || a.ndim != 2)
      return false;
    const size_t row = size_t(a.shape[1]) * dtype_size(a.dtype);
    for (int64_t r = 0; r < a.shape[0]; ++r) {
      const char* pa = static_cast<const char*>(a.data) + r * a.stride[0] * dtype_size(a.dtype);
      const char* pb = static_cast<const char*>(b.data) + r * b.stride[0] * dtype_size(b.dtype);
      if (std::memcmp(pa, pb, row) != 0) return false;
    }
    return true;
  }

  Qwen3Config cfg_;
  engine::ModelOptions opt_;
  engine::RolloutConfig rollout_;
  std::optional<engine::Checkpoint> ckpt_;   // the mapping some views_ point into
  std::map<std::string, Tensor> owned_;      // the weights this engine copied
  std::map<std::string, TensorView> views_;  // every current weight (host bf16)
  std::shared_ptr<const Model> model_;
  int64_t version_ = 0;
  // Guards views_, owned_, model_ and version_: update_weights changes them without the GIL.
  mutable std::mutex mu_;
  // Where the model's weights, activations and KV pages live (the invariant ops of the device).
  std::shared_ptr<engine::OpsBackend> backend_;
};

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<Engine>(m, "Engine",
                     "The rollout engine and the training forward over one Qwen3 model (CPU).")
      .def_static("default_model", &Engine::default_model, nb::arg("contract"), nb::arg("tp"),
                  nb::arg("device"))
      .def_static("from_dir", &Engine::from_dir, nb::arg("dir"), nb::arg("contract"), nb::arg("tp"),
                  nb::arg("device"))
      .def_static("from_weights", &Engine::from_weights, nb::arg("weights"), nb::arg("config_json"),
                  nb::arg("contract"), nb::arg("tp"), nb::arg("device"))
      .def("set_rollout", &Engine::set_rollout, nb::arg("page_size"), nb::arg("num_pages"),
           nb::arg("max_running"), nb::arg("max_batched_tokens"), nb::arg("prefix_sharing"),
           nb::arg("kv_splits"), nb::arg("cascade"))
      .def("generate", &Engine::generate, nb::arg("prompts"), nb::arg("request_ids"),
           nb::arg("seeds"), nb::arg("temperatures"), nb::arg("top_ks"), nb::arg("top_ps"),
           nb::arg("min_ps"), nb::arg("max_new_tokens"), nb::arg("stop_on_eos"))
      .def("score", &Engine::score, nb::arg("sequences"), nb::arg("prompt_lens"),
           nb::arg("temperatures"))
      .def("gradients", &Engine::gradients, nb::arg("sequences"), nb::arg("targets"),
           nb::arg("g_lp"), nb::arg("g_ent"), nb::arg("micro_batches"), nb::arg("temperature"))
      .def("update_weights", &Engine::update_weights, nb::arg("weights"), nb::arg("partial"),
           nb::arg("version").none())
      .def("weights", &Engine::weights)
      .def("config_json", [](const Engine& e) { return e.config().to_json(); })
      .def_prop_ro("weight_version", &Engine::weight_version)
      .def_prop_ro("tp", &Engine::tp)
      .def("options", &Engine::options);
}

}  // namespace lockstep::python
