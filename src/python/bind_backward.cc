// Bindings of the backward ops (lockstep/ops/backward.h, docs/contract.md §B). Activation
// gradients are f32 arrays the ops write; weight gradients are f32 arrays the ops ADD to, in the
// canonical token order of (cu_seqlens, step_indices) (B.1; without cu_seqlens all rows are one
// sequence; both are host arrays). Host tensors run the lockstep::cpu op, CUDA tensors (a CUDA
// build) the lockstep::cuda op of the same bits. Every check is the library's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "lockstep/ops/backward.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
// The CUDA ops are declared in every build (plain C++ headers); a CPU build never instantiates
// the run_on lambdas that call them, so it links without them.
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/gemm.h"
#include "python/bindings.h"
#include "python/tensor_args.h"

namespace lockstep::python {

namespace {

using nb::arg;

// Rows of the packed buffer a weight gradient reduces over: dimension 0 of `v`.
int64_t rows_of(const char* op, const char* arg, const TensorView& v) {
  LS_CHECK(v.ndim >= 1, op, "argument '", arg, "' expected at least 1 dimension, got ",
           v.shape_string());
  return v.shape[0];
}

void gemm_dx(const Array& dy, const Array& w, const Array& dx, int segments, uint64_t stream) {
  constexpr const char* kOp = "gemm_bf16_dx";
  const ArgView dyv = view_of(kOp, "dy", dy), wv = view_of(kOp, "w", w);
  const ArgView dxv = view_of(kOp, "dx", dx);
  const Placement at = place(kOp, {&dyv, &wv, &dxv}, stream);
  const GemmConfig cfg{segments};
  run_on(
      at, [&] { cpu::gemm_bf16_dx(dyv, wv, cfg, dxv); },
      [&](auto s) { cuda::gemm_bf16_dx(dyv, wv, cfg, dxv, s); });
}

void gemm_dw(const Array& dy, const Array& x, const Array& dw, const OptArray& cu_seqlens,
             const OptArray& step_indices, uint64_t stream) {
  constexpr const char* kOp = "gemm_bf16_dw";
  const ArgView dyv = view_of(kOp, "dy", dy), xv = view_of(kOp, "x", x);
  const ArgView dwv = view_of(kOp, "dw", dw);
  const Placement at = place(kOp, {&dyv, &xv, &dwv}, stream);
  const TokenOrder order = token_order(kOp, cu_seqlens, step_indices, rows_of(kOp, "dy", dyv));
  run_on(
      at, [&] { cpu::gemm_bf16_dw(dyv, xv, order, dwv); },
      [&](auto s) { cuda::gemm_bf16_dw(dyv, xv, order, dwv, s); });
}

// The optional weight gradient of the RMSNorm backward ops: with `dweight`, its view and the token
// order of its reduction (cu_seqlens / step_indices over the rows of s); without, two nulls.
class NormWeightGrad {
 public:
  NormWeightGrad(const char* op, const ArgView& s, const OptArray& dweight, const ArgView& dwv,
                 const OptArray& cu_seqlens, const OptArray& step_indices)
      : dw_(dweight ? &dwv : nullptr) {
    if (dweight) order_ = token_order(op, cu_seqlens, step_indices, rows_of(op, "s", s));
  }
  const TokenOrder* order() const { return dw_ ? &order_ : nullptr; }
  const TensorView* dweight() const { return dw_; }

 private:
  TokenOrder order_;
  const TensorView* dw_;
};

void rmsnorm_backward(const Array& s, const Array& weight, const Array& gy, const Array& dx,
                      const OptArray& dweight, const OptArray& cu_seqlens,
                      const OptArray& step_indices, float eps, uint64_t stream) {
  constexpr const char* kOp = "rmsnorm_backward";
  const ArgView sv = view_of(kOp, "s", s), wv = view_of(kOp, "weight", weight);
  const ArgView gv = view_of(kOp, "gy", gy), dxv = view_of(kOp, "dx", dx);
  const ArgView dwv = view_of(kOp, "dweight", dweight);
  const Placement at = place(kOp, {&sv, &wv, &gv, &dxv, &dwv}, stream);
  RmsNormConfig cfg;
  cfg.eps = eps;
  const NormWeightGrad wg(kOp, sv, dweight, dwv, cu_seqlens, step_indices);
  const TokenOrder* o = wg.order();
  const TensorView* dw = wg.dweight();
  run_on(
      at, [&] { cpu::rmsnorm_backward(sv, wv, cfg, gv, dxv, o, dw); },
      [&](auto s) { cuda::rmsnorm_backward(sv, wv, cfg, gv, dxv, o, dw, s); });
}

void rmsnorm_residual_backward(const Array& s, const Array& weight, const Array& gy,
                               const Array& gres, const Array& ds, const OptArray& dweight,
                               const OptArray& cu_seqlens, const OptArray& step_indices, float eps,
                               uint64_t stream) {
  constexpr const char* kOp = "rmsnorm_residual_backward";
  const ArgView sv = view_of(kOp, "s", s), wv = view_of(kOp, "weight", weight);
  const ArgView gv = view_of(kOp, "gy", gy), rv = view_of(kOp, "gres", gres);
  const ArgView dsv = view_of(kOp, "ds", ds), dwv = view_of(kOp, "dweight", dweight);
  const Placement at = place(kOp, {&sv, &wv, &gv, &rv, &dsv, &dwv}, stream);
  RmsNormConfig cfg;
  cfg.eps = eps;
  const NormWeightGrad wg(kOp, sv, dweight, dwv, cu_seqlens, step_indices);
  const TokenOrder* o = wg.order();
  const TensorView* dw = wg.dweight();
  run_on(
      at, [&] { cpu::rmsnorm_residual_backward(sv, wv, cfg, gv, rv, dsv, o, dw); },
      [&](auto s) { cuda::rmsnorm_residual_backward(sv, wv, cfg, gv, rv, dsv, o, dw, s); });
}

void rope_backward(const Array& gy, const Array& positions, const Array& dx, double theta,
                   int64_t max_positions, uint64_t stream) {
  constexpr const char* kOp = "rope_backward";
  const ArgView gv = view_of(kOp, "gy", gy), pv = view_of(kOp, "positions", positions);
  const ArgView dxv = view_of(kOp, "dx", dx);
  const Placement at = place(kOp, {&gv, &pv, &dxv}, stream);
  LS_CHECK(gv.ndim == 3, kOp, "argument 'gy' expected shape [T, heads, D], got ",
           gv.shape_string());
  run_on(
      at, [&] { cpu::rope_backward(gv, pv, *rope_table(gv.shape[2], theta, max_positions), dxv); },
      [&](auto s) {
        const DeviceRopeTable t =
            device_rope_table(gv.shape[2], theta, max_positions, at.device_id);
        cuda::rope_backward(gv, pv, t.cos, t.sin, dxv, s);
      });
}

void silu_mul_backward(const Array& gate_up, const Array& ga, const Array& dgu, uint64_t stream) {
  constexpr const char* kOp = "silu_mul_backward";
  const ArgView gv = view_of(kOp, "gate_up", gate_up), av = view_of(kOp, "ga", ga);
  const ArgView dv = view_of(kOp, "dgu", dgu);
  const Placement at = place(kOp, {&gv, &av, &dv}, stream);
  run_on(
      at, [&] { cpu::silu_mul_backward(gv, av, dv); },
      [&](auto s) { cuda::silu_mul_backward(gv, av, dv, s); });
}

void embedding_backward(const Array& ids, const Array& gh, const Array& dtable,
                        const OptArray& cu_seqlens, const OptArray& step_indices, uint64_t stream) {
  constexpr const char* kOp = "embedding_backward";
  const ArgView iv = view_of(kOp, "ids", ids), gv = view_of(kOp, "gh", gh);
  const ArgView dv = view_of(kOp, "dtable", dtable);
  const Placement at = place(kOp, {&iv, &gv, &dv}, stream);
  const TokenOrder order = token_order(kOp, cu_seqlens, step_indices, rows_of(kOp, "ids", iv));
  run_on(
      at, [&] { cpu::embedding_backward(iv, gv, order, dv); },
      [&](auto s) { cuda::embedding_backward(iv, gv, order, dv, s); });
}

void linear_logprob_backward(const Array& h, const Array& w, const Array& targets, const Array& lse,
                             const Array& entropy, const Array& g_lp, const OptArray& g_ent,
                             const Array& dh, const Array& dw, float temperature,
                             int64_t ignore_index, const ContractConfig& cfg,
                             const OptArray& cu_seqlens, const OptArray& step_indices,
                             uint64_t stream) {
  constexpr const char* kOp = "linear_logprob_backward";
  const ArgView hv = view_of(kOp, "h", h), wv = view_of(kOp, "w", w);
  const ArgView tv = view_of(kOp, "targets", targets), lv = view_of(kOp, "lse", lse);
  const ArgView ev = view_of(kOp, "entropy", entropy), gv = view_of(kOp, "g_lp", g_lp);
  const ArgView gev = view_of(kOp, "g_ent", g_ent), dhv = view_of(kOp, "dh", dh);
  const ArgView dwv = view_of(kOp, "dw", dw);
  const Placement at = place(kOp, {&hv, &wv, &tv, &lv, &ev, &gv, &gev, &dhv, &dwv}, stream);
  LogprobParams params;
  params.temperature = temperature;
  params.ignore_index = ignore_index;
  const TokenOrder order = token_order(kOp, cu_seqlens, step_indices, rows_of(kOp, "h", hv));
  const TensorView* ge = g_ent ? &gev : nullptr;
  run_on(
      at,
      [&] {
        cpu::linear_logprob_backward(hv, wv, tv, params, cfg, lv, ev, gv, ge, dhv, order, dwv);
      },
      [&](auto s) {
        cuda::linear_logprob_backward(hv, wv, tv, params, cfg, lv, ev, gv, ge, dhv, order, dwv, s);
      });
}

// The backward from a given lse / entropy that also writes the forward's logp / lse / entropy of
// the same inputs (B.8 "The forward from the backward"): the CPU runs linear_logprob, then the
// backward; CUDA cuda::linear_logprob_backward_recompute (one pass where the rows are in place).
void linear_logprob_backward_recompute(const Array& h, const Array& w, const Array& targets,
                                       const Array& lse, const Array& entropy, const Array& g_lp,
                                       const OptArray& g_ent, const Array& dh, const Array& dw,
                                       const Array& logp_out, const Array& lse_out,
                                       const Array& entropy_out, float temperature,
                                       int64_t ignore_index, const ContractConfig& cfg,
                                       const OptArray& cu_seqlens, const OptArray& step_indices,
                                       uint64_t stream) {
  constexpr const char* kOp = "linear_logprob_backward_recompute";
  const ArgView hv = view_of(kOp, "h", h), wv = view_of(kOp, "w", w);
  const ArgView tv = view_of(kOp, "targets", targets), lv = view_of(kOp, "lse", lse);
  const ArgView ev = view_of(kOp, "entropy", entropy), gv = view_of(kOp, "g_lp", g_lp);
  const ArgView gev = view_of(kOp, "g_ent", g_ent), dhv = view_of(kOp, "dh", dh);
  const ArgView dwv = view_of(kOp, "dw", dw), pov = view_of(kOp, "logp_out", logp_out);
  const ArgView lov = view_of(kOp, "lse_out", lse_out);
  const ArgView eov = view_of(kOp, "entropy_out", entropy_out);
  const Placement at =
      place(kOp, {&hv, &wv, &tv, &lv, &ev, &gv, &gev, &dhv, &dwv, &pov, &lov, &eov}, stream);
  LogprobParams params;
  params.temperature = temperature;
  params.ignore_index = ignore_index;
  const TokenOrder order = token_order(kOp, cu_seqlens, step_indices, rows_of(kOp, "h", hv));
  const TensorView* ge = g_ent ? &gev : nullptr;
  run_on(
      at,
      [&] {
        cpu::linear_logprob(hv, wv, tv, params, cfg, pov, lov, eov);
        cpu::linear_logprob_backward(hv, wv, tv, params, cfg, lv, ev, gv, ge, dhv, order, dwv);
      },
      [&](auto s) {
        cuda::linear_logprob_backward_recompute(hv, wv, tv, params, cfg, lv, ev, gv, ge, dhv, order,
                                                dwv, pov, lov, eov, s);
      });
}

void attention_backward_varlen(const Array& q, const Array& k, const Array& v, const Array& out,
                               const Array& lse, const Array& dout, const Array& cu_seqlens,
                               const Array& dq, const Array& dk, const Array& dv, int kv_chunk,
                               double softmax_scale, uint64_t stream) {
  constexpr const char* kOp = "attention_backward_varlen";
  const ArgView qv = view_of(kOp, "q", q), kv = view_of(kOp, "k", k);
  const ArgView vv = view_of(kOp, "v", v), ov = view_of(kOp, "out", out);
  const ArgView lv = view_of(kOp, "lse", lse), gv = view_of(kOp, "dout", dout);
  const ArgView dqv = view_of(kOp, "dq", dq), dkv = view_of(kOp, "dk", dk);
  const ArgView dvv = view_of(kOp, "dv", dv);
  const Placement at = place(kOp, {&qv, &kv, &vv, &ov, &lv, &gv, &dqv, &dkv, &dvv}, stream);
  const PackedSeqs seqs = packed_seqs(kOp, cu_seqlens, rows_of(kOp, "q", qv));
  AttentionConfig cfg;
  cfg.kv_chunk = kv_chunk;
  cfg.softmax_scale = softmax_scale;
  run_on(
      at, [&] { cpu::attention_backward_varlen(qv, kv, vv, ov, lv, gv, seqs, cfg, dqv, dkv, dvv); },
      [&](auto s) {
        cuda::attention_backward_varlen(qv, kv, vv, ov, lv, gv, seqs, cfg, dqv, dkv, dvv, s);
      });
}

// dst = round_bf16(src) elementwise (RNE, canonical NaN 0x7FC0: dtype.h's f32_to_bf16), the
// rounding point of B.0. src f32 and dst bf16, the same shape, both contiguous.
void round_bf16(const Array& src, const Array& dst, uint64_t stream) {
  constexpr const char* kOp = "round_bf16";
  const ArgView sv = view_of(kOp, "src", src), dv = view_of(kOp, "dst", dst);
  const Placement at = place(kOp, {&sv, &dv}, stream);
  LS_CHECK(sv.dtype == DType::kF32 && dv.dtype == DType::kBF16, kOp,
           "expected src f32 and dst bf16, got ", dtype_name(sv.dtype), " and ",
           dtype_name(dv.dtype));
  LS_CHECK(sv.shape_string() == dv.shape_string(), kOp, "src ", sv.shape_string(), " and dst ",
           dv.shape_string(), " differ in shape");
  LS_CHECK(sv.is_contiguous() && dv.is_contiguous(), kOp, "src and dst must be contiguous, got ",
           sv.describe(), " and ", dv.describe());
  run_on(
      at,
      [&] {
        const float* in = sv.ptr<const float>();
        bf16* out = dv.ptr<bf16>();
        for (int64_t i = 0, n = sv.numel(); i < n; ++i) out[i] = f32_to_bf16(in[i]);
      },
      [&](auto s) {
        // The CUDA op takes 2-D views: both contiguous buffers as one row.
        const auto row = [](TensorView v) {
          v.shape[1] = v.numel();
          v.shape[0] = 1;
          v.stride[0] = v.shape[1];
          v.stride[1] = 1;
          v.ndim = 2;
          return v;
        };
        if (sv.numel() > 0) cuda::round_bf16(row(sv), row(dv), s);
      });
}

// y = tree(partials) (B.2, §G.4): the fp32 partials of a TP-sharded reduction (rank order, t =
// 1, 2, 4 or 8, each [M, N] f32) combined by the GEMM's balanced tree, y [M, N] f32 or bf16
// (rounded once). The combine of a column-parallel dX's shard results (train.cc's column_dx).
void gemm_combine(const std::vector<Array>& partials, const Array& y, uint64_t stream) {
  constexpr const char* kOp = "gemm_tree_combine";
  std::vector<TensorView> pv;
  const ArgView yv = view_of(kOp, "y", y);
  const Placement at = place(kOp, {&yv}, stream);
  for (const Array& a : partials) {
    const ArgView v = view_of(kOp, "partials", a);
    place(kOp, {&v, &yv}, stream);
    pv.push_back(v);
  }
  run_on(
      at, [&] { cpu::gemm_tree_combine(pv, nullptr, yv); },
      [&](auto s) { cuda::gemm_tree_combine(pv, nullptr, yv, s); });
}

// y_partial = the fp32 subtree of rank tp_rank's S/t K segments (row-parallel TP, §G.5): x_shard
// [M, Kr] and w_shard [N, Kr] bf16 (the rank's columns of gemm_tp_k_range), y_partial [M, N] f32.
void gemm_partial(const Array& x_shard, const Array& w_shard, int64_t k_total, int tp_size,
                  int tp_rank, int segments, const Array& y_partial, uint64_t stream) {
  constexpr const char* kOp = "gemm_bf16_nt_partial";
  const ArgView xv = view_of(kOp, "x_shard", x_shard), wv = view_of(kOp, "w_shard", w_shard);
  const ArgView yv = view_of(kOp, "y_partial", y_partial);
  const Placement at = place(kOp, {&xv, &wv, &yv}, stream);
  const GemmConfig cfg{segments};
  run_on(
      at, [&] { cpu::gemm_bf16_nt_partial(xv, wv, k_total, tp_size, tp_rank, cfg, yv); },
      [&](auto s) { cuda::gemm_bf16_nt_partial(xv, wv, k_total, tp_size, tp_rank, cfg, yv, s); });
}

}  // namespace

void bind_backward(nb::module_& m) {
  m.def("gemm_dx", &gemm_dx, arg("dy"), arg("w"), arg("dx"), arg("segments") = 1, arg("stream") = 0,
        "dx = dy·w (B.3) with `segments` N segments. dy [T, N] bf16, w [N, K] bf16, dx [T, K] "
        "f32/bf16 (written).");
  m.def("gemm_dw", &gemm_dw, arg("dy"), arg("x"), arg("dw"), arg("cu_seqlens").none() = nb::none(),
        arg("step_indices").none() = nb::none(), arg("stream") = 0,
        "dw += dyᵀ·x over the token blocks in canonical order (B.3). dy [T, N], x [T, K] bf16; dw "
        "[N, K] f32 (in/out).");
  m.def("rmsnorm_backward", &rmsnorm_backward, arg("s"), arg("weight"), arg("gy"), arg("dx"),
        arg("dweight").none() = nb::none(), arg("cu_seqlens").none() = nb::none(),
        arg("step_indices").none() = nb::none(), arg("eps") = 1e-6f, arg("stream") = 0,
        "RMSNorm backward (B.4): dx (f32, written) and, with dweight, dweight += (f32).");
  m.def("rmsnorm_residual_backward", &rmsnorm_residual_backward, arg("s"), arg("weight"), arg("gy"),
        arg("gres"), arg("ds"), arg("dweight").none() = nb::none(),
        arg("cu_seqlens").none() = nb::none(), arg("step_indices").none() = nb::none(),
        arg("eps") = 1e-6f, arg("stream") = 0,
        "Fused residual RMSNorm backward (B.4): ds = gres + dnorm (f32, written).");
  m.def("rope_backward", &rope_backward, arg("gy"), arg("positions"), arg("dx"), arg("theta"),
        arg("max_positions"), arg("stream") = 0, "RoPE backward (B.5). gy, dx [T, heads, D] f32.");
  m.def("silu_mul_backward", &silu_mul_backward, arg("gate_up"), arg("ga"), arg("dgu"),
        arg("stream") = 0,
        "SiLU-and-mul backward (B.6). gate_up [T, 2I] bf16, ga [T, I] f32, dgu [T, 2I] f32.");
  m.def("embedding_backward", &embedding_backward, arg("ids"), arg("gh"), arg("dtable"),
        arg("cu_seqlens").none() = nb::none(), arg("step_indices").none() = nb::none(),
        arg("stream") = 0, "dtable += gh rows by id in canonical order (B.7); f32.");
  m.def("linear_logprob_backward", &linear_logprob_backward, arg("h"), arg("w"), arg("targets"),
        arg("lse"), arg("entropy"), arg("g_lp"), arg("g_ent").none(), arg("dh"), arg("dw"),
        arg("temperature") = 1.0f, arg("ignore_index") = -1, arg("contract") = ContractConfig{},
        arg("cu_seqlens").none() = nb::none(), arg("step_indices").none() = nb::none(),
        arg("stream") = 0,
        "Linear log-prob backward (B.8): dh [T, H] f32 (written), dw [V, H] f32 (in/out).");
  m.def("linear_logprob_backward_recompute", &linear_logprob_backward_recompute, arg("h"), arg("w"),
        arg("targets"), arg("lse"), arg("entropy"), arg("g_lp"), arg("g_ent").none(), arg("dh"),
        arg("dw"), arg("logp_out"), arg("lse_out"), arg("entropy_out"), arg("temperature") = 1.0f,
        arg("ignore_index") = -1, arg("contract") = ContractConfig{},
        arg("cu_seqlens").none() = nb::none(), arg("step_indices").none() = nb::none(),
        arg("stream") = 0,
        "linear_logprob_backward from a given lse / entropy that also writes the forward's logp, "
        "lse, entropy [T] f32 of the same inputs (B.8 'The forward from the backward').");
  m.def("attention_backward_varlen", &attention_backward_varlen, arg("q"), arg("k"), arg("v"),
        arg("out"), arg("lse"), arg("dout"), arg("cu_seqlens"), arg("dq"), arg("dk"), arg("dv"),
        arg("kv_chunk") = 1024, arg("softmax_scale") = 0.0, arg("stream") = 0,
        "Varlen causal attention backward (B.9). dout bf16; dq, dk, dv f32 (written).");
  m.def("gemm_combine", &gemm_combine, arg("partials"), arg("y"), arg("stream") = 0,
        "y = tree(partials) (B.2): fp32 partials [M, N] in rank order (1, 2, 4 or 8) combined by "
        "the GEMM's tree; y f32 or bf16 (rounded once).");
  m.def("gemm_partial", &gemm_partial, arg("x_shard"), arg("w_shard"), arg("k_total"),
        arg("tp_size"), arg("tp_rank"), arg("segments"), arg("y_partial"), arg("stream") = 0,
        "Row-parallel TP rank's fp32 partial of y = x·wᵀ (§G.5): its S/t K segments.");
  m.def("round_bf16", &round_bf16, arg("src"), arg("dst"), arg("stream") = 0,
        "dst = round_bf16(src) (RNE, canonical NaN): the gradients' rounding point (B.0).");
}

}  // namespace lockstep::python
