// Attention backward on the CPU (docs/contract.md §B.9), packed varlen, causal, GQA. One task per
// (sequence, kv head) walks the sequence's 64-key blocks ascending; for each block and each query
// head of the group (ascending) it recomputes the forward's scores (attn_detail::block_scores),
// P = exp2(x ⊖ λ), dP, dS, rounds Pb / dSb to bf16 and continues three MMA-model chains:
//   dq_i  over the keys, block by block (keys 0 … 64⌊i/64⌋+63),
//   dv_j, dk_j  over the group's heads ascending, each over the rows 64⌊j/64⌋ … end of the
//         sequence in 16-row k-blocks aligned to the sequence start.
// Every output element is owned by one task and computed in this fixed order, so the packing of
// the sequences and the thread count never change a bit. Only [rows, 64] strips of P / dS exist.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "contract/checks.h"
#include "core/math.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cpu/attention_engine.h"
#include "cpu/mma_batch.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {
namespace {

constexpr int64_t kB = kAttnBlock;         // keys per block: the extent unit of every chain
constexpr int64_t kR = kMmaK;              // rows per k-block of the dk / dv chains
constexpr float kLog2ef = 0x1.715476p+0f;  // log2(e) rounded to fp32: λ = lse ⊗ log2e_f

// A [T, H, D] view (last dim contiguous) as a pointer and its two outer strides.
template <typename E>
struct Rows {
  E* p = nullptr;
  int64_t s0 = 0, s1 = 0;
  explicit Rows(const TensorView& t) : p(t.ptr<E>()), s0(t.stride[0]), s1(t.stride[1]) {}
  E* at(int64_t t, int64_t h) const { return p + t * s0 + h * s1; }
};

struct Problem {
  int64_t G, D, Dp;  // heads per kv head, head_dim, head_dim rounded up to a power of two
  float sigma;       // the forward's score scale (AttentionConfig::scale_log2)
  float scale_f;     // fp32(resolved softmax_scale): the final factor of dq and dk
  Rows<const bf16> q, k, v, out, dout;
  Rows<const float> lse;  // [T, Hq]: s0 = token stride, s1 = head stride
  Rows<float> dq, dk, dv;
};

// δ = halving tree over d of fp32(dout[d]) ⊗ fp32(out[d]), D padded to Dp with +0. Uses t[Dp].
float row_delta(const bf16* dout, const bf16* out, int64_t D, int64_t Dp, float* t) {
  for (int64_t d = 0; d < D; ++d) t[d] = bf16_to_f32(dout[d]) * bf16_to_f32(out[d]);
  for (int64_t d = D; d < Dp; ++d) t[d] = 0.0f;
  for (int64_t w = Dp / 2; w >= 1; w /= 2) {
    for (int64_t j = 0; j < w; ++j) t[j] = t[j] + t[j + w];
  }
  return t[0];
}

struct Scratch {
  std::vector<bf16> qt, dot;         // [G, D, Lp]: q, dout of the sequence transposed, +0 past L
  std::vector<float> delta, lambda;  // [G, L]
  std::vector<bf16> kblk, vblk, kt;  // [64, D], [64, D], [D, 64] (+0 past the sequence end)
  std::vector<bf16> pt, dst;         // [64, R]: Pb, dSb of one head's strip, transposed
  std::vector<float> tree;           // [Dp]
};

// dq, dk, dv of sequence tokens [t0, t0 + L) and kv head g.
void run_task(const Problem& pr, int64_t t0, int64_t L, int64_t g, Scratch& sc) {
  const int64_t G = pr.G, D = pr.D;
  const int64_t Lp = (L + kR - 1) / kR * kR;
  sc.qt.assign(size_t(G * D * Lp), bf16{0});
  sc.dot.assign(size_t(G * D * Lp), bf16{0});
  sc.delta.resize(size_t(G * L));
  sc.lambda.resize(size_t(G * L));
  sc.kblk.resize(size_t(kB * D));
  sc.vblk.resize(size_t(kB * D));
  sc.kt.resize(size_t(D * kB));
  sc.pt.resize(size_t(kB * Lp));
  sc.dst.resize(size_t(kB * Lp));
  sc.tree.resize(size_t(pr.Dp));
  for (int64_t e = 0; e < G; ++e) {
    const int64_t h = g * G + e;
    bf16* qt = sc.qt.data() + e * D * Lp;
    bf16* dot = sc.dot.data() + e * D * Lp;
    for (int64_t i = 0; i < L; ++i) {
      const bf16* qi = pr.q.at(t0 + i, h);
      const bf16* doi = pr.dout.at(t0 + i, h);
      for (int64_t d = 0; d < D; ++d) {
        qt[d * Lp + i] = qi[d];
        dot[d * Lp + i] = doi[d];
      }
      sc.delta[size_t(e * L + i)] = row_delta(doi, pr.out.at(t0 + i, h), D, pr.Dp, sc.tree.data());
      sc.lambda[size_t(e * L + i)] = *pr.lse.at(t0 + i, h) * kLog2ef;
    }
  }
  float x[kB], dp[kB];
  bf16 dsrow[kB];
  for (int64_t j0 = 0; j0 < L; j0 += kB) {
    const int64_t nk = std::min(kB, L - j0);  // keys of this block inside the sequence
    const int64_t R = Lp - j0;                // rows j0 … Lp-1 of the dk / dv chains
    for (int64_t jj = 0; jj < nk; ++jj) {
      std::memcpy(sc.kblk.data() + jj * D, pr.k.at(t0 + j0 + jj, g), size_t(D) * sizeof(bf16));
      std::memcpy(sc.vblk.data() + jj * D, pr.v.at(t0 + j0 + jj, g), size_t(D) * sizeof(bf16));
    }
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t jj = 0; jj < kB; ++jj)
        sc.kt[size_t(d * kB + jj)] = jj < nk ? sc.kblk[size_t(jj * D + d)] : bf16{0};
    }
    for (int64_t e = 0; e < G; ++e) {
      const int64_t h = g * G + e;
      // The head's strip: rows i = j0 + r, keys j = j0 + jj. Masked (j > i) and rows past the
      // end: Pb = dSb = +0.
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = j0 + r;
        if (i >= L) {
          for (int64_t jj = 0; jj < nk; ++jj) {
            sc.pt[size_t(jj * R + r)] = bf16{0};
            sc.dst[size_t(jj * R + r)] = bf16{0};
          }
          continue;
        }
        const int64_t nv = std::min(nk, r + 1);  // keys j0 … i
        attn_detail::block_scores(pr.q.at(t0 + i, h), sc.kblk.data(), D, nv, D, pr.sigma, x);
        mma_chain_rows_bf16(pr.dout.at(t0 + i, h), sc.vblk.data(), D, nv, D, nullptr, dp);
        const float lam = sc.lambda[size_t(e * L + i)], del = sc.delta[size_t(e * L + i)];
        for (int64_t jj = 0; jj < nv; ++jj) {
          const float p = ls_exp2f(x[jj] - lam);
          const float ds = p * (dp[jj] - del);
          sc.pt[size_t(jj * R + r)] = f32_to_bf16(p);
          dsrow[jj] = f32_to_bf16(ds);
          sc.dst[size_t(jj * R + r)] = dsrow[jj];
        }
        for (int64_t jj = nv; jj < kB; ++jj) {
          if (jj < nk) {
            sc.pt[size_t(jj * R + r)] = bf16{0};
            sc.dst[size_t(jj * R + r)] = bf16{0};
          }
          dsrow[jj] = bf16{0};
        }
        // dq_i: this block's four k-blocks of keys, continuing the chain of the blocks before.
        float* dqi = pr.dq.at(t0 + i, h);
        mma_chain_rows_bf16(dsrow, sc.kt.data(), kB, D, kB, j0 == 0 ? nullptr : dqi, dqi);
      }
      // dv_j, dk_j: this head's rows j0 … Lp-1, continuing the chain of the heads before.
      const bf16* dot = sc.dot.data() + e * D * Lp + j0;
      const bf16* qt = sc.qt.data() + e * D * Lp + j0;
      for (int64_t jj = 0; jj < nk; ++jj) {
        float* dvj = pr.dv.at(t0 + j0 + jj, g);
        float* dkj = pr.dk.at(t0 + j0 + jj, g);
        mma_chain_rows_bf16(sc.pt.data() + jj * R, dot, Lp, D, R, e == 0 ? nullptr : dvj, dvj);
        mma_chain_rows_bf16(sc.dst.data() + jj * R, qt, Lp, D, R, e == 0 ? nullptr : dkj, dkj);
      }
    }
    for (int64_t jj = 0; jj < nk; ++jj) {
      float* dvj = pr.dv.at(t0 + j0 + jj, g);
      float* dkj = pr.dk.at(t0 + j0 + jj, g);
      for (int64_t d = 0; d < D; ++d) {
        dvj[d] = canonical_f32(dvj[d]);
        dkj[d] = canonical_f32(dkj[d] * pr.scale_f);
      }
    }
  }
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t e = 0; e < G; ++e) {
      float* dqi = pr.dq.at(t0 + i, g * G + e);
      for (int64_t d = 0; d < D; ++d) dqi[d] = canonical_f32(dqi[d] * pr.scale_f);
    }
  }
}

}  // namespace

void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const contract::QShape qs = contract::check_attention_backward(
      "attention_backward_varlen", Device::kCPU, q, k, v, out, lse, dout, seqs, cfg, dq, dk, dv);
  const int64_t Hkv = k.shape[1], D = qs.D;
  int64_t Dp = 1;
  while (Dp < D) Dp *= 2;
  const Problem pr{.G = qs.Hq / Hkv,
                   .D = D,
                   .Dp = Dp,
                   .sigma = cfg.scale_log2(D),
                   .scale_f = float(cfg.resolved_scale(D)),
                   .q = Rows<const bf16>(q),
                   .k = Rows<const bf16>(k),
                   .v = Rows<const bf16>(v),
                   .out = Rows<const bf16>(out),
                   .dout = Rows<const bf16>(dout),
                   .lse = Rows<const float>(lse),
                   .dq = Rows<float>(dq),
                   .dk = Rows<float>(dk),
                   .dv = Rows<float>(dv)};
  // Tasks (sequence, kv head), longest first (scheduling only: each task owns its outputs).
  struct Task {
    int64_t t0, len, g;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < seqs.B(); ++b) {
    const int64_t t0 = seqs.cu()[size_t(b)], len = seqs.cu()[size_t(b + 1)] - t0;
    for (int64_t g = 0; g < Hkv && len > 0; ++g) tasks.push_back({t0, len, g});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.len > b.len; });
  const int64_t ntasks = int64_t(tasks.size());
  if (ntasks == 0) return;
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(num_threads(), ntasks), 1, [&](int64_t, int64_t) {
    Scratch sc;
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= ntasks) break;
      const Task& t = tasks[size_t(i)];
      run_task(pr, t.t0, t.len, t.g, sc);
    }
  });
}

}  // namespace lockstep::cpu
