// Linear log-prob backward on the CPU, the executable form of docs/contract.md §B.8. Per token
// block (16 rows) and vocab tile the forward's logits are recomputed with the forward's own code
// (logprob_detail::tile_logits: the GEMM on [rows × tile] blocks, fp32), y = z / τ, and
// G = round_bf16(gy / τ) is materialized for a bounded chunk of blocks ([64, V_pad] bf16, never
// [T, V]). dh = the GEMM contract over the padded vocab in the forward's vocab segments (each
// segment zero-padded to a multiple of 16, one MMA chain per segment, segments combined by the
// tree); dW += one MMA k-block per token block of `order`, in canonical order. No result depends
// on the chunking, the thread count, or (dh) on the other rows.
#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "core/math.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cpu/backward/logprob_internal.h"
#include "cpu/logprob_internal.h"
#include "cpu/mma_batch.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::cpu {
namespace logprob_backward_detail {
namespace {

using logprob_detail::f32_at;
using logprob_detail::read_index;

// Rows [r0, r0 + n) of the micro-batch (n <= 16). in_order: a token block of `order`, whose rows
// take part in dW; the other blocks are rows no sequence covers (padding: dh only).
struct Block {
  int64_t r0 = 0, n = 0;
  bool in_order = false;
};

// The token blocks of `order` in canonical order (sequences by step index, then positions in
// blocks of 16), then the rows no sequence covers, in runs of at most 16.
std::vector<Block> token_blocks(const TokenOrder& order, int64_t T) {
  std::vector<Block> blocks;
  std::vector<char> covered(static_cast<size_t>(T), 0);
  for (const TokenSeq& s : order.seqs()) {
    for (int64_t p = 0; p < s.len; p += kTokenBlock)
      blocks.push_back({s.row + p, std::min<int64_t>(kTokenBlock, s.len - p), true});
    std::fill(covered.begin() + s.row, covered.begin() + s.row + s.len, char(1));
  }
  for (int64_t r = 0; r < T;) {
    if (covered[size_t(r)]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < T && !covered[size_t(e)] && e - r < kTokenBlock) ++e;
    blocks.push_back({r, e - r, false});
    r = e;
  }
  return blocks;
}

// Columns of G and of the re-laid-out Wᵀ: vocab segment k's entries at [k·seg_pad,
// k·seg_pad + seg_len), zeros up to (k + 1)·seg_pad, seg_pad = seg_len rounded up to 16. So the
// GEMM's own K layout (S equal segments of width/S, a multiple of 16) is exactly §B.8's.
// A vocab shard (segments [s0, s0 + sc)) lays out only its own segments, from column 0.
struct GLayout {
  int64_t seg_len = 0, seg_pad = 0, width = 0, s0 = 0;
  GLayout(const LogprobVocabLayout& lay, int seg_begin, int seg_count)
      : seg_len(lay.segment_len),
        seg_pad((lay.segment_len + kMmaK - 1) / kMmaK * kMmaK),
        width(seg_pad * seg_count),
        s0(seg_begin) {}
  int64_t col(int64_t v) const { return (v / seg_len - s0) * seg_pad + v % seg_len; }
};

// The per-token values of §B.8 that do not depend on v.
struct TokenGrad {
  float lse = 0, mu = 0, g_lp = 0, g_ent = 0;
  int64_t target = -1;
  bool ignored = false;
};

// G of one entry (v < V) from its forward logit z.
inline bf16 grad_entry(float z, bool is_target, const TokenGrad& tg, bool with_ent, float tau) {
  const float y = z / tau;
  const float p = ls_expf(y - tg.lse);
  // NOTE: an ignored target's logp is the constant +0, so its a is +0 whatever g_lp holds.
  const float a = tg.ignored ? 0.0f : tg.g_lp * ((is_target ? 1.0f : 0.0f) - p);
  const float gy = with_ent ? a + tg.g_ent * (p * (tg.mu - y)) : a;
  return f32_to_bf16(gy / tau);
}

// Wᵀ columns [h0, h0 + hc) re-laid out: wt[j·width + col(v)] = w[v − v0, h0 + j] for the rows
// v ∈ [v0, v0 + w.size(0)) that w holds (padding stays +0).
void relayout_wt(const TensorView& w, int64_t v0, const GLayout& gl, int64_t h0, int64_t hc,
                 bf16* wt) {
  const int64_t n = w.size(0), ldw = w.stride[0];
  const bf16* src = w.ptr<const bf16>();
  parallel_for(hc, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      bf16* dst = wt + j * gl.width;
      for (int64_t v = 0; v < n; ++v) dst[gl.col(v0 + v)] = src[v * ldw + h0 + j];
    }
  });
}

// The op over the vocab segments [seg_begin, seg_begin + seg_count) of `lay` (checked by the
// caller): w and dw hold their rows [v0, …), dh = the segments' subtree of the dh tree (all
// segments: the whole tree, dh itself).
void backward_segments(const char* op, const TensorView& h, const TensorView& w,
                       const TensorView& targets, const LogprobParams& params,
                       const ContractConfig& cfg, const LogprobVocabLayout& lay, int seg_begin,
                       int seg_count, const TensorView& lse, const TensorView& entropy,
                       const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                       const TokenOrder& order, const TensorView& dw, const Chunking& chunking) {
  const int64_t chunk_blocks = chunking.chunk_blocks;
  LS_CHECK(chunk_blocks >= 1 && chunking.hidden_chunk >= 1, op,
           "chunking: chunk_blocks and hidden_chunk must be >= 1, got ", chunk_blocks, " and ",
           chunking.hidden_chunk);
  const int64_t T = h.size(0), H = h.size(1), V = lay.vocab_size;
  if (T == 0) return;
  const int64_t L = lay.tile, n_tiles = lay.tiles_per_segment * seg_count;
  const int64_t v_lo = std::min(V, seg_begin * lay.segment_len);  // w's first row
  const float tau = params.temperature;
  const bool with_ent = g_ent != nullptr;
  const GLayout gl(lay, seg_begin, seg_count);
  const bool whole = seg_count == lay.segments;
  const GemmConfig dh_cfg{lay.segments};  // the vocab segments are the dh GEMM's K segments

  std::vector<TokenGrad> tok(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    TokenGrad& tg = tok[size_t(t)];
    tg.lse = f32_at(lse, t);
    tg.mu = tg.lse - f32_at(entropy, t);
    tg.g_lp = f32_at(g_lp, t);
    tg.g_ent = with_ent ? f32_at(*g_ent, t) : 0.0f;
    tg.target = read_index(targets, t);
    tg.ignored = tg.target == params.ignore_index;
  }

  // Wᵀ in G's column layout: all of it once when it fits the budget, else hidden_chunk columns
  // at a time per chunk (the GEMM is column-invariant: the same bits).
  const int64_t hc_step =
      H * gl.width * 2 <= chunking.wt_budget_bytes ? H : std::min(H, chunking.hidden_chunk);
  const bool wt_once = hc_step == H;
  std::vector<bf16> wt(static_cast<size_t>(hc_step * gl.width), bf16{0});
  if (wt_once) relayout_wt(w, v_lo, gl, 0, H, wt.data());

  const std::vector<Block> blocks = token_blocks(order, T);
  const int64_t n_blocks = int64_t(blocks.size());
  std::vector<bf16> G;        // [rows of the chunk, width]
  std::vector<float> dh_out;  // [rows of the chunk, H]
  std::vector<int64_t> off;   // first G row of each block of the chunk
  std::vector<bf16> ht;       // per in-order block of the chunk: [H, 16] h columns
  for (int64_t c0 = 0; c0 < n_blocks; c0 += chunk_blocks) {
    const int64_t c1 = std::min(n_blocks, c0 + chunk_blocks), nb = c1 - c0;
    off.assign(size_t(nb + 1), 0);
    for (int64_t b = 0; b < nb; ++b) off[size_t(b + 1)] = off[size_t(b)] + blocks[size_t(c0 + b)].n;
    const int64_t rows = off[size_t(nb)];
    G.assign(size_t(rows * gl.width), bf16{0});

    // G: the forward's logits per (block, tile), each entry written by exactly one task.
    parallel_for(nb * n_tiles, 1, [&](int64_t i0, int64_t i1) {
      std::vector<float> z(static_cast<size_t>(kTokenBlock * L));
      for (int64_t it = i0; it < i1; ++it) {
        const int64_t b = it / n_tiles, i = it % n_tiles;
        const Block& blk = blocks[size_t(c0 + b)];
        const int64_t v0 = seg_begin * lay.segment_len + i * L;
        const int64_t valid = std::clamp<int64_t>(V - v0, 0, L);
        if (valid == 0) continue;  // all padding: G stays +0
        logprob_detail::tile_logits(h.rows(blk.r0, blk.r0 + blk.n),
                                    w.rows(v0 - v_lo, v0 - v_lo + valid), cfg, z.data(), L);
        const int64_t col0 = gl.col(v0);  // a tile lies inside one segment
        for (int64_t r = 0; r < blk.n; ++r) {
          const TokenGrad& tg = tok[size_t(blk.r0 + r)];
          bf16* g = G.data() + (off[size_t(b)] + r) * gl.width + col0;
          const float* zr = z.data() + r * L;
          for (int64_t j = 0; j < valid; ++j)
            g[j] = grad_entry(zr[j], !tg.ignored && tg.target == v0 + j, tg, with_ent, tau);
        }
      }
    });

    // dh = G·W over the vocab: the GEMM contract with the vocab segments as its K segments.
    dh_out.resize(size_t(rows * H));
    const TensorView gv = TensorView::contiguous(G.data(), DType::kBF16, {rows, gl.width});
    for (int64_t h0 = 0; h0 < H; h0 += hc_step) {
      const int64_t hc = std::min(hc_step, H - h0);
      if (!wt_once) relayout_wt(w, v_lo, gl, h0, hc, wt.data());
      TensorView y = TensorView::contiguous(dh_out.data() + h0, DType::kF32, {rows, hc});
      y.stride[0] = H;
      const TensorView wtv = TensorView::contiguous(wt.data(), DType::kBF16, {hc, gl.width});
      if (whole)
        gemm_bf16_nt(gv, wtv, dh_cfg, y);
      else  // the shard's segments are rank seg_begin / seg_count of lay.segments / seg_count
        gemm_bf16_nt_partial(gv, wtv, gl.seg_pad * lay.segments, lay.segments / seg_count,
                             seg_begin / seg_count, dh_cfg, y);
    }
    for (int64_t b = 0; b < nb; ++b) {
      const Block& blk = blocks[size_t(c0 + b)];
      for (int64_t r = 0; r < blk.n; ++r)
        std::copy_n(dh_out.data() + (off[size_t(b)] + r) * H, H,
                    dh.ptr<float>() + (blk.r0 + r) * dh.stride[0]);
    }

    // dW: per in-order block (canonical order), one MMA k-block over its 16 rows (rows past the
    // sequence end: G = h = +0), c = dw's current value.
    // NOTE: the §B.3 dW chain with dy := G, written here with mma_chain_rows_bf16 (k = 16); to be
    // unified with cpu::gemm_bf16_dw.
    std::vector<int64_t> dw_blocks;
    for (int64_t b = 0; b < nb; ++b)
      if (blocks[size_t(c0 + b)].in_order) dw_blocks.push_back(b);
    if (dw_blocks.empty()) continue;
    ht.assign(size_t(int64_t(dw_blocks.size()) * H * kTokenBlock), bf16{0});
    for (size_t q = 0; q < dw_blocks.size(); ++q) {
      const Block& blk = blocks[size_t(c0 + dw_blocks[q])];
      bf16* dst = ht.data() + int64_t(q) * H * kTokenBlock;
      for (int64_t r = 0; r < blk.n; ++r) {
        const bf16* src = h.ptr<const bf16>() + (blk.r0 + r) * h.stride[0];
        for (int64_t j = 0; j < H; ++j) dst[j * kTokenBlock + r] = src[j];
      }
    }
    parallel_for(dw.size(0), 8, [&](int64_t va, int64_t vb) {
      bf16 a[kTokenBlock];
      for (int64_t v = va; v < vb; ++v) {
        const int64_t col = gl.col(v_lo + v);
        float* row = dw.ptr<float>() + v * dw.stride[0];
        for (size_t q = 0; q < dw_blocks.size(); ++q) {
          const int64_t b = dw_blocks[q], n = blocks[size_t(c0 + b)].n;
          for (int64_t r = 0; r < kTokenBlock; ++r)
            a[r] = r < n ? G[size_t((off[size_t(b)] + r) * gl.width + col)] : bf16{0};
          mma_chain_rows_bf16(a, ht.data() + int64_t(q) * H * kTokenBlock, kTokenBlock, H,
                              kTokenBlock, row, row);
        }
        // A NaN chain value stays NaN through later blocks, so storing it canonically once
        // per chunk is the same as after every block.
        for (int64_t j = 0; j < H; ++j) row[j] = canonical_f32(row[j]);
      }
    });
  }
}

}  // namespace

void linear_logprob_backward_chunked(const TensorView& h, const TensorView& w,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const TensorView& lse,
                                     const TensorView& entropy, const TensorView& g_lp,
                                     const TensorView* g_ent, const TensorView& dh,
                                     const TokenOrder& order, const TensorView& dw,
                                     const Chunking& chunking) {
  const char* op = "linear_logprob_backward";
  const LogprobVocabLayout lay = contract::check_linear_logprob_backward(
      op, Device::kCPU, h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
  backward_segments(op, h, w, targets, params, cfg, lay, 0, lay.segments, lse, entropy, g_lp, g_ent,
                    dh, order, dw, chunking);
}

void linear_logprob_backward_partial_chunked(const TensorView& h, const TensorView& w_shard,
                                             const TensorView& targets, const LogprobParams& params,
                                             const ContractConfig& cfg, const LogprobShard& shard,
                                             const TensorView& lse, const TensorView& entropy,
                                             const TensorView& g_lp, const TensorView* g_ent,
                                             const TensorView& dh_partial, const TokenOrder& order,
                                             const TensorView& dw_shard, const Chunking& chunking) {
  const char* op = "linear_logprob_backward_partial";
  const contract::ShardRows sr = contract::check_linear_logprob_backward_partial(
      op, Device::kCPU, h, w_shard, targets, params, cfg, shard, lse, entropy, g_lp, g_ent,
      dh_partial, order, dw_shard);
  backward_segments(op, h, w_shard, targets, params, cfg, sr.lay, shard.seg_begin, shard.seg_count,
                    lse, entropy, g_lp, g_ent, dh_partial, order, dw_shard, chunking);
}

}  // namespace logprob_backward_detail

void linear_logprob_backward_partial(const TensorView& h, const TensorView& w_shard,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const LogprobShard& shard,
                                     const TensorView& lse, const TensorView& entropy,
                                     const TensorView& g_lp, const TensorView* g_ent,
                                     const TensorView& dh_partial, const TokenOrder& order,
                                     const TensorView& dw_shard) {
  logprob_backward_detail::linear_logprob_backward_partial_chunked(
      h, w_shard, targets, params, cfg, shard, lse, entropy, g_lp, g_ent, dh_partial, order,
      dw_shard, logprob_backward_detail::Chunking{});
}

void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                             const LogprobParams& params, const ContractConfig& cfg,
                             const TensorView& lse, const TensorView& entropy,
                             const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                             const TokenOrder& order, const TensorView& dw) {
  logprob_backward_detail::linear_logprob_backward_chunked(h, w, targets, params, cfg, lse, entropy,
                                                           g_lp, g_ent, dh, order, dw,
                                                           logprob_backward_detail::Chunking{});
}

}  // namespace lockstep::cpu
