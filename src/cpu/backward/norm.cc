// RMSNorm backward on the CPU (docs/contract.md §B.4). Per row (one (token, head) pair of a
// [T, heads, D] input, or one token of [T, H]): r and t recomputed with the forward's own code
// (norm_detail::rms_inv), gt = gy·w, dot = the forward's lane-layout sum of gt·s,
// dx = gt·r − s·(dot·r³/H); the residual form adds gres. The weight gradient is a token
// reduction: per token the heads' gy·t summed in head order, a tree over each 16-token block
// (padding rows +0), the blocks chained into dweight in canonical order (B.1).
#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/backward/token_blocks.h"
#include "cpu/elementwise_common.h"
#include "cpu/norm_internal.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {

namespace {

// Blocks per pass of the weight gradient: bounds the block sums to kChunkBlocks·H floats.
constexpr int64_t kChunkBlocks = 64;

struct NormArgs {
  detail::RowAddr s, gy, gres, out;
  bool has_gres = false;
  const bf16* w = nullptr;
  int64_t H = 0, heads = 1;
  float eps = 0;
};

// §2's tree over 16 values (adjacent pairs, level by level); v is overwritten.
float tree16(float* v) {
  for (int half = kTokenBlock / 2; half >= 1; half /= 2)
    for (int i = 0; i < half; ++i) v[i] = v[2 * i] + v[2 * i + 1];
  return v[0];
}

// Block sums b[k] = tree(c_0[k] … c_15[k]) of one token block, c_i the contribution of its
// position i (§B.4): Σ over heads ascending of gy·t, +0 for rows past the sequence's end.
// c: scratch [16, H].
void block_sum(const NormArgs& a, const TokenBlock& b, float* c, float* out) {
  const int64_t H = a.H;
  std::fill(c, c + kTokenBlock * H, 0.0f);
  for (int64_t i = 0; i < b.len; ++i) {
    float* ci = c + i * H;
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t row = (b.row + i) * a.heads + h;
      const bf16* s = a.s.row<const bf16>(row);
      const float* gy = a.gy.row<const float>(row);
      const float r = norm_detail::rms_inv(s, H, a.eps);
      for (int64_t k = 0; k < H; ++k) {
        const float t = bf16_to_f32(f32_to_bf16(bf16_to_f32(s[k]) * r));
        const float g = gy[k] * t;
        ci[k] = h == 0 ? g : ci[k] + g;
      }
    }
  }
  float v[kTokenBlock];
  for (int64_t k = 0; k < H; ++k) {
    for (int i = 0; i < kTokenBlock; ++i) v[i] = c[i * H + k];
    out[k] = tree16(v);
  }
}

// dweight[k] = dweight[k] + b[k], block after block in canonical order.
void accumulate_dweight(const NormArgs& a, const TokenOrder& order, float* dw) {
  const std::vector<TokenBlock> blocks = token_blocks(order);
  const int64_t H = a.H;
  std::vector<float> sums;
  for (size_t c0 = 0; c0 < blocks.size(); c0 += kChunkBlocks) {
    const int64_t nb = std::min<int64_t>(kChunkBlocks, int64_t(blocks.size() - c0));
    sums.resize(size_t(nb * H));
    parallel_for(nb, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> scratch(size_t(kTokenBlock * H));
      for (int64_t b = b0; b < b1; ++b)
        block_sum(a, blocks[c0 + size_t(b)], scratch.data(), sums.data() + b * H);
    });
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t k = 0; k < H; ++k) dw[k] = dw[k] + sums[size_t(b * H + k)];
  }
  if (blocks.empty()) return;
  for (int64_t k = 0; k < H; ++k) dw[k] = canonical_f32(dw[k]);  // stored NaNs are canonical (§4)
}

// dx (or ds = gres + dx) of every row.
void input_gradient(const NormArgs& a, int64_t rows) {
  const int64_t H = a.H;
  parallel_for(rows, std::max<int64_t>(1, 8192 / H), [&](int64_t begin, int64_t end) {
    std::vector<float> gt(static_cast<size_t>(H));  // gy·w, so that out may be the same view as gy
    for (int64_t row = begin; row < end; ++row) {
      const bf16* s = a.s.row<const bf16>(row);
      const float* gy = a.gy.row<const float>(row);
      const float r = norm_detail::rms_inv(s, H, a.eps);
      for (int64_t k = 0; k < H; ++k) gt[size_t(k)] = gy[k] * bf16_to_f32(a.w[k]);
      const float dot =
          norm_detail::lane_sum(H, [&](int64_t k) { return gt[size_t(k)] * bf16_to_f32(s[k]); });
      const float c3 = ((r * r) * r) / float(H);
      const float coef = dot * c3;
      const float* gres = a.has_gres ? a.gres.row<const float>(row) : nullptr;
      float* out = a.out.row<float>(row);
      for (int64_t k = 0; k < H; ++k) {
        const float dx = (gt[size_t(k)] * r) - (bf16_to_f32(s[k]) * coef);
        out[k] = canonical_f32(gres ? gres[k] + dx : dx);
      }
    }
  });
}

void backward(const char* op, const TensorView& s, const TensorView& weight,
              const RmsNormConfig& cfg, const TensorView& gy, const TensorView* gres,
              const TensorView& out, const TokenOrder* order, const TensorView* dweight) {
  const int64_t H = contract::check_rmsnorm_backward(op, Device::kCPU, s, weight, cfg, gy, gres,
                                                     out, order, dweight);
  const int64_t rows = s.numel() / H;
  NormArgs a{detail::RowAddr(s), detail::RowAddr(gy), detail::RowAddr(gres ? *gres : gy),
             detail::RowAddr(out)};
  a.has_gres = gres != nullptr;
  a.w = weight.ptr<const bf16>();
  a.H = H;
  a.heads = s.ndim == 3 ? s.shape[1] : 1;
  a.eps = cfg.eps;
  // The weight gradient first: it reads gy, which out may overwrite.
  if (dweight) accumulate_dweight(a, *order, dweight->ptr<float>());
  if (rows > 0) input_gradient(a, rows);
}

}  // namespace

void rmsnorm_backward(const TensorView& s, const TensorView& weight, const RmsNormConfig& cfg,
                      const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                      const TensorView* dweight) {
  backward("rmsnorm_backward", s, weight, cfg, gy, nullptr, dx, order, dweight);
}

void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& gy,
                               const TensorView& gres, const TensorView& ds,
                               const TokenOrder* order, const TensorView* dweight) {
  backward("rmsnorm_residual_backward", s, weight, cfg, gy, &gres, ds, order, dweight);
}

}  // namespace lockstep::cpu
