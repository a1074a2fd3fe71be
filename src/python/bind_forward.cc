// Bindings of the forward ops (lockstep/ops/*.h): each takes its inputs and preallocated outputs
// as DLPack arrays, the op's settings as plain values, and a CUDA stream (unused on the CPU).
// Host tensors run the lockstep::cpu op, CUDA tensors (a CUDA build) the lockstep::cuda op of
// the same bits on that stream. Outputs are written in place; nothing is allocated here (but the
// RoPE table's device copy, once). Every check is the library's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <vector>

#include "lockstep/ops/activation.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/sampling.h"
// The CUDA ops are declared in every build (plain C++ headers); a CPU build never instantiates
// the run_on lambdas that call them, so it links without them.
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/elementwise.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "python/bindings.h"
#include "python/tensor_args.h"

namespace lockstep::python {

namespace {

using nb::arg;

void gemm(const Array& x, const Array& w, const OptArray& bias, const Array& y, int segments,
          uint64_t stream) {
  constexpr const char* kOp = "gemm_bf16_nt";
  const ArgView xv = view_of(kOp, "x", x), wv = view_of(kOp, "w", w);
  const ArgView bv = view_of(kOp, "bias", bias), yv = view_of(kOp, "y", y);
  const Placement at = place(kOp, {&xv, &wv, &bv, &yv}, stream);
  const GemmConfig cfg{segments};
  const TensorView* b = bias ? &bv : nullptr;
  run_on(
      at, [&] { cpu::gemm_bf16_nt(xv, wv, b, cfg, yv); },
      [&](auto s) { cuda::gemm_bf16_nt(xv, wv, b, cfg, yv, s); });
}

void rmsnorm(const Array& x, const Array& weight, const Array& y, float eps, uint64_t stream) {
  constexpr const char* kOp = "rmsnorm";
  const ArgView xv = view_of(kOp, "x", x), wv = view_of(kOp, "weight", weight);
  const ArgView yv = view_of(kOp, "y", y);
  const Placement at = place(kOp, {&xv, &wv, &yv}, stream);
  RmsNormConfig cfg;
  cfg.eps = eps;
  run_on(
      at, [&] { cpu::rmsnorm(xv, wv, cfg, yv); },
      [&](auto s) { cuda::rmsnorm(xv, wv, cfg, yv, s); });
}

void rmsnorm_residual(const Array& x, const Array& residual, const Array& weight,
                      const Array& residual_out, const Array& y, float eps, uint64_t stream) {
  constexpr const char* kOp = "rmsnorm_residual";
  const ArgView xv = view_of(kOp, "x", x), rv = view_of(kOp, "residual", residual);
  const ArgView wv = view_of(kOp, "weight", weight);
  const ArgView rov = view_of(kOp, "residual_out", residual_out), yv = view_of(kOp, "y", y);
  const Placement at = place(kOp, {&xv, &rv, &wv, &rov, &yv}, stream);
  RmsNormConfig cfg;
  cfg.eps = eps;
  run_on(
      at, [&] { cpu::rmsnorm_residual(xv, rv, wv, cfg, rov, yv); },
      [&](auto s) { cuda::rmsnorm_residual(xv, rv, wv, cfg, rov, yv, s); });
}

void rope(const Array& x, const Array& positions, const Array& y, double theta,
          int64_t max_positions, uint64_t stream) {
  constexpr const char* kOp = "rope";
  const ArgView xv = view_of(kOp, "x", x), pv = view_of(kOp, "positions", positions);
  const ArgView yv = view_of(kOp, "y", y);
  const Placement at = place(kOp, {&xv, &pv, &yv}, stream);
  LS_CHECK(xv.ndim == 3, kOp, "argument 'x' expected shape [T, heads, D], got ", xv.shape_string());
  run_on(
      at, [&] { cpu::rope(xv, pv, *rope_table(xv.shape[2], theta, max_positions), yv); },
      [&](auto s) {
        const DeviceRopeTable t =
            device_rope_table(xv.shape[2], theta, max_positions, at.device_id);
        cuda::rope(xv, pv, t.cos, t.sin, yv, s);
      });
}

void silu_mul(const Array& gate, const Array& up, const Array& out, uint64_t stream) {
  constexpr const char* kOp = "silu_mul";
  const ArgView gv = view_of(kOp, "gate", gate), uv = view_of(kOp, "up", up);
  const ArgView ov = view_of(kOp, "out", out);
  const Placement at = place(kOp, {&gv, &uv, &ov}, stream);
  run_on(
      at, [&] { cpu::silu_mul(gv, uv, ov); }, [&](auto s) { cuda::silu_mul(gv, uv, ov, s); });
}

void silu_and_mul(const Array& gate_up, const Array& out, uint64_t stream) {
  constexpr const char* kOp = "silu_and_mul";
  const ArgView gv = view_of(kOp, "gate_up", gate_up), ov = view_of(kOp, "out", out);
  const Placement at = place(kOp, {&gv, &ov}, stream);
  run_on(
      at, [&] { cpu::silu_and_mul(gv, ov); }, [&](auto s) { cuda::silu_and_mul(gv, ov, s); });
}

void embedding(const Array& ids, const Array& table, const Array& out, uint64_t stream) {
  constexpr const char* kOp = "embedding";
  const ArgView iv = view_of(kOp, "ids", ids), tv = view_of(kOp, "table", table);
  const ArgView ov = view_of(kOp, "out", out);
  const Placement at = place(kOp, {&iv, &tv, &ov}, stream);
  run_on(
      at, [&] { cpu::embedding(iv, tv, ov); }, [&](auto s) { cuda::embedding(iv, tv, ov, s); });
}

void attention_varlen(const Array& q, const Array& k, const Array& v, const Array& cu_seqlens,
                      const Array& out, const OptArray& lse, int kv_chunk, double softmax_scale,
                      uint64_t stream) {
  constexpr const char* kOp = "attention_prefill_varlen";
  const ArgView qv = view_of(kOp, "q", q), kv = view_of(kOp, "k", k);
  const ArgView vv = view_of(kOp, "v", v), cv = view_of(kOp, "cu_seqlens", cu_seqlens);
  const ArgView ov = view_of(kOp, "out", out), lv = view_of(kOp, "lse", lse);
  const Placement at = place(kOp, {&qv, &kv, &vv, &ov, &lv}, stream);
  check_host(kOp, "cu_seqlens", cv);
  AttentionConfig cfg;
  cfg.kv_chunk = kv_chunk;
  cfg.softmax_scale = softmax_scale;
  run_on(
      at, [&] { cpu::attention_prefill_varlen(qv, kv, vv, cv, cfg, ov, lv); },
      [&](auto s) { cuda::attention_prefill_varlen(qv, kv, vv, cv, cfg, ov, lv, s); });
}

void linear_logprob(const Array& h, const Array& w, const Array& targets, const Array& logp,
                    const Array& lse, const Array& entropy, float temperature, int64_t ignore_index,
                    const ContractConfig& cfg, uint64_t stream) {
  constexpr const char* kOp = "linear_logprob";
  const ArgView hv = view_of(kOp, "h", h), wv = view_of(kOp, "w", w);
  const ArgView tv = view_of(kOp, "targets", targets), pv = view_of(kOp, "logp", logp);
  const ArgView lv = view_of(kOp, "lse", lse), ev = view_of(kOp, "entropy", entropy);
  const Placement at = place(kOp, {&hv, &wv, &tv, &pv, &lv, &ev}, stream);
  LogprobParams params;
  params.temperature = temperature;
  params.ignore_index = ignore_index;
  run_on(
      at, [&] { cpu::linear_logprob(hv, wv, tv, params, cfg, pv, lv, ev); },
      [&](auto s) { cuda::linear_logprob(hv, wv, tv, params, cfg, pv, lv, ev, s); });
}

// Per-row settings as host arrays [T]: seed i64 (the uint64 bit pattern), temperature f32,
// top_k i64, top_p f32, min_p f32.
std::vector<SamplingParams> sampling_params(const char* op, int64_t T, const Array& seed,
                                            const Array& temperature, const Array& top_k,
                                            const Array& top_p, const Array& min_p) {
  const ArgView sv = view_of(op, "seed", seed), tv = view_of(op, "temperature", temperature);
  const ArgView kv = view_of(op, "top_k", top_k), pv = view_of(op, "top_p", top_p);
  const ArgView mv = view_of(op, "min_p", min_p);
  const auto check = [&](const char* arg, const TensorView& v, DType dtype) {
    check_host(op, arg, v);
    check_tensor(op, arg, v, dtype, {T});
  };
  check("seed", sv, DType::kI64);
  check("temperature", tv, DType::kF32);
  check("top_k", kv, DType::kI64);
  check("top_p", pv, DType::kF32);
  check("min_p", mv, DType::kF32);
  std::vector<SamplingParams> params(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    SamplingParams& p = params[size_t(t)];
    p.seed = uint64_t(sv.ptr<const int64_t>()[t * sv.stride[0]]);
    p.temperature = tv.ptr<const float>()[t * tv.stride[0]];
    p.top_k = kv.ptr<const int64_t>()[t * kv.stride[0]];
    p.top_p = pv.ptr<const float>()[t * pv.stride[0]];
    p.min_p = mv.ptr<const float>()[t * mv.stride[0]];
  }
  return params;
}

void sample(const Array& h, const Array& w, const Array& seed, const Array& temperature,
            const Array& top_k, const Array& top_p, const Array& min_p, const Array& request_ids,
            const Array& positions, const Array& token_ids, const Array& logp, const Array& lse,
            const Array& entropy, const ContractConfig& cfg, uint64_t stream) {
  constexpr const char* kOp = "sample";
  const ArgView hv = view_of(kOp, "h", h), wv = view_of(kOp, "w", w);
  const ArgView rv = view_of(kOp, "request_ids", request_ids);
  const ArgView pv = view_of(kOp, "positions", positions);
  const ArgView iv = view_of(kOp, "token_ids", token_ids), lpv = view_of(kOp, "logp", logp);
  const ArgView lv = view_of(kOp, "lse", lse), ev = view_of(kOp, "entropy", entropy);
  const Placement at = place(kOp, {&hv, &wv, &rv, &pv, &iv, &lpv, &lv, &ev}, stream);
  LS_CHECK(hv.ndim == 2, kOp, "argument 'h' expected shape [T, H], got ", hv.shape_string());
  const std::vector<SamplingParams> params =
      sampling_params(kOp, hv.shape[0], seed, temperature, top_k, top_p, min_p);
  run_on(
      at, [&] { cpu::sample(hv, wv, params, rv, pv, cfg, iv, lpv, lv, ev); },
      [&](auto s) { cuda::sample(hv, wv, params, rv, pv, cfg, iv, lpv, lv, ev, s); });
}

}  // namespace

void bind_forward(nb::module_& m) {
  m.def("gemm", &gemm, arg("x"), arg("w"), arg("bias").none(), arg("y"), arg("segments") = 1,
        arg("stream") = 0,
        "y = x·wᵀ (+ bias) by the GEMM contract (§G) with `segments` K segments. x [M, K], w "
        "[N, K] bf16; bias [N] bf16/f32 or None; y [M, N] bf16/f32 (written).");
  m.def("rmsnorm", &rmsnorm, arg("x"), arg("weight"), arg("y"), arg("eps"), arg("stream") = 0,
        "y = rmsnorm(x)·weight (§E). x, y [T, H] or [T, heads, D] bf16; weight [last dim] bf16.");
  m.def("rmsnorm_residual", &rmsnorm_residual, arg("x"), arg("residual"), arg("weight"),
        arg("residual_out"), arg("y"), arg("eps"), arg("stream") = 0,
        "residual_out = bf16(x + residual), y = rmsnorm(residual_out)·weight (§E).");
  m.def("rope", &rope, arg("x"), arg("positions"), arg("y"), arg("theta"), arg("max_positions"),
        arg("stream") = 0,
        "y = rope(x) (rotate_half, §E) at each token's position. x, y [T, heads, D] bf16; "
        "positions [T] i32/i64 in [0, max_positions).");
  m.def("silu_mul", &silu_mul, arg("gate"), arg("up"), arg("out"), arg("stream") = 0,
        "out = bf16(silu(gate)·up) (§E). gate, up, out [T, I] bf16.");
  m.def("silu_and_mul", &silu_and_mul, arg("gate_up"), arg("out"), arg("stream") = 0,
        "silu_mul on the halves of gate_up [T, 2I]; out [T, I].");
  m.def("embedding", &embedding, arg("ids"), arg("table"), arg("out"), arg("stream") = 0,
        "out[t] = table[ids[t]]. ids [T] i32/i64, table [V, H] bf16, out [T, H] bf16.");
  m.def("attention_varlen", &attention_varlen, arg("q"), arg("k"), arg("v"), arg("cu_seqlens"),
        arg("out"), arg("lse").none(), arg("kv_chunk") = 1024, arg("softmax_scale") = 0.0,
        arg("stream") = 0,
        "Packed varlen causal GQA attention (§A). q [T, Hq, D], k, v [T, Hkv, D] bf16; "
        "cu_seqlens [B+1] i32 (host); out [T, Hq, D] bf16, lse [T, Hq] f32 or None.");
  m.def("linear_logprob", &linear_logprob, arg("h"), arg("w"), arg("targets"), arg("logp"),
        arg("lse"), arg("entropy"), arg("temperature") = 1.0f, arg("ignore_index") = -1,
        arg("contract") = ContractConfig{}, arg("stream") = 0,
        "logp, lse, entropy of softmax(h·wᵀ / temperature) (§L). h [T, H], w [V, H] bf16; "
        "targets [T] i32/i64; logp, lse, entropy [T] f32.");
  m.def("sample", &sample, arg("h"), arg("w"), arg("seed"), arg("temperature"), arg("top_k"),
        arg("top_p"), arg("min_p"), arg("request_ids"), arg("positions"), arg("token_ids"),
        arg("logp"), arg("lse"), arg("entropy"), arg("contract") = ContractConfig{},
        arg("stream") = 0,
        "Sampling (§S: filters, then the inverse CDF of exact integer masses), per-row "
        "settings as [T] host arrays (seed i64, temperature "
        "f32, top_k i64, top_p f32, min_p f32); request_ids [T] i64, positions [T] i32/i64; "
        "writes token_ids [T] i32/i64 and logp, lse, entropy [T] f32.");
}

}  // namespace lockstep::python
