// The argument checks of the linear log-prob backward (docs/contract.md §B.8). Everything is
// checked before anything is written.
#include "contract/checks.h"

namespace lockstep::contract {

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
  const int64_t T = h.size(0), H = h.size(1), V = w.size(0);
  LS_CHECK(V >= 1, op, "argument 'w': vocab size (dim 0) must be >= 1, got ", V);
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
  check_tensor(op, "dh", dh, DType::kF32, {T, H}, dev);
  check_inner_contiguous(op, "dh", dh);
  check_tensor(op, "dw", dw, DType::kF32, {V, H}, dev);
  check_inner_contiguous(op, "dw", dw);
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"h", &h},       {"w", &w},       {"targets", &targets}, {"lse", &lse}, {"entropy", &entropy},
      {"g_lp", &g_lp}, {"g_ent", g_ent}};
  for (const auto& [name, in] : inputs) {
    if (!in) continue;
    LS_CHECK(!overlaps(dh, *in), op, "argument 'dh' overlaps '", name, "'");
    LS_CHECK(!overlaps(dw, *in), op, "argument 'dw' overlaps '", name, "'");
  }
  LS_CHECK(!overlaps(dh, dw), op, "argument 'dh' overlaps 'dw'");
  return logprob_vocab_layout(cfg, V);
}

}  // namespace lockstep::contract
