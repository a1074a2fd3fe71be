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

// One part of a group task (§B.11): query rows at consecutive positions [pos0, pos0 + n), packed
// rows [row0, row0 + n). The prompt (pos0 = 0; an unshared sequence is a prompt with no
// completion) or one completion (pos0 = the prompt's length Lp).
struct Part {
  int64_t row0 = 0, pos0 = 0, n = 0;
  // The part's 16-row k-blocks: positions [base, end), rows outside [pos0, pos0 + n) being +0.
  int64_t base() const { return pos0 / kR * kR; }
  int64_t end() const { return (pos0 + n + kR - 1) / kR * kR; }
};

struct PartScratch {
  std::vector<bf16> qt, dot;         // [G, D, end - base]: q, dout transposed, +0 off the part
  std::vector<float> delta, lambda;  // [G, n]
  std::vector<bf16> kblk, vblk, kt;  // the part's 64-key block: [64, D], [64, D], [D, 64]
  int64_t nk = 0;                    // keys of the block the part's rows can see
};

struct Scratch {
  std::vector<PartScratch> parts;
  std::vector<bf16> pt, dst;  // [64, R]: Pb, dSb of one (head, part) strip, transposed
  std::vector<float> tree;    // [Dp]
};

// dq, dk, dv of one group and kv head g: parts[0] is the prompt (keys [0, Lp) at rows
// parts[0].row0 + j), parts[1..] its completions in order (completion c's key at position j >= Lp
// at row parts[c].row0 + j - Lp). Per 64-key block j0 and per head ascending, every part's rows
// from max(j0, base) in turn: the prompt keys' dk / dv chains run over the prompt's rows, then
// each completion's; a completion key's only over its completion's rows (§B.11).
void run_task(const Problem& pr, const std::vector<Part>& parts, int64_t g, Scratch& sc) {
  const int64_t G = pr.G, D = pr.D, Lp = parts[0].n, np = int64_t(parts.size());
  sc.parts.resize(size_t(np));
  sc.tree.resize(size_t(pr.Dp));
  int64_t kend = 0, rmax = 0;  // last key position + 1, longest strip
  for (int64_t p = 0; p < np; ++p) {
    const Part& pa = parts[size_t(p)];
    PartScratch& ps = sc.parts[size_t(p)];
    const int64_t W = pa.end() - pa.base();
    kend = std::max(kend, pa.pos0 + pa.n);
    rmax = std::max(rmax, W);
    ps.qt.assign(size_t(G * D * W), bf16{0});
    ps.dot.assign(size_t(G * D * W), bf16{0});
    ps.delta.resize(size_t(G * pa.n));
    ps.lambda.resize(size_t(G * pa.n));
    ps.kblk.resize(size_t(kB * D));
    ps.vblk.resize(size_t(kB * D));
    ps.kt.resize(size_t(D * kB));
    for (int64_t e = 0; e < G; ++e) {
      const int64_t h = g * G + e;
      bf16* qt = ps.qt.data() + e * D * W;
      bf16* dot = ps.dot.data() + e * D * W;
      for (int64_t i = 0; i < pa.n; ++i) {
        const int64_t t = pa.row0 + i, c = pa.pos0 + i - pa.base();
        const bf16* qi = pr.q.at(t, h);
        const bf16* doi = pr.dout.at(t, h);
        for (int64_t d = 0; d < D; ++d) {
          qt[d * W + c] = qi[d];
          dot[d * W + c] = doi[d];
        }
        ps.delta[size_t(e * pa.n + i)] = row_delta(doi, pr.out.at(t, h), D, pr.Dp, sc.tree.data());
        ps.lambda[size_t(e * pa.n + i)] = *pr.lse.at(t, h) * kLog2ef;
      }
    }
  }
  sc.pt.resize(size_t(kB * rmax));
  sc.dst.resize(size_t(kB * rmax));
  // The packed row holding key position j as seen by part p.
  auto key_row = [&](int64_t p, int64_t j) {
    return j < Lp ? parts[0].row0 + j : parts[size_t(p)].row0 + (j - Lp);
  };
  float x[kB], dp[kB];
  bf16 dsrow[kB];
  for (int64_t j0 = 0; j0 < kend; j0 += kB) {
    // Each part's view of the block: the prompt sees keys < Lp, a completion its prompt's and its
    // own.
    for (int64_t p = 0; p < np; ++p) {
      const Part& pa = parts[size_t(p)];
      PartScratch& ps = sc.parts[size_t(p)];
      ps.nk = std::clamp<int64_t>((p == 0 ? Lp : pa.pos0 + pa.n) - j0, 0, kB);
      if (pa.n == 0 || ps.nk == 0) continue;
      for (int64_t jj = 0; jj < ps.nk; ++jj) {
        const int64_t t = key_row(p, j0 + jj);
        std::memcpy(ps.kblk.data() + jj * D, pr.k.at(t, g), size_t(D) * sizeof(bf16));
        std::memcpy(ps.vblk.data() + jj * D, pr.v.at(t, g), size_t(D) * sizeof(bf16));
      }
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t jj = 0; jj < kB; ++jj)
          ps.kt[size_t(d * kB + jj)] = jj < ps.nk ? ps.kblk[size_t(jj * D + d)] : bf16{0};
      }
    }
    for (int64_t e = 0; e < G; ++e) {
      const int64_t h = g * G + e;
      for (int64_t p = 0; p < np; ++p) {
        const Part& pa = parts[size_t(p)];
        const PartScratch& ps = sc.parts[size_t(p)];
        const int64_t nk = ps.nk;
        if (pa.n == 0 || nk == 0) continue;
        const int64_t W = pa.end() - pa.base();
        const int64_t r0 = std::max(j0, pa.base());  // strip: positions r0 … end-1
        const int64_t R = pa.end() - r0;
        // The strip: row positions i = r0 + r, keys j = j0 + jj. Masked (j > i) and positions
        // off the part: Pb = dSb = +0.
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = r0 + r;
          if (i < pa.pos0 || i >= pa.pos0 + pa.n) {
            for (int64_t jj = 0; jj < nk; ++jj) {
              sc.pt[size_t(jj * R + r)] = bf16{0};
              sc.dst[size_t(jj * R + r)] = bf16{0};
            }
            continue;
          }
          const int64_t t = pa.row0 + (i - pa.pos0), ri = e * pa.n + (i - pa.pos0);
          const int64_t nv = std::min(nk, i - j0 + 1);  // keys j0 … i
          attn_detail::block_scores(pr.q.at(t, h), ps.kblk.data(), D, nv, D, pr.sigma, x);
          mma_chain_rows_bf16(pr.dout.at(t, h), ps.vblk.data(), D, nv, D, nullptr, dp);
          const float lam = ps.lambda[size_t(ri)], del = ps.delta[size_t(ri)];
          for (int64_t jj = 0; jj < nv; ++jj) {
            const float pv = ls_ex2_sfu(x[jj] - lam);
            const float ds = pv * (dp[jj] - del);
            sc.pt[size_t(jj * R + r)] = f32_to_bf16(pv);
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
          float* dqi = pr.dq.at(t, h);
          mma_chain_rows_bf16(dsrow, ps.kt.data(), kB, D, kB, j0 == 0 ? nullptr : dqi, dqi);
        }
        // dv_j, dk_j: this (head, part)'s rows, continuing the chain of the heads (and, for a
        // prompt key, the parts) before.
        const bf16* dot = ps.dot.data() + e * D * W + (r0 - pa.base());
        const bf16* qt = ps.qt.data() + e * D * W + (r0 - pa.base());
        for (int64_t jj = 0; jj < nk; ++jj) {
          const int64_t j = j0 + jj, t = key_row(p, j);
          const bool first = e == 0 && (j >= Lp || p == 0);
          float* dvj = pr.dv.at(t, g);
          float* dkj = pr.dk.at(t, g);
          mma_chain_rows_bf16(sc.pt.data() + jj * R, dot, W, D, R, first ? nullptr : dvj, dvj);
          mma_chain_rows_bf16(sc.dst.data() + jj * R, qt, W, D, R, first ? nullptr : dkj, dkj);
        }
      }
    }
    // The block's keys are complete: the prompt's, then each completion's own.
    for (int64_t p = 0; p < np; ++p) {
      const Part& pa = parts[size_t(p)];
      const int64_t k0 = std::max(j0, p == 0 ? int64_t(0) : Lp);
      const int64_t k1 = std::min(j0 + kB, p == 0 ? Lp : pa.pos0 + pa.n);
      for (int64_t j = k0; j < k1; ++j) {
        float* dvj = pr.dv.at(key_row(p, j), g);
        float* dkj = pr.dk.at(key_row(p, j), g);
        for (int64_t d = 0; d < D; ++d) {
          dvj[d] = canonical_f32(dvj[d]);
          dkj[d] = canonical_f32(dkj[d] * pr.scale_f);
        }
      }
    }
  }
  for (const Part& pa : parts) {
    for (int64_t i = 0; i < pa.n; ++i) {
      for (int64_t e = 0; e < G; ++e) {
        float* dqi = pr.dq.at(pa.row0 + i, g * G + e);
        for (int64_t d = 0; d < D; ++d) dqi[d] = canonical_f32(dqi[d] * pr.scale_f);
      }
    }
  }
}

// Every (group, kv head) task on the thread pool, costliest first (scheduling only: each task
// owns its outputs). groups[i]: the parts of group i (prompt first).
void run_groups(const Problem& pr, int64_t Hkv, const std::vector<std::vector<Part>>& groups) {
  struct Task {
    int64_t group, g, cost;
  };
  std::vector<Task> tasks;
  for (int64_t i = 0; i < int64_t(groups.size()); ++i) {
    int64_t cost = 0;
    for (const Part& pa : groups[size_t(i)]) cost += pa.n * (pa.pos0 + pa.n);
    for (int64_t g = 0; g < Hkv && cost > 0; ++g) tasks.push_back({i, g, cost});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const int64_t ntasks = int64_t(tasks.size());
  if (ntasks == 0) return;
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(num_threads(), ntasks), 1, [&](int64_t, int64_t) {
    Scratch sc;
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= ntasks) break;
      const Task& t = tasks[size_t(i)];
      run_task(pr, groups[size_t(t.group)], t.g, sc);
    }
  });
}

Problem make_problem(const contract::QShape& qs, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& out, const TensorView& lse,
                     const TensorView& dout, const AttentionConfig& cfg, const TensorView& dq,
                     const TensorView& dk, const TensorView& dv) {
  const int64_t D = qs.D;
  int64_t Dp = 1;
  while (Dp < D) Dp *= 2;
  return Problem{.G = qs.Hq / k.shape[1],
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
}

}  // namespace

void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const contract::QShape qs = contract::check_attention_backward(
      "attention_backward_varlen", Device::kCPU, q, k, v, out, lse, dout, seqs, cfg, dq, dk, dv);
  std::vector<std::vector<Part>> groups;
  for (int64_t b = 0; b < seqs.B(); ++b) {
    const int64_t t0 = seqs.cu()[size_t(b)];
    groups.push_back({Part{t0, 0, seqs.cu()[size_t(b + 1)] - t0}});
  }
  run_groups(make_problem(qs, q, k, v, out, lse, dout, cfg, dq, dk, dv), k.shape[1], groups);
}

void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const contract::QShape qs =
      contract::check_attention_backward("attention_backward_shared", Device::kCPU, q, k, v, out,
                                         lse, dout, segs.segments(), cfg, dq, dk, dv);
  std::vector<std::vector<Part>> groups;
  for (int64_t b = 0; b < segs.B(); ++b) {
    if (segs.prompt_of()[size_t(b)] >= 0) continue;
    std::vector<Part> parts{Part{segs.cu()[size_t(b)], 0, segs.len(b)}};
    for (int64_t c : segs.completions(b))
      parts.push_back(Part{segs.cu()[size_t(c)], segs.len(b), segs.len(c)});
    groups.push_back(std::move(parts));
  }
  run_groups(make_problem(qs, q, k, v, out, lse, dout, cfg, dq, dk, dv), k.shape[1], groups);
}

}  // namespace lockstep::cpu
