// The argument checks of the linear log-prob backward (docs/contract.md §B.8). Everything is
// checked before anything is written.
#include "contract/checks.h"

namespace lockstep::contract {

namespace {

// What the whole op and a shard check alike: w / dw hold the vocab rows [v0, v1) of a vocab of V
// entries (the whole op: [0, V)).
void check_backward(const char* op, Device dev, const TensorView& h, const TensorView& w,
                    const char* w_name, const TensorView& targets, const LogprobParams& params,
                    int64_t V, int64_t rows, const TensorView& lse, const TensorView& entropy,
                    const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                    const char* dh_name, const TokenOrder& order, const TensorView& dw,
                    const char* dw_name) {
  const int64_t T = h.size(0), H = h.size(1);
  check_tensor_dtypes(op, "targets", targets, {DType::kI32, DType::kI64}, {T}, dev);
  if (dev == Device::kCPU) {  // device targets: the kernel guards them
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = index_at(targets, t);
      LS_CHECK(g == params.ignore_index || (g >= 0 && g < V), op, "argument 'targets': targets[", t,
               "] = ", g, " is outside [0, ", V, ") and is not ignore_index (", params.ignore_index,
               ")");
    }
  }
  check_tensor(op, "lse", lse, DType::kF32, {T}, dev);
  check_tensor(op, "entropy", entropy, DType::kF32, {T}, dev);
  check_tensor(op, "g_lp", g_lp, DType::kF32, {T}, dev);
  if (g_ent) check_tensor(op, "g_ent", *g_ent, DType::kF32, {T}, dev);
  LS_CHECK(order.rows() == T, op, "argument 'order' covers ", order.rows(),
           " rows, but h has T = ", T);
  check_tensor(op, dh_name, dh, DType::kF32, {T, H}, dev);
  check_inner_contiguous(op, dh_name, dh);
  check_tensor(op, dw_name, dw, DType::kF32, {rows, H}, dev);
  check_inner_contiguous(op, dw_name, dw);
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"h", &h},       {w_name, &w},    {"targets", &targets}, {"lse", &lse}, {"entropy", &entropy},
      {"g_lp", &g_lp}, {"g_ent", g_ent}};
  for (const auto& [name, in] : inputs) {
    if (!in) continue;
    LS_CHECK(!overlaps(dh, *in), op, "argument '", dh_name, "' overlaps '", name, "'");
    LS_CHECK(!overlaps(dw, *in), op, "argument '", dw_name, "' overlaps '", name, "'");
  }
  LS_CHECK(!overlaps(dh, dw), op, "argument '", dh_name, "' overlaps '", dw_name, "'");
}

}  // namespace

LogprobVocabLayout check_linear_logprob_backward(const char* op, Device dev, const TensorView& h,
                                                 const TensorView& w, const TensorView& targets,
                                                 const LogprobParams& params,
                                                 const ContractConfig& cfg, const TensorView& lse,
                                                 const TensorView& entropy, const TensorView& g_lp,
                                                 const TensorView* g_ent, const TensorView& dh,
                                                 const TokenOrder& order, const TensorView& dw) {
  cfg.validate();
  params.validate();
  check_h_w(op, dev, h, w, cfg);
  const int64_t V = w.size(0);
  LS_CHECK(V >= 1, op, "argument 'w': vocab size (dim 0) must be >= 1, got ", V);
  check_backward(op, dev, h, w, "w", targets, params, V, V, lse, entropy, g_lp, g_ent, dh, "dh",
                 order, dw, "dw");
  return logprob_vocab_layout(cfg, V);
}

ShardRows check_linear_logprob_backward_partial(
    const char* op, Device dev, const TensorView& h, const TensorView& w_shard,
    const TensorView& targets, const LogprobParams& params, const ContractConfig& cfg,
    const LogprobShard& shard, const TensorView& lse, const TensorView& entropy,
    const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh_partial,
    const TokenOrder& order, const TensorView& dw_shard) {
  cfg.validate();
  params.validate();
  const ShardRows sr = check_logprob_shard(op, cfg, shard);
  check_h_w(op, dev, h, w_shard, cfg);  // "argument 'w'" in its messages: the shard's rows
  LS_CHECK(w_shard.size(0) == sr.v1 - sr.v0, op, "argument 'w_shard' has ", w_shard.size(0),
           " rows, but the shard holds vocab rows [", sr.v0, ", ", sr.v1, ")");
  check_backward(op, dev, h, w_shard, "w_shard", targets, params, shard.vocab_size, sr.v1 - sr.v0,
                 lse, entropy, g_lp, g_ent, dh_partial, "dh_partial", order, dw_shard, "dw_shard");
  return sr;
}

}  // namespace lockstep::contract
