// The LogP contract (docs/contract.md §L): settings, the vocab layout, the tile state, merge,
// tree and finish formulas, and the argument checks of the LogP ops.
#include "lockstep/contract/logprob.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "contract/checks.h"
#include "contract/logprob_formula.h"
#include "core/math.h"

namespace lockstep {

using contract::lp_max;

void LogprobParams::validate() const {
  LS_CHECK(std::isfinite(temperature) && temperature > 0.0f, "LogprobParams",
           "temperature must be finite and > 0, got ", temperature);
  LS_CHECK(ignore_index < 0, "LogprobParams", "ignore_index must be negative, got ", ignore_index);
}

std::string LogprobParams::to_string() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "logprob: temperature=%a (%.9g) ignore_index=%lld",
                double(temperature), double(temperature), (long long)ignore_index);
  return buf;
}

LogprobVocabLayout logprob_vocab_layout(const ContractConfig& cfg, int64_t vocab_size) {
  cfg.validate();
  LS_CHECK(vocab_size >= 1, "logprob_vocab_layout", "vocab size must be >= 1, got ", vocab_size);
  LogprobVocabLayout l;
  l.vocab_size = vocab_size;
  l.tile = cfg.vocab_tile;
  l.segments = cfg.vocab_segments;
  int64_t unit = int64_t(cfg.vocab_tile) * cfg.vocab_segments;
  l.padded = (vocab_size + unit - 1) / unit * unit;
  l.segment_len = l.padded / cfg.vocab_segments;
  l.tiles_per_segment = l.segment_len / cfg.vocab_tile;
  return l;
}

LogprobState logprob_tile_state(const float* y, int64_t tile) {
  constexpr int kL = kLogprobLanes;
  float m8[kL], s8[kL], w8[kL];
  for (int l = 0; l < kL; ++l) m8[l] = neg_inf_f32();
  for (int64_t j = 0; j < tile; j += kL)
    for (int l = 0; l < kL; ++l) m8[l] = lp_max(m8[l], y[j + l]);
  float m = lp_max(lp_max(lp_max(m8[0], m8[1]), lp_max(m8[2], m8[3])),
                   lp_max(lp_max(m8[4], m8[5]), lp_max(m8[6], m8[7])));
  // NOTE: a zero max is made +0, so the max of a set does not depend on the order (only the sign
  // of a zero could): a GPU may use any reduction order, or fmaxf, for m.
  if (m == 0.0f) m = 0.0f;
  for (int l = 0; l < kL; ++l) s8[l] = w8[l] = 0.0f;
  for (int64_t j = 0; j < tile; j += kL) {
    for (int l = 0; l < kL; ++l) {
      float v = y[j + l];
      float d = v - m;
      float e = ls_expf(d);
      // NOTE: a -inf entry (padding) is skipped; adding +0 instead is the same bits (s and w are
      // never -0), and keeps the loop branch-free. Without it, -inf - (-inf) would poison an
      // all-padding tile with NaN.
      bool skip = v == neg_inf_f32();
      s8[l] = s8[l] + (skip ? 0.0f : e);
      w8[l] = w8[l] + (skip ? 0.0f : e * d);
    }
  }
  LogprobState st;
  st.m = m;
  st.s = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
  st.w = ((w8[0] + w8[1]) + (w8[2] + w8[3])) + ((w8[4] + w8[5]) + (w8[6] + w8[7]));
  return st;
}

LogprobState logprob_merge(const LogprobState& a, const LogprobState& b) {
  return contract::lp_merge(a, b);
}

LogprobState logprob_tree(const LogprobState* states, int64_t n) {
  LS_CHECK(n >= 1 && (n & (n - 1)) == 0, "logprob_tree", "state count must be a power of two, got ",
           n);
  std::vector<LogprobState> level(states, states + n);
  for (int64_t len = n; len > 1; len /= 2)
    for (int64_t i = 0; i < len / 2; ++i) level[i] = logprob_merge(level[2 * i], level[2 * i + 1]);
  return level[0];
}

void logprob_finish(const LogprobState& st, float* lse, float* entropy) {
  float ent;
  const float l = contract::lp_finish(st, &ent);
  if (lse) *lse = l;
  if (entropy) *entropy = ent;
}

}  // namespace lockstep

namespace lockstep::contract {
namespace {

bool pow2_upto8(int64_t n) { return n == 1 || n == 2 || n == 4 || n == 8; }

// logp, lse, entropy: [T] f32 (any stride).
void check_outputs(const char* op, Device dev, const TensorView& logp, const TensorView& lse,
                   const TensorView& entropy, int64_t T) {
  check_tensor(op, "logp", logp, DType::kF32, {T}, dev);
  check_tensor(op, "lse", lse, DType::kF32, {T}, dev);
  check_tensor(op, "entropy", entropy, DType::kF32, {T}, dev);
}

void check_h(const char* op, Device dev, const TensorView& h, const ContractConfig& cfg) {
  check_view(op, "h", h, DType::kBF16, {-1, -1}, dev);
  LS_CHECK(h.size(1) >= 1, op, "argument 'h': hidden size (dim 1) must be >= 1, got ", h.size(1));
}

// targets [T] i32/i64: on the host (values checked here; a GPU op uploads them) or on `dev` (a GPU
// op's kernels guard them: an invalid id gives NaN).
void check_targets(const char* op, Device dev, const TensorView& targets, int64_t T, int64_t V,
                   int64_t ignore_index) {
  check_tensor_dtypes(op, "targets", targets, {DType::kI32, DType::kI64}, {T},
                      host_or(dev, targets));
  if (targets.device != Device::kCPU) return;
  for (int64_t t = 0; t < T; ++t) {
    int64_t g = index_at(targets, t);
    LS_CHECK(g == ignore_index || (g >= 0 && g < V), op, "argument 'targets': targets[", t,
             "] = ", g, " is outside [0, ", V, ") and is not ignore_index (", ignore_index, ")");
  }
}

}  // namespace

void check_h_w(const char* op, Device dev, const TensorView& h, const TensorView& w,
               const ContractConfig& cfg) {
  check_h(op, dev, h, cfg);
  check_view(op, "w", w, DType::kBF16, {-1, h.size(1)}, dev);
}

void check_linear_logprob(const char* op, Device dev, const TensorView& h, const TensorView& w,
                          const TensorView& targets, const LogprobParams& params,
                          const ContractConfig& cfg, const TensorView& logp, const TensorView& lse,
                          const TensorView& entropy) {
  cfg.validate();
  params.validate();
  check_h_w(op, dev, h, w, cfg);
  const int64_t T = h.size(0), V = w.size(0);
  LS_CHECK(V >= 1, op, "argument 'w': vocab size (dim 0) must be >= 1, got ", V);
  check_targets(op, dev, targets, T, V, params.ignore_index);
  check_outputs(op, dev, logp, lse, entropy, T);
}

ShardRows check_logprob_shard(const char* op, const ContractConfig& cfg,
                              const LogprobShard& shard) {
  LS_CHECK(shard.vocab_size >= 1, op, "shard.vocab_size must be >= 1, got ", shard.vocab_size);
  LS_CHECK(pow2_upto8(shard.seg_count) && cfg.vocab_segments % shard.seg_count == 0 &&
               shard.seg_begin >= 0 && shard.seg_begin % shard.seg_count == 0 &&
               shard.seg_begin + shard.seg_count <= cfg.vocab_segments,
           op, "shard: segments [", shard.seg_begin, ", ", shard.seg_begin + shard.seg_count,
           ") are not an aligned power-of-two subtree of vocab_segments=", cfg.vocab_segments);
  ShardRows sr;
  sr.lay = logprob_vocab_layout(cfg, shard.vocab_size);
  sr.v0 = std::min(shard.vocab_size, int64_t(shard.seg_begin) * sr.lay.segment_len);
  sr.v1 =
      std::min(shard.vocab_size, int64_t(shard.seg_begin + shard.seg_count) * sr.lay.segment_len);
  return sr;
}

ShardRows check_linear_logprob_partial(const char* op, Device dev, const TensorView& h,
                                       const TensorView& w_shard, const TensorView& targets,
                                       const LogprobParams& params, const ContractConfig& cfg,
                                       const LogprobShard& shard, const TensorView& state) {
  cfg.validate();
  params.validate();
  check_h(op, dev, h, cfg);
  const int64_t T = h.size(0), H = h.size(1);
  const ShardRows sr = check_logprob_shard(op, cfg, shard);
  check_view(op, "w_shard", w_shard, DType::kBF16, {sr.v1 - sr.v0, H}, dev);
  check_targets(op, dev, targets, T, shard.vocab_size, params.ignore_index);
  check_view(op, "state", state, DType::kF32, {T, 4}, dev);
  return sr;
}

LogprobVocabLayout check_linear_logprob_combine(const char* op, Device dev,
                                                const TensorView& states, const TensorView& targets,
                                                const LogprobParams& params,
                                                const ContractConfig& cfg, int64_t vocab_size,
                                                const TensorView& logp, const TensorView& lse,
                                                const TensorView& entropy) {
  cfg.validate();
  params.validate();
  check_view(op, "states", states, DType::kF32, {-1, -1, 4}, dev);
  const int64_t R = states.size(0), T = states.size(1);
  LS_CHECK(pow2_upto8(R) && cfg.vocab_segments % R == 0, op,
           "argument 'states': rank count (dim 0) must be a power of two dividing vocab_segments=",
           cfg.vocab_segments, ", got ", R);
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, vocab_size);
  check_targets(op, dev, targets, T, vocab_size, params.ignore_index);
  check_outputs(op, dev, logp, lse, entropy, T);
  return lay;
}

}  // namespace lockstep::contract
