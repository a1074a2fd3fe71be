// One training step over GRPO groups (engine/train.h, docs/contract.md §B.11) in both forms:
// shared prompts (pack_prompt_groups, forward_shared, backward_shared) and unshared (each
// completion packed with its own copy of the prompt, forward, backward), with the same per-token
// upstream gradients on the completion tokens. Used by test_train_shared and test_train_oracle.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/train.h"

namespace lockstep::engine::test_shared {

// The step's groups and, per (group, completion), the upstream gradients of each completion
// token's log-prob and entropy.
struct GroupStep {
  std::vector<PromptGroup> groups;
  std::vector<std::vector<std::vector<float>>> g_lp, g_ent;  // [group][completion][token]
};

// Groups of the given prompt and completion lengths, random tokens and gradients.
inline GroupStep make_group_step(const Qwen3Config& cfg,
                                 const std::vector<std::pair<int, std::vector<int>>>& shape,
                                 std::mt19937_64& g, float grad_scale = 0.05f) {
  GroupStep st;
  std::uniform_int_distribution<int32_t> id(0, int32_t(cfg.vocab_size - 1));
  std::normal_distribution<float> nd(0.0f, grad_scale);
  auto tokens = [&](int n) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s) x = id(g);
    return s;
  };
  for (const auto& [P, C] : shape) {
    PromptGroup pg{tokens(P), {}};
    st.g_lp.emplace_back();
    st.g_ent.emplace_back();
    for (int c : C) {
      pg.completions.push_back(tokens(c));
      std::vector<float> a(static_cast<size_t>(c)), b(static_cast<size_t>(c));
      for (auto& x : a) x = nd(g);
      for (auto& x : b) x = nd(g);
      st.g_lp.back().push_back(a);
      st.g_ent.back().push_back(b);
    }
    st.groups.push_back(std::move(pg));
  }
  return st;
}

struct StepOut {
  Gradients grads;
  // [group][completion][token]: the trainer's logp / lse / entropy of each completion token.
  std::vector<std::vector<std::vector<float>>> logp, lse, ent;
  int64_t rows = 0;         // packed rows over the micro-batches
  int64_t saved_bytes = 0;  // the largest micro-batch's saved activations (SavedForward::bytes)
  // Seconds over the micro-batches (the backend synchronized at each phase's end): the forward
  // with saved activations, the log-prob head's forward, the backward.
  double forward_s = 0, head_s = 0, backward_s = 0;
};

// Adds the seconds since the previous lap (the backend's work included) to `acc`.
class PhaseClock {
 public:
  explicit PhaseClock(const OpsBackend& ops) : ops_(ops) {}
  void lap(double& acc) {
    ops_.synchronize();
    const auto now = std::chrono::steady_clock::now();
    acc += std::chrono::duration<double>(now - t_).count();
    t_ = now;
  }

 private:
  const OpsBackend& ops_;
  std::chrono::steady_clock::time_point t_ = std::chrono::steady_clock::now();
};

// The model and its backward over one backend (the CPU invariant backend unless given), built
// once for several steps (a device benchmark times the steps without the weights' upload).
struct StepModel {
  Qwen3Config cfg;
  Model model;
  Backprop bp;
  StepModel(const Qwen3Config& c, const std::map<std::string, TensorView>& w,
            const ModelOptions& opt, std::unique_ptr<OpsBackend> ops = make_invariant_backend())
      : cfg(c), model(c, w, opt, std::move(ops)), bp(c, w, opt, model.ops()) {}
};

// Zero gradients (host buffers on the CPU backend, else on the backend's device: they live as
// long as `m`) and per-token outputs sized like the step's completions.
inline StepOut empty_out(const StepModel& m, const GroupStep& st) {
  const OpsBackend& ops = m.model.ops();
  StepOut o{
      ops.device() == Device::kCPU ? Gradients(m.cfg) : Gradients(m.cfg, ops), {}, {}, {}, 0, 0};
  for (const PromptGroup& g : st.groups) {
    o.logp.emplace_back(g.completions.size());
    o.lse.emplace_back(g.completions.size());
    o.ent.emplace_back(g.completions.size());
  }
  return o;
}

// Shared form: micro-batches = lists of group indices (consecutive runs of the step's groups),
// each packed in the order given.
inline StepOut run_shared_step(StepModel& m, const GroupStep& st,
                               const std::vector<std::vector<size_t>>& micro_batches) {
  Model& model = m.model;
  const Backprop& bp = m.bp;
  StepOut o = empty_out(m, st);
  PhaseClock clock(model.ops());
  for (const auto& mb : micro_batches) {
    SharedPack pk = pack_prompt_groups(st.groups, mb);
    const int64_t T = int64_t(pk.tokens.size()), Th = int64_t(pk.targets.size());
    o.rows += T;
    const SavedForward f = bp.forward_shared(
        model, TensorView::contiguous(pk.tokens.data(), DType::kI32, {T}),
        TensorView::contiguous(pk.cu.data(), DType::kI32, {int64_t(pk.cu.size())}),
        TensorView::contiguous(pk.prompt_of.data(), DType::kI32, {int64_t(pk.prompt_of.size())}));
    o.saved_bytes = std::max(o.saved_bytes, f.bytes());
    clock.lap(o.forward_s);
    const Tensor hh = bp.head_hidden(f, pk.head);
    Tensor logp(DType::kF32, {Th}), lse(DType::kF32, {Th}), ent(DType::kF32, {Th});
    const TensorView tg = TensorView::contiguous(pk.targets.data(), DType::kI64, {Th});
    model.logprob(hh.view(), tg, 1.0f, logp.view(), lse.view(), ent.view());
    clock.lap(o.head_s);
    std::vector<float> g_lp(static_cast<size_t>(Th)), g_ent(static_cast<size_t>(Th));
    for (size_t i = 0; i < mb.size(); ++i) {
      const size_t k = mb[i];
      for (size_t c = 0; c < st.groups[k].completions.size(); ++c) {
        const int64_t h0 = pk.head_row0[i][c];
        const size_t n = st.groups[k].completions[c].size();
        for (size_t j = 0; j < n; ++j) {
          g_lp[size_t(h0) + j] = st.g_lp[k][c][j];
          g_ent[size_t(h0) + j] = st.g_ent[k][c][j];
        }
        o.logp[k][c].assign(logp.ptr<float>() + h0, logp.ptr<float>() + h0 + int64_t(n));
        o.lse[k][c].assign(lse.ptr<float>() + h0, lse.ptr<float>() + h0 + int64_t(n));
        o.ent[k][c].assign(ent.ptr<float>() + h0, ent.ptr<float>() + h0 + int64_t(n));
      }
    }
    const TensorView ge = TensorView::contiguous(g_ent.data(), DType::kF32, {Th});
    bp.backward_shared(f, pk.head, tg, LogprobParams{}, lse.view(), ent.view(),
                       TensorView::contiguous(g_lp.data(), DType::kF32, {Th}), &ge, pk.step_indices,
                       o.grads);
    clock.lap(o.backward_s);
  }
  o.grads.finish();
  return o;
}

// Unshared form: every (group, completion) one sequence prompt + completion, step index = its
// place in the step (groups in order, completions in order); micro-batches as above (whole
// groups).
inline StepOut run_unshared_step(StepModel& m, const GroupStep& st,
                                 const std::vector<std::vector<size_t>>& micro_batches) {
  Model& model = m.model;
  const Backprop& bp = m.bp;
  StepOut o = empty_out(m, st);
  PhaseClock clock(model.ops());
  std::vector<int64_t> first(st.groups.size() + 1, 0);
  for (size_t k = 0; k < st.groups.size(); ++k)
    first[k + 1] = first[k] + int64_t(st.groups[k].completions.size());
  for (const auto& mb : micro_batches) {
    std::vector<int32_t> tokens, cu = {0};
    std::vector<int64_t> targets, idx;
    std::vector<float> g_lp, g_ent;
    struct Where {
      size_t k, c;
      int64_t row;
    };
    std::vector<Where> where;
    for (size_t k : mb) {
      const PromptGroup& g = st.groups[k];
      for (size_t c = 0; c < g.completions.size(); ++c) {
        const int64_t P = int64_t(g.prompt.size());
        std::vector<int32_t> s = g.prompt;
        s.insert(s.end(), g.completions[c].begin(), g.completions[c].end());
        const int64_t row0 = int64_t(tokens.size());
        for (int64_t p = 0; p < int64_t(s.size()); ++p) {
          tokens.push_back(s[size_t(p)]);
          const bool t = p >= P - 1 && p + 1 < int64_t(s.size());
          targets.push_back(t ? s[size_t(p + 1)] : -1);
          g_lp.push_back(t ? st.g_lp[k][c][size_t(p - P + 1)] : 0.0f);
          g_ent.push_back(t ? st.g_ent[k][c][size_t(p - P + 1)] : 0.0f);
        }
        cu.push_back(int32_t(tokens.size()));
        idx.push_back(first[k] + int64_t(c));
        where.push_back({k, c, row0 + P - 1});
      }
    }
    const int64_t T = int64_t(tokens.size());
    o.rows += T;
    const SavedForward f =
        bp.forward(model, TensorView::contiguous(tokens.data(), DType::kI32, {T}),
                   TensorView::contiguous(cu.data(), DType::kI32, {int64_t(cu.size())}));
    o.saved_bytes = std::max(o.saved_bytes, f.bytes());
    clock.lap(o.forward_s);
    Tensor logp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
    const TensorView tg = TensorView::contiguous(targets.data(), DType::kI64, {T});
    model.logprob(f.hidden.view(), tg, 1.0f, logp.view(), lse.view(), ent.view());
    clock.lap(o.head_s);
    for (const Where& x : where) {
      const int64_t n = int64_t(st.groups[x.k].completions[x.c].size());
      o.logp[x.k][x.c].assign(logp.ptr<float>() + x.row, logp.ptr<float>() + x.row + n);
      o.lse[x.k][x.c].assign(lse.ptr<float>() + x.row, lse.ptr<float>() + x.row + n);
      o.ent[x.k][x.c].assign(ent.ptr<float>() + x.row, ent.ptr<float>() + x.row + n);
    }
    const TensorView ge = TensorView::contiguous(g_ent.data(), DType::kF32, {T});
    bp.backward(f, tg, LogprobParams{}, lse.view(), ent.view(),
                TensorView::contiguous(g_lp.data(), DType::kF32, {T}), &ge, idx, o.grads);
    clock.lap(o.backward_s);
  }
  o.grads.finish();
  return o;
}

// A step's gradients in host buffers (a device backend's copied; they live as long as `m`).
inline StepOut with_host_grads(const StepModel& m, StepOut o) {
  const OpsBackend& ops = m.model.ops();
  if (ops.device() == Device::kCPU) return o;
  StepOut h{Gradients(m.cfg), std::move(o.logp), std::move(o.lse), std::move(o.ent), o.rows,
            o.saved_bytes,    o.forward_s,       o.head_s,         o.backward_s};
  for (size_t i = 0; i < o.grads.all().size(); ++i)
    ops.copy(h.grads.all()[i].second.view(), o.grads.all()[i].second.view());
  ops.synchronize();
  return h;
}

// The same steps on a fresh model over `backend` (default: the CPU invariant one); the gradients
// come back in host buffers.
inline StepOut run_shared_step(const Qwen3Config& cfg, const std::map<std::string, TensorView>& w,
                               const ModelOptions& opt, const GroupStep& st,
                               const std::vector<std::vector<size_t>>& micro_batches,
                               std::unique_ptr<OpsBackend> backend = make_invariant_backend()) {
  StepModel m(cfg, w, opt, std::move(backend));
  return with_host_grads(m, run_shared_step(m, st, micro_batches));
}
inline StepOut run_unshared_step(const Qwen3Config& cfg, const std::map<std::string, TensorView>& w,
                                 const ModelOptions& opt, const GroupStep& st,
                                 const std::vector<std::vector<size_t>>& micro_batches,
                                 std::unique_ptr<OpsBackend> backend = make_invariant_backend()) {
  StepModel m(cfg, w, opt, std::move(backend));
  return with_host_grads(m, run_unshared_step(m, st, micro_batches));
}

}  // namespace lockstep::engine::test_shared
