// GPU parity of the CUDA elementwise ops (lockstep::cuda::rmsnorm, rmsnorm_residual, rope,
// silu_mul, embedding, embedding_vocab_parallel, embedding_combine; src/cuda/{norm,rope,
// activation,embedding}.cu) with the CPU ops (lockstep::cpu::*), bit for bit (docs/contract.md
// §E), by memcmp of whole output buffers (padding cells included: outputs are poisoned with 0xA5
// on both sides first) on fresh random data:
//   - RMSNorm: H in {1, 3, 17, 64, 111, 128, 136, 1000, 4096, 5120}, rows at 8 magnitudes
//     (subnormal squares, overflow), NaN / ±inf / ±0 rows, residual overflow; strided rows
//     (aligned and unaligned), per-head [T, heads, D] views inside a fused qkv buffer, in place;
//   - RoPE: 40960 positions, D = 2, 6, 128, i32 / i64 / strided positions, q inside qkv, in place,
//     out-of-table device positions -> canonical-NaN rows;
//   - q/k norm + RoPE in one launch (cuda::qk_norm_rope) == rmsnorm of each part, then rope, over a
//     q|k|v buffer (v untouched), special heads, a token alone == in the batch, out-of-table
//     device positions -> NaN heads, argument errors;
//   - SiLU-and-mul: every bf16 gate x special up values, random rows, odd widths, in place;
//   - embedding: random bit-pattern tables, strided ids / tables / outputs, vocab-parallel partials
//     TP = 1, 2, 3, 4, 8 and their combine (also in place), invalid device ids -> NaN rows;
//   - invariance on the GPU: a row alone == the same row inside the batch;
//   - negative control: a sequential (non-lane) RMSNorm sum must differ from the GPU somewhere;
//   - argument errors (host views, shapes, dtypes, strides, aliasing, config) before any launch.
// One section of the GPU parity program test_parity (tests/cuda/test_parity.cu: seed, --quick and
// the pass/fail counts come from cuda/gpu_harness.h), beside the op-case table's cases.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/parity_fixture.h"  // report, DevPool, view, bitwise, expect_error
#include "lockstep/cuda/elementwise.h"
#include "lockstep/ops/activation.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"

using lockstep::bf16;
using lockstep::Device;
using lockstep::DType;
using lockstep::Tensor;
using lockstep::TensorView;

namespace {

TensorView on(const TensorView& host_view, void* dev_base, const void* host_base) {
  TensorView v = host_view;
  v.device = Device::kCUDA;
  v.data = static_cast<char*>(dev_base) +
           (static_cast<const char*>(host_view.data) - static_cast<const char*>(host_base));
  return v;
}

bf16 rnd_bf16(float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  return lockstep::f32_to_bf16(d(g_rng));
}
void fill_bf16(bf16* p, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) p[i] = rnd_bf16(scale);
}

// ---- RMSNorm -----------------------------------------------------------------------------------

// Negative-control reference: the same formula with a plain sequential sum of squares.
void rmsnorm_sequential(const bf16* x, const bf16* w, int64_t T, int64_t H, float eps, bf16* y) {
  for (int64_t t = 0; t < T; ++t) {
    float acc = 0.0f;
    for (int64_t k = 0; k < H; ++k) {
      const float v = lockstep::bf16_to_f32(x[t * H + k]);
      const float sq = v * v;
      acc = acc + sq;
    }
    const float r = 1.0f / std::sqrt(acc / float(H) + eps);
    for (int64_t k = 0; k < H; ++k) {
      const bf16 q = lockstep::f32_to_bf16(lockstep::bf16_to_f32(x[t * H + k]) * r);
      y[t * H + k] = lockstep::f32_to_bf16(lockstep::bf16_to_f32(q) * lockstep::bf16_to_f32(w[k]));
    }
  }
}

void test_rmsnorm(int64_t H) {
  const int64_t T = 64;
  const lockstep::RmsNormConfig cfg{1e-6f};
  Tensor x(DType::kBF16, {T, H}), r(DType::kBF16, {T, H}), w(DType::kBF16, {H});
  fill_bf16(w.ptr<bf16>(), size_t(H), 1.0f);
  const float scales[] = {1.0f, 1e-20f, 1e-35f, 1e15f, 3e19f, 0.01f, 100.0f, 1e-30f};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < H; ++k) {
      x.ptr<bf16>()[t * H + k] = rnd_bf16(scales[t % 8]);
      r.ptr<bf16>()[t * H + k] = rnd_bf16(scales[t % 8]);
    }
  }
  bf16* xp = x.ptr<bf16>();
  xp[9 * H + H / 2] = bf16{0x7fc1};                                                     // NaN
  xp[10 * H + (H > 1 ? 1 : 0)] = bf16{0x7f80};                                          // +inf
  xp[11 * H + 0] = bf16{0xff80};                                                        // -inf
  for (int64_t k = 0; k < H; ++k) xp[12 * H + k] = bf16{uint16_t(k & 1 ? 0x8000 : 0)};  // ±0
  xp[13 * H] = lockstep::f32_to_bf16(3e38f);  // residual overflow
  r.ptr<bf16>()[13 * H] = lockstep::f32_to_bf16(3e38f);

  const size_t nb = size_t(x.nbytes());
  Tensor y(DType::kBF16, {T, H}), y2(DType::kBF16, {T, H}), s2(DType::kBF16, {T, H});
  for (Tensor* t : {&y, &y2, &s2}) std::memset(t->data(), 0xA5, nb);
  lockstep::cpu::rmsnorm(x.view(), w.view(), cfg, y.view());
  lockstep::cpu::rmsnorm_residual(x.view(), r.view(), w.view(), cfg, s2.view(), y2.view());

  DevPool d;
  void* dx = d.upload(x.data(), nb);
  void* dr = d.upload(r.data(), nb);
  void* dw = d.upload(w.data(), size_t(w.nbytes()));
  void* dy = d.alloc(nb);
  void* ds = d.alloc(nb);
  const TensorView vx = view(dx, DType::kBF16, {T, H}), vr = view(dr, DType::kBF16, {T, H}),
                   vw = view(dw, DType::kBF16, {H}), vy = view(dy, DType::kBF16, {T, H}),
                   vs = view(ds, DType::kBF16, {T, H});
  const std::string tag = " H=" + std::to_string(H);
  lockstep::cuda::rmsnorm(vx, vw, cfg, vy);
  bitwise("rmsnorm" + tag, download(dy, nb).data(), y.data(), size_t(T * H), 2);
  CK(cudaMemset(dy, 0xA5, nb));
  lockstep::cuda::rmsnorm_residual(vx, vr, vw, cfg, vs, vy);
  bitwise("rmsnorm_residual y" + tag, download(dy, nb).data(), y2.data(), size_t(T * H), 2);
  bitwise("rmsnorm_residual residual_out" + tag, download(ds, nb).data(), s2.data(), size_t(T * H),
          2);

  // Invariance: rows alone (T = 1 calls) == the same rows of the batch.
  for (int64_t row : {int64_t(0), int64_t(5), int64_t(13), T - 1}) {
    void* d1 = d.alloc(size_t(H) * 2);
    lockstep::cuda::rmsnorm(vx.rows(row, row + 1), vw, cfg, view(d1, DType::kBF16, {1, H}));
    bitwise("rmsnorm row " + std::to_string(row) + " alone == in batch" + tag,
            download(d1, size_t(H) * 2).data(), y.ptr<bf16>() + row * H, size_t(H), 2);
  }

  // In place: y = x; residual_out = residual and y = x (vLLM's fused_add_rms_norm).
  void* dx2 = d.upload(x.data(), nb);
  lockstep::cuda::rmsnorm(view(dx2, DType::kBF16, {T, H}), vw, cfg,
                          view(dx2, DType::kBF16, {T, H}));
  bitwise("rmsnorm in place" + tag, download(dx2, nb).data(), y.data(), size_t(T * H), 2);
  void* dx3 = d.upload(x.data(), nb);
  void* dr3 = d.upload(r.data(), nb);
  const TensorView vx3 = view(dx3, DType::kBF16, {T, H}), vr3 = view(dr3, DType::kBF16, {T, H});
  lockstep::cuda::rmsnorm_residual(vx3, vr3, vw, cfg, vr3, vx3);
  bitwise("rmsnorm_residual in place y" + tag, download(dx3, nb).data(), y2.data(), size_t(T * H),
          2);
  bitwise("rmsnorm_residual in place residual" + tag, download(dr3, nb).data(), s2.data(),
          size_t(T * H), 2);
}

// Negative control: the same formula with a plain sequential sum of squares must differ from the
// GPU somewhere (about 1 row in 30 at H = 4096), so the comparison does see the summation order.
void test_rmsnorm_negative_control() {
  const int64_t T = g_quick ? 256 : 2048, H = 4096;
  const lockstep::RmsNormConfig cfg{1e-6f};
  Tensor x(DType::kBF16, {T, H}), w(DType::kBF16, {H}), seq(DType::kBF16, {T, H});
  fill_bf16(x.ptr<bf16>(), size_t(T * H), 1.0f);
  fill_bf16(w.ptr<bf16>(), size_t(H), 1.0f);
  rmsnorm_sequential(x.ptr<bf16>(), w.ptr<bf16>(), T, H, cfg.eps, seq.ptr<bf16>());
  DevPool d;
  const size_t nb = size_t(x.nbytes());
  void* dx = d.upload(x.data(), nb);
  void* dw = d.upload(w.data(), size_t(w.nbytes()));
  void* dy = d.alloc(nb);
  lockstep::cuda::rmsnorm(view(dx, DType::kBF16, {T, H}), view(dw, DType::kBF16, {H}), cfg,
                          view(dy, DType::kBF16, {T, H}));
  const std::vector<uint8_t> q = download(dy, nb);
  int64_t rows_differ = 0;
  for (int64_t t = 0; t < T; ++t)
    rows_differ += std::memcmp(q.data() + t * H * 2, seq.ptr<bf16>() + t * H, size_t(H) * 2) != 0;
  std::printf("negative control (sequential sum of squares): %lld of %lld rows differ\n",
              (long long)rows_differ, (long long)T);
  report(rows_differ > 0, "rmsnorm negative control sees the summation order");
}

// Strided rows (aligned / unaligned padding) and per-head [T, heads, D] views in a qkv buffer.
void test_rmsnorm_views() {
  const lockstep::RmsNormConfig cfg{1e-5f};
  for (int64_t pad : {int64_t(5), int64_t(8)}) {
    for (int64_t H : {int64_t(136), int64_t(4096)}) {
      if (g_quick && H > 136) continue;
      const int64_t T = 37, ld = H + pad;
      Tensor xb(DType::kBF16, {T, ld}), rb(DType::kBF16, {T, ld}), w(DType::kBF16, {H});
      fill_bf16(xb.ptr<bf16>(), size_t(T * ld), 2.0f);
      fill_bf16(rb.ptr<bf16>(), size_t(T * ld), 2.0f);
      fill_bf16(w.ptr<bf16>(), size_t(H), 1.0f);
      Tensor yb(DType::kBF16, {T, ld}), sb(DType::kBF16, {T, ld});
      std::memset(yb.data(), 0xA5, size_t(yb.nbytes()));
      std::memset(sb.data(), 0xA5, size_t(sb.nbytes()));
      auto hv = [&](const Tensor& t) {
        return view(t.data(), DType::kBF16, {T, H}, {ld, 1}, Device::kCPU);
      };
      lockstep::cpu::rmsnorm_residual(hv(xb), hv(rb), w.view(), cfg, hv(sb), hv(yb));
      DevPool d;
      const size_t nb = size_t(xb.nbytes());
      void* dx = d.upload(xb.data(), nb);
      void* dr = d.upload(rb.data(), nb);
      void* dw = d.upload(w.data(), size_t(w.nbytes()));
      void* dy = d.alloc(nb);
      void* ds = d.alloc(nb);
      auto dv = [&](void* p) { return view(p, DType::kBF16, {T, H}, {ld, 1}); };
      lockstep::cuda::rmsnorm_residual(dv(dx), dv(dr), view(dw, DType::kBF16, {H}), cfg, dv(ds),
                                       dv(dy));
      const std::string tag = " H=" + std::to_string(H) + " row stride " + std::to_string(ld);
      bitwise("rmsnorm_residual strided y (padding untouched)" + tag, download(dy, nb).data(),
              yb.data(), size_t(T * ld), 2);
      bitwise("rmsnorm_residual strided residual_out" + tag, download(ds, nb).data(), sb.data(),
              size_t(T * ld), 2);
    }
  }
  // Qwen3 q/k norm: [T, heads, D] views of q and k inside qkv [T, (Hq + 2·Hkv)·D].
  const int64_t T = g_quick ? 5 : 111, Hq = 8, Hkv = 2, D = 128, ld = (Hq + 2 * Hkv) * D;
  Tensor qkv(DType::kBF16, {T, ld}), w(DType::kBF16, {D});
  fill_bf16(qkv.ptr<bf16>(), size_t(T * ld), 1.5f);
  fill_bf16(w.ptr<bf16>(), size_t(D), 1.0f);
  Tensor out(DType::kBF16, {T, ld});
  std::memset(out.data(), 0xA5, size_t(out.nbytes()));
  const TensorView hq = view(qkv.data(), DType::kBF16, {T, Hq, D}, {ld, D, 1}, Device::kCPU);
  const TensorView hk =
      view(qkv.ptr<bf16>() + Hq * D, DType::kBF16, {T, Hkv, D}, {ld, D, 1}, Device::kCPU);
  const TensorView oq = view(out.data(), DType::kBF16, {T, Hq, D}, {ld, D, 1}, Device::kCPU);
  const TensorView ok =
      view(out.ptr<bf16>() + Hq * D, DType::kBF16, {T, Hkv, D}, {ld, D, 1}, Device::kCPU);
  lockstep::cpu::rmsnorm(hq, w.view(), cfg, oq);
  lockstep::cpu::rmsnorm(hk, w.view(), cfg, ok);
  DevPool d;
  const size_t nb = size_t(qkv.nbytes());
  void* dq = d.upload(qkv.data(), nb);
  void* dout = d.alloc(nb);
  void* dw = d.upload(w.data(), size_t(w.nbytes()));
  const TensorView dwv = view(dw, DType::kBF16, {D});
  lockstep::cuda::rmsnorm(on(hq, dq, qkv.data()), dwv, cfg, on(oq, dout, out.data()));
  lockstep::cuda::rmsnorm(on(hk, dq, qkv.data()), dwv, cfg, on(ok, dout, out.data()));
  bitwise("rmsnorm per-head q/k views inside qkv (v untouched)", download(dout, nb).data(),
          out.data(), size_t(T * ld), 2);
  // In place on the q heads of the qkv buffer.
  lockstep::cuda::rmsnorm(on(hq, dq, qkv.data()), dwv, cfg, on(hq, dq, qkv.data()));
  const std::vector<uint8_t> g = download(dq, nb);
  bool same = true;
  for (int64_t t = 0; t < T; ++t)
    same = same &&
           std::memcmp(g.data() + t * ld * 2, out.ptr<bf16>() + t * ld, size_t(Hq * D) * 2) == 0 &&
           std::memcmp(g.data() + (t * ld + Hq * D) * 2, qkv.ptr<bf16>() + t * ld + Hq * D,
                       size_t(2 * Hkv * D) * 2) == 0;
  report(same, "rmsnorm per-head in place inside qkv");
}

void test_rmsnorm_errors() {
  const lockstep::RmsNormConfig cfg{1e-6f};
  DevPool d;
  const int64_t T = 4, H = 16;
  void* a = d.alloc(size_t(T * H) * 2);
  void* b = d.alloc(size_t(T * H) * 2);
  void* wv = d.alloc(size_t(H) * 2);
  const TensorView x = view(a, DType::kBF16, {T, H}), y = view(b, DType::kBF16, {T, H}),
                   w = view(wv, DType::kBF16, {H});
  Tensor hx(DType::kBF16, {T, H});
  expect_error(
      "rmsnorm x on the host", [&] { lockstep::cuda::rmsnorm(hx.view(), w, cfg, y); },
      "expected device cuda");
  expect_error(
      "rmsnorm weight shape",
      [&] { lockstep::cuda::rmsnorm(x, view(wv, DType::kBF16, {H - 1}), cfg, y); }, "'weight'");
  expect_error(
      "rmsnorm y dtype",
      [&] {
        lockstep::cuda::rmsnorm(x, w, cfg, view(b, DType::kF32, {T, H}));
      },
      "'y'");
  expect_error(
      "rmsnorm y shape",
      [&] {
        lockstep::cuda::rmsnorm(x, w, cfg, view(b, DType::kBF16, {T, H + 1}));
      },
      "'y'");
  expect_error(
      "rmsnorm x last-dim stride",
      [&] {
        lockstep::cuda::rmsnorm(view(a, DType::kBF16, {T, H / 2}, {H, 2}),
                                view(wv, DType::kBF16, {H / 2}), cfg,
                                view(b, DType::kBF16, {T, H / 2}));
      },
      "stride 1");
  expect_error(
      "rmsnorm x 1-D", [&] { lockstep::cuda::rmsnorm(view(a, DType::kBF16, {H}), w, cfg, y); },
      "'x'");
  expect_error(
      "rmsnorm eps < 0", [&] { lockstep::cuda::rmsnorm(x, w, lockstep::RmsNormConfig{-1.0f}, y); },
      "eps");
  expect_error(
      "rmsnorm_residual residual_out == y",
      [&] { lockstep::cuda::rmsnorm_residual(x, x, w, cfg, y, y); }, "same memory");
  expect_error(
      "rmsnorm H = 0",
      [&] {
        lockstep::cuda::rmsnorm(view(a, DType::kBF16, {T, 0}), view(wv, DType::kBF16, {0}), cfg,
                                view(b, DType::kBF16, {T, 0}));
      },
      "last dimension >= 1");
  // T = 0 is a valid no-op.
  lockstep::cuda::rmsnorm(view(a, DType::kBF16, {0, H}), w, cfg, view(b, DType::kBF16, {0, H}));
  report(true, "rmsnorm T = 0 no-op");
}

// ---- RoPE --------------------------------------------------------------------------------------

// The table of head_dim D over positions [0, P).
lockstep::RopeTable rope_table(int64_t D, int64_t P) {
  lockstep::RopeConfig rc;
  rc.head_dim = D;
  rc.max_positions = P;
  return lockstep::RopeTable::build(rc);
}

void test_rope(int64_t T, int64_t heads, int64_t D, bool pos32, int64_t pos_stride) {
  const lockstep::RopeTable table = rope_table(D, 40960);
  const int64_t half = D / 2;
  // x = q heads inside a qkv-like buffer [T, (heads + 2)·D]; y strided the same way.
  const int64_t ld = (heads + 2) * D;
  Tensor xb(DType::kBF16, {T, ld});
  fill_bf16(xb.ptr<bf16>(), size_t(T * ld), 3.0f);
  xb.ptr<bf16>()[5 % D] = bf16{0xffc3};
  if (T > 1) xb.ptr<bf16>()[ld + 7 % D] = bf16{0x7f80};
  Tensor pos(pos32 ? DType::kI32 : DType::kI64, {T * pos_stride});
  std::uniform_int_distribution<int64_t> pd(0, table.config.max_positions - 1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = t < 4 ? t : pd(g_rng);
    if (pos32) {
      pos.ptr<int32_t>()[t * pos_stride] = int32_t(p);
    } else {
      pos.ptr<int64_t>()[t * pos_stride] = p;
    }
  }
  const TensorView hpos = view(pos.data(), pos.dtype(), {T}, {pos_stride}, Device::kCPU);
  const TensorView hx = view(xb.data(), DType::kBF16, {T, heads, D}, {ld, D, 1}, Device::kCPU);
  Tensor yb(DType::kBF16, {T, ld});
  std::memset(yb.data(), 0xA5, size_t(yb.nbytes()));
  const TensorView hy = view(yb.data(), DType::kBF16, {T, heads, D}, {ld, D, 1}, Device::kCPU);
  lockstep::cpu::rope(hx, hpos, table, hy);

  DevPool d;
  const size_t nb = size_t(xb.nbytes());
  void* dx = d.upload(xb.data(), nb);
  void* dy = d.alloc(nb);
  void* dp = d.upload(pos.data(), size_t(pos.nbytes()));
  void* dc = d.upload(table.cos.data(), table.cos.size() * 4);
  void* dsn = d.upload(table.sin.data(), table.sin.size() * 4);
  const TensorView vc = view(dc, DType::kF32, {table.config.max_positions, half});
  const TensorView vs = view(dsn, DType::kF32, {table.config.max_positions, half});
  const TensorView vp = on(hpos, dp, pos.data());
  lockstep::cuda::rope(on(hx, dx, xb.data()), vp, vc, vs, on(hy, dy, yb.data()));
  char tag[96];
  std::snprintf(tag, sizeof tag, " T=%lld heads=%lld D=%lld pos %s stride %lld", (long long)T,
                (long long)heads, (long long)D, pos32 ? "i32" : "i64", (long long)pos_stride);
  bitwise(std::string("rope (k/v columns untouched)") + tag, download(dy, nb).data(), yb.data(),
          size_t(T * ld), 2);
  // In place.
  lockstep::cuda::rope(on(hx, dx, xb.data()), vp, vc, vs, on(hx, dx, xb.data()));
  {
    const std::vector<uint8_t> g = download(dx, nb);
    bool same = true;
    for (int64_t t = 0; t < T; ++t)
      same = same && std::memcmp(g.data() + t * ld * 2, yb.ptr<bf16>() + t * ld,
                                 size_t(heads * D) * 2) == 0;
    report(same, std::string("rope in place") + tag);
  }
  // Invariance: the last token alone.
  if (T > 1) {
    void* dx1 = d.upload(xb.data(), nb);
    void* d1 = d.alloc(size_t(heads * D) * 2);
    lockstep::cuda::rope(on(hx, dx1, xb.data()).rows(T - 1, T), vp.rows(T - 1, T), vc, vs,
                         view(d1, DType::kBF16, {1, heads, D}));
    const std::vector<uint8_t> g = download(d1, size_t(heads * D) * 2);
    report(std::memcmp(g.data(), yb.ptr<bf16>() + (T - 1) * ld, size_t(heads * D) * 2) == 0,
           std::string("rope last token alone == in batch") + tag);
  }
}

// ---- q/k norm + RoPE in one launch (cuda::qk_norm_rope) --------------------------------------

// qk = the q|k columns of a q|k|v buffer [T, (nq + 2·nkv)·128]: cuda::qk_norm_rope must equal
// cpu::rmsnorm of the q heads (q_w) and of the k heads (k_w), then cpu::rope of all of them, in
// place, bit for bit over the whole buffer (the v columns untouched). Rows at several magnitudes
// (squares that underflow or overflow fp32), NaN / inf / zero heads; the last token alone == in
// the batch; a device position outside the table -> a canonical-NaN row (that token only).
void test_qk_norm_rope(int64_t T, int64_t nq, int64_t nkv, bool pos32) {
  constexpr int64_t D = 128;
  const lockstep::RopeTable table = rope_table(D, 40960);
  const lockstep::RmsNormConfig cfg{1e-6f};
  const int64_t heads = nq + nkv, ld = (heads + nkv) * D;
  Tensor xb(DType::kBF16, {T, ld});
  const float mags[] = {1.0f, 3.0f, 1e-20f, 1e20f, 1e-3f};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads + nkv; ++h)
      fill_bf16(xb.ptr<bf16>() + t * ld + h * D, D, mags[(t + h) % 5]);
  xb.ptr<bf16>()[3] = bf16{0xffc3};                           // NaN in q head 0 of token 0
  if (T > 1) xb.ptr<bf16>()[ld + nq * D + 5] = bf16{0x7f80};  // +inf in k head 0 of token 1
  if (T > 2) std::memset(xb.ptr<bf16>() + 2 * ld + D, 0, size_t(D) * 2);  // a zero q head
  Tensor wq(DType::kBF16, {D}), wk(DType::kBF16, {D});
  fill_bf16(wq.ptr<bf16>(), D, 1.0f);
  fill_bf16(wk.ptr<bf16>(), D, 1.0f);
  Tensor pos(pos32 ? DType::kI32 : DType::kI64, {T});
  std::uniform_int_distribution<int64_t> pd(0, table.config.max_positions - 1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = t < 3 ? t : pd(g_rng);
    if (pos32) {
      pos.ptr<int32_t>()[t] = int32_t(p);
    } else {
      pos.ptr<int64_t>()[t] = p;
    }
  }
  // CPU: the three ops, in place on a copy.
  Tensor yb(DType::kBF16, {T, ld});
  std::memcpy(yb.data(), xb.data(), size_t(xb.nbytes()));
  const TensorView hpos = view(pos.data(), pos.dtype(), {T}, {1}, Device::kCPU);
  const TensorView hq = view(yb.data(), DType::kBF16, {T, nq, D}, {ld, D, 1}, Device::kCPU);
  const TensorView hk =
      view(yb.ptr<bf16>() + nq * D, DType::kBF16, {T, nkv, D}, {ld, D, 1}, Device::kCPU);
  const TensorView hqk = view(yb.data(), DType::kBF16, {T, heads, D}, {ld, D, 1}, Device::kCPU);
  lockstep::cpu::rmsnorm(hq, view(wq.data(), DType::kBF16, {D}, {1}, Device::kCPU), cfg, hq);
  lockstep::cpu::rmsnorm(hk, view(wk.data(), DType::kBF16, {D}, {1}, Device::kCPU), cfg, hk);
  lockstep::cpu::rope(hqk, hpos, table, hqk);

  DevPool d;
  const size_t nb = size_t(xb.nbytes());
  void* dx = d.upload(xb.data(), nb);
  void* dwq = d.upload(wq.data(), size_t(D) * 2);
  void* dwk = d.upload(wk.data(), size_t(D) * 2);
  void* dp = d.upload(pos.data(), size_t(pos.nbytes()));
  void* dc = d.upload(table.cos.data(), table.cos.size() * 4);
  void* dsn = d.upload(table.sin.data(), table.sin.size() * 4);
  const TensorView vc = view(dc, DType::kF32, {table.config.max_positions, D / 2});
  const TensorView vs = view(dsn, DType::kF32, {table.config.max_positions, D / 2});
  const TensorView vwq = view(dwq, DType::kBF16, {D}), vwk = view(dwk, DType::kBF16, {D});
  const TensorView vp = view(dp, pos.dtype(), {T});
  const TensorView vqk = view(dx, DType::kBF16, {T, heads, D}, {ld, D, 1});
  lockstep::cuda::qk_norm_rope(vqk, nq, vwq, vwk, cfg, vp, vc, vs);
  char tag[96];
  std::snprintf(tag, sizeof tag, " T=%lld nq=%lld nkv=%lld pos %s", (long long)T, (long long)nq,
                (long long)nkv, pos32 ? "i32" : "i64");
  bitwise(std::string("qk_norm_rope == rmsnorm q, rmsnorm k, rope (v untouched)") + tag,
          download(dx, nb).data(), yb.data(), size_t(T * ld), 2);
  // Invariance: the last token alone.
  if (T > 1) {
    void* d1 = d.upload(xb.ptr<bf16>() + (T - 1) * ld, size_t(ld) * 2);
    lockstep::cuda::qk_norm_rope(view(d1, DType::kBF16, {1, heads, D}, {ld, D, 1}), nq, vwq, vwk,
                                 cfg, vp.rows(T - 1, T), vc, vs);
    const std::vector<uint8_t> g = download(d1, size_t(ld) * 2);
    report(std::memcmp(g.data(), yb.ptr<bf16>() + (T - 1) * ld, size_t(ld) * 2) == 0,
           std::string("qk_norm_rope last token alone == in batch") + tag);
  }
  // A device position outside the table: that token's q and k heads are canonical NaN, the
  // others as before.
  if (T > 1) {
    void* dx2 = d.upload(xb.data(), nb);
    Tensor bad(pos.dtype(), {T});
    std::memcpy(bad.data(), pos.data(), size_t(pos.nbytes()));
    if (pos32) {
      bad.ptr<int32_t>()[1] = int32_t(table.config.max_positions);
    } else {
      bad.ptr<int64_t>()[1] = -1;
    }
    void* dpb = d.upload(bad.data(), size_t(bad.nbytes()));
    lockstep::cuda::qk_norm_rope(view(dx2, DType::kBF16, {T, heads, D}, {ld, D, 1}), nq, vwq, vwk,
                                 cfg, view(dpb, bad.dtype(), {T}), vc, vs);
    std::vector<uint8_t> g = download(dx2, nb);
    const auto* gb = reinterpret_cast<const uint16_t*>(g.data());
    bool nan_row = true;
    for (int64_t i = 0; i < heads * D; ++i) nan_row = nan_row && gb[ld + i] == 0x7FC0;
    report(nan_row, std::string("qk_norm_rope out-of-table position -> NaN heads") + tag);
    std::memcpy(g.data() + ld * 2, yb.ptr<bf16>() + ld, size_t(heads * D) * 2);
    report(std::memcmp(g.data(), yb.data(), nb) == 0,
           std::string("qk_norm_rope out-of-table position: other tokens unchanged") + tag);
  }
}

void test_qk_norm_rope_errors() {
  DevPool d;
  constexpr int64_t D = 128;
  const lockstep::RopeTable table = rope_table(D, 64);
  const lockstep::RmsNormConfig cfg{1e-6f};
  void* dx = d.alloc(size_t(4 * 6 * D) * 2);
  void* dw = d.alloc(size_t(D) * 2);
  void* dp = d.alloc(4 * 8);
  void* dc = d.upload(table.cos.data(), table.cos.size() * 4);
  void* dsn = d.upload(table.sin.data(), table.sin.size() * 4);
  const TensorView vc = view(dc, DType::kF32, {64, D / 2}),
                   vs = view(dsn, DType::kF32, {64, D / 2});
  const TensorView w = view(dw, DType::kBF16, {D}), p = view(dp, DType::kI64, {4});
  const TensorView x = view(dx, DType::kBF16, {4, 6, D});
  expect_error(
      "qk_norm_rope nq > heads", [&] { lockstep::cuda::qk_norm_rope(x, 7, w, w, cfg, p, vc, vs); },
      "'nq'");
  expect_error(
      "qk_norm_rope head_dim 64",
      [&] {
        lockstep::cuda::qk_norm_rope(view(dx, DType::kBF16, {4, 12, 64}), 6, w, w, cfg, p, vc, vs);
      },
      "qk");
  expect_error(
      "qk_norm_rope unaligned rows",
      [&] {
        lockstep::cuda::qk_norm_rope(view(dx, DType::kBF16, {2, 6, D}, {6 * D + 4, D, 1}), 4, w, w,
                                     cfg, view(dp, DType::kI64, {2}), vc, vs);
      },
      "16-byte");
  expect_error(
      "qk_norm_rope host qk",
      [&] {
        Tensor h(DType::kBF16, {4, 6, D});
        lockstep::cuda::qk_norm_rope(h.view(), 4, w, w, cfg, p, vc, vs);
      },
      "qk");
  expect_error(
      "qk_norm_rope weight of the wrong size",
      [&] { lockstep::cuda::qk_norm_rope(x, 4, view(dw, DType::kBF16, {64}), w, cfg, p, vc, vs); },
      "weight");
  expect_error(
      "qk_norm_rope positions of the wrong length",
      [&] { lockstep::cuda::qk_norm_rope(x, 4, w, w, cfg, view(dp, DType::kI64, {3}), vc, vs); },
      "positions");
}

void test_rope_bad_positions_and_errors() {
  const lockstep::RopeTable table = rope_table(8, 100);
  const int64_t T = 5, heads = 2, D = 8;
  Tensor x(DType::kBF16, {T, heads, D});
  fill_bf16(x.ptr<bf16>(), size_t(T * heads * D), 1.0f);
  Tensor pos(DType::kI64, {T});
  const int64_t pv[] = {3, 100, 7, -1, 99};  // 100 and -1 are outside the table
  std::memcpy(pos.data(), pv, sizeof pv);
  Tensor posv(DType::kI64, {T});
  const int64_t pvv[] = {3, 0, 7, 0, 99};
  std::memcpy(posv.data(), pvv, sizeof pvv);
  Tensor ref(DType::kBF16, {T, heads, D});
  lockstep::cpu::rope(x.view(), posv.view(), table, ref.view());
  for (int64_t t : {int64_t(1), int64_t(3)})
    for (int64_t i = 0; i < heads * D; ++i) ref.ptr<bf16>()[t * heads * D + i] = bf16{0x7FC0};
  DevPool d;
  void* dx = d.upload(x.data(), size_t(x.nbytes()));
  void* dy = d.alloc(size_t(x.nbytes()));
  void* dp = d.upload(pos.data(), size_t(pos.nbytes()));
  void* dc = d.upload(table.cos.data(), table.cos.size() * 4);
  void* dsn = d.upload(table.sin.data(), table.sin.size() * 4);
  const TensorView vx = view(dx, DType::kBF16, {T, heads, D}),
                   vy = view(dy, DType::kBF16, {T, heads, D}), vp = view(dp, DType::kI64, {T}),
                   vc = view(dc, DType::kF32, {100, 4}), vs = view(dsn, DType::kF32, {100, 4});
  lockstep::cuda::rope(vx, vp, vc, vs, vy);
  bitwise("rope: device positions outside the table give canonical-NaN rows",
          download(dy, size_t(x.nbytes())).data(), ref.data(), size_t(T * heads * D), 2);
  expect_error(
      "rope positions on the host", [&] { lockstep::cuda::rope(vx, pos.view(), vc, vs, vy); },
      "'positions'");
  expect_error(
      "rope cos shape",
      [&] {
        lockstep::cuda::rope(vx, vp, view(dc, DType::kF32, {100, 8}), vs, vy);
      },
      "'cos'");
  expect_error(
      "rope sin rows",
      [&] {
        lockstep::cuda::rope(vx, vp, vc, view(dsn, DType::kF32, {99, 4}), vy);
      },
      "'sin'");
  expect_error(
      "rope odd head_dim",
      [&] {
        lockstep::cuda::rope(view(dx, DType::kBF16, {T, heads, 7}), vp, vc, vs,
                             view(dy, DType::kBF16, {T, heads, 7}));
      },
      "even");
  expect_error(
      "rope y shape",
      [&] {
        lockstep::cuda::rope(vx, vp, vc, vs, view(dy, DType::kBF16, {T, 1, D}));
      },
      "'y'");
  expect_error(
      "rope positions dtype",
      [&] { lockstep::cuda::rope(vx, view(dp, DType::kF32, {T}), vc, vs, vy); }, "'positions'");
}

// ---- SiLU-and-mul -------------------------------------------------------------------------------

void test_silu() {
  // Every gate bit pattern against special up values, plus random rows; gate/up = the two halves
  // of a fused [T, 2I] buffer (strided views), compared with cpu::silu_and_mul.
  const uint16_t ups[] = {0x3f80, 0xbf80, 0x4049, 0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x7fc1};
  const int64_t n_ups = int64_t(sizeof ups / sizeof ups[0]);
  const int64_t I = 65536, T = n_ups + (g_quick ? 4 : 64);
  Tensor gu(DType::kBF16, {T, 2 * I});
  for (int64_t t = 0; t < T; ++t) {
    bf16* row = gu.ptr<bf16>() + t * 2 * I;
    for (int64_t i = 0; i < I; ++i) {
      if (t < n_ups) {
        row[i] = bf16{uint16_t(i)};
        row[I + i] = bf16{ups[t]};
      } else {
        row[i] = rnd_bf16(4.0f);
        row[I + i] = rnd_bf16(4.0f);
      }
    }
  }
  Tensor out(DType::kBF16, {T, I});
  lockstep::cpu::silu_and_mul(gu.view(), out.view());
  DevPool d;
  void* dg = d.upload(gu.data(), size_t(gu.nbytes()));
  void* dout = d.alloc(size_t(out.nbytes()));
  const TensorView g = view(dg, DType::kBF16, {T, I}, {2 * I, 1});
  const TensorView u = view(static_cast<bf16*>(dg) + I, DType::kBF16, {T, I}, {2 * I, 1});
  lockstep::cuda::silu_mul(g, u, view(dout, DType::kBF16, {T, I}));
  bitwise("silu_mul (every bf16 gate x specials, + random; halves of gate_up)",
          download(dout, size_t(out.nbytes())).data(), out.data(), size_t(T * I), 2);
  // In place into the gate half.
  lockstep::cuda::silu_mul(g, u, g);
  const std::vector<uint8_t> h = download(dg, size_t(gu.nbytes()));
  bool same = true;
  for (int64_t t = 0; t < T && same; ++t)
    same = std::memcmp(h.data() + t * 2 * I * 2, out.ptr<bf16>() + t * I, size_t(I) * 2) == 0;
  report(same, "silu_mul in place (out = gate)");
}

void test_silu_odd() {
  for (int64_t I : {int64_t(1), int64_t(3), int64_t(17), int64_t(111)}) {
    const int64_t T = 13, lg = I + 3, lu = I + 1, lo = I + 2;
    Tensor gb(DType::kBF16, {T, lg}), ub(DType::kBF16, {T, lu}), ob(DType::kBF16, {T, lo});
    fill_bf16(gb.ptr<bf16>(), size_t(T * lg), 3.0f);
    fill_bf16(ub.ptr<bf16>(), size_t(T * lu), 3.0f);
    std::memset(ob.data(), 0xA5, size_t(ob.nbytes()));
    auto hv = [&](const Tensor& t, int64_t ld) {
      return view(t.data(), DType::kBF16, {T, I}, {ld, 1}, Device::kCPU);
    };
    lockstep::cpu::silu_mul(hv(gb, lg), hv(ub, lu), hv(ob, lo));
    DevPool d;
    void* dg = d.upload(gb.data(), size_t(gb.nbytes()));
    void* du = d.upload(ub.data(), size_t(ub.nbytes()));
    void* dout = d.alloc(size_t(ob.nbytes()));
    lockstep::cuda::silu_mul(view(dg, DType::kBF16, {T, I}, {lg, 1}),
                             view(du, DType::kBF16, {T, I}, {lu, 1}),
                             view(dout, DType::kBF16, {T, I}, {lo, 1}));
    bitwise("silu_mul strided I=" + std::to_string(I), download(dout, size_t(ob.nbytes())).data(),
            ob.data(), size_t(T * lo), 2);
    if (I == 111) {
      DevPool e;
      expect_error(
          "silu_mul up shape",
          [&] {
            lockstep::cuda::silu_mul(view(dg, DType::kBF16, {T, I}, {lg, 1}),
                                     view(du, DType::kBF16, {T, I - 1}, {lu, 1}),
                                     view(dout, DType::kBF16, {T, I}, {lo, 1}));
          },
          "'up'");
      expect_error(
          "silu_mul gate on the host",
          [&] {
            lockstep::cuda::silu_mul(hv(gb, lg), view(du, DType::kBF16, {T, I}, {lu, 1}),
                                     view(dout, DType::kBF16, {T, I}, {lo, 1}));
          },
          "expected device cuda");
      expect_error(
          "silu_mul I = 0",
          [&] {
            lockstep::cuda::silu_mul(view(dg, DType::kBF16, {T, 0}), view(du, DType::kBF16, {T, 0}),
                                     view(dout, DType::kBF16, {T, 0}));
          },
          "last dimension >= 1");
      expect_error(
          "silu_mul out dtype",
          [&] {
            lockstep::cuda::silu_mul(view(dg, DType::kBF16, {T, I}, {lg, 1}),
                                     view(du, DType::kBF16, {T, I}, {lu, 1}),
                                     view(dout, DType::kF32, {T, I}, {lo, 1}));
          },
          "'out'");
    }
  }
}

// ---- Embedding ---------------------------------------------------------------------------------

void test_embedding() {
  const int64_t V = 1000, H = 136, T = g_quick ? 37 : 300;
  // Strided table rows (H + 4) with random bit patterns (NaN payloads included).
  const int64_t lt = H + 4;
  Tensor table(DType::kBF16, {V, lt});
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  for (int64_t i = 0; i < V * lt; ++i) table.ptr<bf16>()[i] = bf16{uint16_t(bits(g_rng))};
  const TensorView ht = view(table.data(), DType::kBF16, {V, H}, {lt, 1}, Device::kCPU);
  // i32 ids with stride 3.
  Tensor ids(DType::kI32, {T * 3});
  std::uniform_int_distribution<int32_t> pick(0, int32_t(V - 1));
  for (int64_t t = 0; t < T; ++t) ids.ptr<int32_t>()[t * 3] = pick(g_rng);
  ids.ptr<int32_t>()[0] = 0;
  ids.ptr<int32_t>()[3] = int32_t(V - 1);
  const TensorView hids = view(ids.data(), DType::kI32, {T}, {3}, Device::kCPU);
  const int64_t lo = H + 2;
  Tensor ref(DType::kBF16, {T, lo});
  std::memset(ref.data(), 0xA5, size_t(ref.nbytes()));
  const TensorView href = view(ref.data(), DType::kBF16, {T, H}, {lo, 1}, Device::kCPU);
  lockstep::cpu::embedding(hids, ht, href);

  DevPool d;
  void* dt = d.upload(table.data(), size_t(table.nbytes()));
  void* di = d.upload(ids.data(), size_t(ids.nbytes()));
  void* dout = d.alloc(size_t(ref.nbytes()));
  const TensorView vt = on(ht, dt, table.data()), vi = on(hids, di, ids.data()),
                   vo = on(href, dout, ref.data());
  lockstep::cuda::embedding(vi, vt, vo);
  bitwise("embedding (strided i32 ids, table, out; random bit patterns)",
          download(dout, size_t(ref.nbytes())).data(), ref.data(), size_t(T * lo), 2);

  for (int world : {1, 2, 3, 4, 8}) {
    std::vector<void*> parts;
    std::vector<TensorView> pviews;
    for (int r = 0; r < world; ++r) {
      const lockstep::VocabShard s = lockstep::vocab_shard(V, r, world);
      Tensor part(DType::kBF16, {T, H});
      lockstep::cpu::embedding_vocab_parallel(hids, ht.rows(s.begin, s.end), s, V, part.view());
      void* dp = d.alloc(size_t(part.nbytes()));
      lockstep::cuda::embedding_vocab_parallel(vi, vt.rows(s.begin, s.end), s, V,
                                               view(dp, DType::kBF16, {T, H}));
      bitwise("embedding partial rank " + std::to_string(r) + "/" + std::to_string(world),
              download(dp, size_t(part.nbytes())).data(), part.data(), size_t(T * H), 2);
      parts.push_back(dp);
      pviews.push_back(view(dp, DType::kBF16, {T, H}));
    }
    void* dc = d.alloc(size_t(ref.nbytes()));
    lockstep::cuda::embedding_combine(pviews, on(href, dc, ref.data()));
    bitwise("embedding combine TP=" + std::to_string(world) + " == cpu embedding TP=1",
            download(dc, size_t(ref.nbytes())).data(), ref.data(), size_t(T * lo), 2);
    // In place into partials[0].
    lockstep::cuda::embedding_combine(pviews, pviews[0]);
    const std::vector<uint8_t> g = download(parts[0], size_t(T * H) * 2);
    bool same = true;
    for (int64_t t = 0; t < T; ++t)
      same =
          same && std::memcmp(g.data() + t * H * 2, ref.ptr<bf16>() + t * lo, size_t(H) * 2) == 0;
    report(same, "embedding combine in place TP=" + std::to_string(world));
  }

  // Invariance: one id alone.
  {
    void* d1 = d.alloc(size_t(H) * 2);
    lockstep::cuda::embedding(vi.rows(T - 1, T), vt, view(d1, DType::kBF16, {1, H}));
    const std::vector<uint8_t> g = download(d1, size_t(H) * 2);
    report(std::memcmp(g.data(), ref.ptr<bf16>() + (T - 1) * lo, size_t(H) * 2) == 0,
           "embedding last id alone == in batch");
  }
  // Invalid device ids: canonical-NaN rows.
  {
    const int64_t bad[] = {5, -1, V, 7};
    Tensor bids(DType::kI64, {4});
    std::memcpy(bids.data(), bad, sizeof bad);
    void* db = d.upload(bids.data(), sizeof bad);
    void* d4 = d.alloc(size_t(4 * H) * 2);
    lockstep::cuda::embedding(view(db, DType::kI64, {4}), vt, view(d4, DType::kBF16, {4, H}));
    const std::vector<uint8_t> g = download(d4, size_t(4 * H) * 2);
    const auto* gb = reinterpret_cast<const uint16_t*>(g.data());
    bool ok = true;
    for (int64_t k = 0; k < H; ++k) {
      ok = ok && gb[1 * H + k] == 0x7FC0 && gb[2 * H + k] == 0x7FC0;
      const uint16_t v5 = table.ptr<bf16>()[5 * lt + k].bits;
      ok = ok && gb[k] == (((v5 & 0x7fff) > 0x7f80) ? 0x7FC0 : v5);
    }
    report(ok, "embedding: device ids outside [0, V) give canonical-NaN rows");
  }
  // Errors.
  expect_error(
      "embedding ids on the host", [&] { lockstep::cuda::embedding(hids, vt, vo); }, "'ids'");
  expect_error(
      "embedding out shape",
      [&] {
        lockstep::cuda::embedding(vi, vt, view(dout, DType::kBF16, {T, H + 1}));
      },
      "'out'");
  expect_error(
      "embedding_vocab_parallel shard outside vocab",
      [&] {
        lockstep::cuda::embedding_vocab_parallel(vi, vt, lockstep::VocabShard{0, V + 1}, V,
                                                 view(dout, DType::kBF16, {T, H}));
      },
      "'shard'");
  expect_error(
      "embedding_vocab_parallel table rows != shard size",
      [&] {
        lockstep::cuda::embedding_vocab_parallel(vi, vt.rows(0, 10), lockstep::VocabShard{0, 11}, V,
                                                 view(dout, DType::kBF16, {T, H}));
      },
      "'table'");
  expect_error(
      "embedding_combine no partials",
      [&] {
        lockstep::cuda::embedding_combine({}, view(dout, DType::kBF16, {T, H}));
      },
      "at least one");
  expect_error(
      "embedding_combine partial shape",
      [&] {
        lockstep::cuda::embedding_combine({view(dout, DType::kBF16, {T, H - 1})},
                                          view(dout, DType::kBF16, {T, H}));
      },
      "'partials[0]'");
}

}  // namespace

// The scenario checks of test_parity's elementwise section (every bf16 gate, magnitudes, views,
// in place, negative control, out-of-range device ids / positions, argument checks).
void run_elementwise_checks() {
  const std::vector<int64_t> hs =
      g_quick ? std::vector<int64_t>{1, 3, 17, 136}
              : std::vector<int64_t>{1, 3, 17, 64, 111, 128, 136, 1000, 4096, 5120};
  for (int64_t H : hs) test_rmsnorm(H);
  test_rmsnorm_negative_control();
  std::printf("rmsnorm: %d passed, %d failed so far\n", g_pass, g_fail);
  std::fflush(stdout);
  test_rmsnorm_views();
  test_rmsnorm_errors();
  test_rope(g_quick ? 17 : 512, 8, 128, false, 1);
  test_rope(17, 3, 2, true, 2);
  test_rope(g_quick ? 9 : 111, 5, 6, true, 1);
  test_rope_bad_positions_and_errors();
  test_qk_norm_rope(g_quick ? 9 : 300, 32, 8, false);
  test_qk_norm_rope(g_quick ? 5 : 77, 4, 1, true);
  test_qk_norm_rope(1, 2, 2, false);
  test_qk_norm_rope_errors();
  test_silu();
  test_silu_odd();
  test_embedding();
}
