// GEMM backward on the CPU (docs/contract.md §B.3), forward y = x·wᵀ, x [T, K], w [N, K]:
//   dx = dy·w is the forward GEMM contract (§G) of dy and wᵀ: N is the reduced axis (padded to
//        16·S, S segments, MMA chains from +0, tree, one rounding), computed by gemm_bf16_nt.
//   dw += dyᵀ·x is a token reduction: for every token block of the TokenOrder in canonical order
//        (sequence by step index, then 16-position blocks; rows past a sequence's end are zero),
//        dw[n, k] = mma_kblock(dy[block rows, n], x[block rows, k], dw[n, k]).
// Each dw element is one chain over the blocks, owned by one task: bits never depend on the
// packing, the micro-batch split (consecutive runs of the canonical order) or the thread count.
// The chain of a chunk of blocks runs in the vectorized kernel (gemm_dw_avx512.cc), bitwise the
// MMA model.
#include "lockstep/ops/gemm.h"

#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/backward/gemm_dw_kernel.h"
#include "cpu/backward/token_blocks.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {

namespace {

// wt [K, N] contiguous from w [N, K] (rows may be strided): wt[k, n] = w[n, k].
Tensor transpose_bf16(const TensorView& w) {
  const int64_t N = w.size(0), K = w.size(1);
  Tensor wt(DType::kBF16, {K, N});
  const bf16* src = w.ptr<const bf16>();
  bf16* dst = wt.ptr<bf16>();
  constexpr int64_t kTile = 32;  // square tiles, so both sides stay in cache
  parallel_for((K + kTile - 1) / kTile, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k0 = b0 * kTile; k0 < std::min(K, b1 * kTile); k0 += kTile)
      for (int64_t n0 = 0; n0 < N; n0 += kTile)
        for (int64_t n = n0; n < std::min(N, n0 + kTile); ++n)
          for (int64_t k = k0; k < std::min(K, k0 + kTile); ++k)
            dst[k * N + n] = src[n * w.stride[0] + k];
  });
  return wt;
}

// Token blocks (B.1) per chunk of the gather: bounds the scratch to kChunkBlocks·16·(N + K) bf16.
constexpr int64_t kChunkBlocks = 32;

// Column c of block j of a chunk, token-major: out[c·ld + 16j + i] = m[row + i, c] for the
// block's real rows i < len, else +0 (ld = 16 · blocks in the chunk).
void gather_columns(const TensorView& m, const TokenBlock& b, int64_t j, int64_t ld, bf16* out) {
  const int64_t cols = m.size(1);
  for (int64_t c = 0; c < cols; ++c)
    std::fill(out + c * ld + j * kTokenBlock, out + c * ld + (j + 1) * kTokenBlock, bf16{0});
  for (int64_t i = 0; i < b.len; ++i) {
    const bf16* r = m.ptr<const bf16>() + (b.row + i) * m.stride[0];
    for (int64_t c = 0; c < cols; ++c) out[c * ld + j * kTokenBlock + i] = r[c];
  }
}

}  // namespace

void gemm_bf16_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& dx) {
  contract::check_gemm_dx("gemm_bf16_dx", Device::kCPU, dy, w, cfg, dx);
  const Tensor wt = transpose_bf16(w);  // [K, N]
  gemm_bf16_nt(dy, wt.view(), cfg, dx);
}

void gemm_bf16_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& dx_partial) {
  contract::check_gemm_dx_partial("gemm_bf16_dx_partial", Device::kCPU, dy_shard, w_shard, n_total,
                                  tp_size, tp_rank, cfg, dx_partial);
  const Tensor wt = transpose_bf16(w_shard);  // [K, Nr]
  gemm_bf16_nt_partial(dy_shard, wt.view(), n_total, tp_size, tp_rank, cfg, dx_partial);
}

void gemm_bf16_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                  const TensorView& dw) {
  contract::check_gemm_dw("gemm_bf16_dw", Device::kCPU, dy, x, order, dw);
  const int64_t N = dy.size(1), K = x.size(1);
  if (N == 0 || K == 0) return;
  const std::vector<TokenBlock> blocks = token_blocks(order);
  if (blocks.empty()) return;
  float* dw0 = dw.ptr<float>();
  const int64_t ldw = dw.stride[0];
  // One chunk of gathered blocks (padding rows +0): column-major dy and x (column c = the
  // chunk's tokens in canonical order, 16 per block) and row-major x.
  std::vector<bf16> dyc, xc, xr;
  for (size_t c0 = 0; c0 < blocks.size(); c0 += kChunkBlocks) {
    const int64_t nb = std::min<int64_t>(kChunkBlocks, int64_t(blocks.size() - c0));
    const int64_t ld = nb * kTokenBlock;
    dyc.resize(size_t(N * ld));
    xc.resize(size_t(K * ld));
    xr.resize(size_t(ld * K));
    parallel_for(nb, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const TokenBlock& blk = blocks[c0 + size_t(b)];
        gather_columns(dy, blk, b, ld, dyc.data());
        gather_columns(x, blk, b, ld, xc.data());
        bf16* rows = xr.data() + b * kTokenBlock * K;
        std::fill(rows, rows + kTokenBlock * K, bf16{0});
        for (int64_t i = 0; i < blk.len; ++i)
          std::copy_n(x.ptr<const bf16>() + (blk.row + i) * x.stride[0], K, rows + i * K);
      }
    });
    // dw row n is owned by one task. The chunk's blocks, in order, are consecutive k-blocks of
    // one MMA chain that starts from dw's current value: exactly B.3's per-block update
    // dw[n, k] = mma_kblock(dy col n, x col k, dw[n, k]), block after block.
    const dw_detail::Chunk ch{dyc.data(), xc.data(), xr.data(), N, K, ld};
    parallel_for(N, 8,
                 [&](int64_t n0, int64_t n1) { dw_detail::chain_rows(ch, n0, n1, dw0, ldw); });
  }
  // Stored NaNs are canonical (§4). A NaN accumulator gives the MMA model's 0x7fffffff whatever
  // its payload, so canonicalizing once at the end equals canonicalizing after every block.
  parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* row = dw0 + n * ldw;
      for (int64_t k = 0; k < K; ++k) row[k] = canonical_f32(row[k]);
    }
  });
}

}  // namespace lockstep::cpu
