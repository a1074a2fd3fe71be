// The LogP op on the CPU, the executable form of docs/contract.md §L: logits of a block of
// tokens × one vocab tile by the GEMM contract, y = z / temperature, per-tile state in the 8-lane
// layout, tiles folded left to right per segment, segments merged in a balanced tree. Work is
// split over token blocks and tiles; each state is computed by one task and combined in the fixed
// order, so bits never depend on the thread count or on which other tokens are in the batch.
#include "lockstep/ops/logprob.h"

#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "contract/logprob_formula.h"
#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/logprob_internal.h"
#include "lockstep/ops/gemm.h"

namespace lockstep {

namespace cpu {
namespace logprob_detail {

// The GEMM op itself on a [rows, n] block with fp32 output: its row invariance makes a tile's
// logits the same bits as the full [T, V] GEMM would give.
void tile_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg, float* out,
                 int64_t ld) {
  TensorView y = TensorView::contiguous(out, DType::kF32, {h.size(0), w.size(0)});
  y.stride[0] = ld;
  gemm_bf16_nt(h, w, logprob_logits_gemm(cfg), y);
}

LogprobState fold_tiles(const LogprobState* tiles, int64_t tiles_per_segment, int seg_count,
                        LogprobState* seg_scratch) {
  for (int k = 0; k < seg_count; ++k) {
    LogprobState acc;  // empty: merge(empty, t) == t exactly
    for (int64_t i = 0; i < tiles_per_segment; ++i)
      acc = logprob_merge(acc, tiles[k * tiles_per_segment + i]);
    seg_scratch[k] = acc;
  }
  return logprob_tree(seg_scratch, seg_count);
}

LogprobState row_state(const float* y, const LogprobVocabLayout& lay,
                       std::vector<LogprobState>* scratch) {
  const int64_t n_tiles = lay.padded / lay.tile;
  scratch->resize(size_t(n_tiles + lay.segments));
  LogprobState* tiles = scratch->data();
  for (int64_t i = 0; i < n_tiles; ++i) tiles[i] = logprob_tile_state(y + i * lay.tile, lay.tile);
  return fold_tiles(tiles, lay.tiles_per_segment, lay.segments, tiles + n_tiles);
}

}  // namespace logprob_detail

using logprob_detail::f32_at;
using logprob_detail::read_index;

namespace {

constexpr int64_t kTokenBlock = 16;  // rows per GEMM call (any value gives the same bits)

// States (m, s, w, y_target) of tokens [0, T) over the shard's segments; one aligned subtree.
// `out` gets T rows of 4 floats (row stride ld); y_target is NaN unless the shard holds it.
void shard_states(const TensorView& h, const TensorView& w_shard, const TensorView& targets,
                  const LogprobParams& params, const ContractConfig& cfg,
                  const LogprobVocabLayout& lay, int seg_begin, int seg_count, float* out,
                  int64_t ld) {
  const int64_t T = h.size(0);
  const int64_t L = lay.tile;
  const int64_t tps = lay.tiles_per_segment;
  const int64_t n_tiles = tps * seg_count;
  const int64_t v_begin = int64_t(seg_begin) * lay.segment_len;  // global row of local row 0
  const int64_t Vs = w_shard.size(0);
  const float temperature = params.temperature;
  const float nan = f32_from_bits(kCanonicalNanF32);
  const int64_t n_blocks = (T + kTokenBlock - 1) / kTokenBlock;

  parallel_for(n_blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<LogprobState> tiles;  // [rows, n_tiles]
    std::vector<float> y_target;      // [rows]
    std::vector<LogprobState> segs(static_cast<size_t>(seg_count));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kTokenBlock, rows = std::min(kTokenBlock, T - r0);
      const TensorView h_blk = h.rows(r0, r0 + rows);
      tiles.assign(size_t(rows * n_tiles), LogprobState{});
      y_target.assign(size_t(rows), nan);
      // Tiles in parallel (nested: serial when the blocks already fill the pool). Each tile's
      // state and each target logit are written by exactly one task.
      parallel_for(n_tiles, 1, [&](int64_t i0, int64_t i1) {
        // [rows, L] scratch: one tile of logits (never more than kTokenBlock rows).
        std::vector<float> y(static_cast<size_t>(rows * L));
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t lv0 = i * L;  // local vocab row of the tile's first entry
          const int64_t valid = std::clamp<int64_t>(Vs - lv0, 0, L);
          if (valid > 0)
            logprob_detail::tile_logits(h_blk, w_shard.rows(lv0, lv0 + valid), cfg, y.data(), L);
          for (int64_t r = 0; r < rows; ++r) {
            float* yr = y.data() + r * L;
            for (int64_t j = 0; j < valid; ++j) yr[j] = yr[j] / temperature;
            for (int64_t j = valid; j < L; ++j) yr[j] = neg_inf_f32();  // vocab padding
            tiles[size_t(r * n_tiles + i)] = logprob_tile_state(yr, L);
            int64_t g = read_index(targets, r0 + r);
            if (g != params.ignore_index && g >= v_begin + lv0 && g < v_begin + lv0 + valid)
              y_target[size_t(r)] = yr[g - v_begin - lv0];
          }
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        LogprobState st =
            logprob_detail::fold_tiles(tiles.data() + r * n_tiles, tps, seg_count, segs.data());
        float* o = out + (r0 + r) * ld;
        o[0] = canonical_f32(st.m);
        o[1] = canonical_f32(st.s);
        o[2] = canonical_f32(st.w);
        o[3] = canonical_f32(y_target[size_t(r)]);
      }
    }
  });
}

void finish_token(const LogprobState& st, float y_target, bool ignored, float* logp, float* lse,
                  float* entropy) {
  const float l = contract::lp_finish(st, entropy);
  *lse = l;
  *logp = ignored ? 0.0f : canonical_f32(y_target - l);
}

}  // namespace

void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                            const TensorView& targets, const LogprobParams& params,
                            const ContractConfig& cfg, const LogprobShard& shard,
                            const TensorView& state) {
  const contract::ShardRows sr = contract::check_linear_logprob_partial(
      "linear_logprob_partial", Device::kCPU, h, w_shard, targets, params, cfg, shard, state);
  const int64_t T = h.size(0);
  if (T == 0) return;
  shard_states(h, w_shard, targets, params, cfg, sr.lay, shard.seg_begin, shard.seg_count,
               state.ptr<float>(), state.stride[0]);
}

void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                            const LogprobParams& params, const ContractConfig& cfg,
                            int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                            const TensorView& entropy) {
  const LogprobVocabLayout lay =
      contract::check_linear_logprob_combine("linear_logprob_combine", Device::kCPU, states,
                                             targets, params, cfg, vocab_size, logp, lse, entropy);
  const int64_t R = states.size(0), T = states.size(1);
  const int64_t rank_len = lay.segment_len * (cfg.vocab_segments / R);  // vocab rows per rank
  parallel_for(T, 256, [&](int64_t t0, int64_t t1) {
    std::vector<LogprobState> st(static_cast<size_t>(R));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r = 0; r < R; ++r) {
        const float* p = states.ptr<float>() + r * states.stride[0] + t * states.stride[1];
        st[size_t(r)] = LogprobState{p[0], p[1], p[2]};
      }
      LogprobState all = logprob_tree(st.data(), R);
      int64_t g = read_index(targets, t);
      bool ignored = g == params.ignore_index;
      float y = 0.0f;
      if (!ignored) {
        int64_t owner = g / rank_len;
        y = states.ptr<float>()[owner * states.stride[0] + t * states.stride[1] + 3];
      }
      finish_token(all, y, ignored, &f32_at(logp, t), &f32_at(lse, t), &f32_at(entropy, t));
    }
  });
}

void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                    const LogprobParams& params, const ContractConfig& cfg, const TensorView& logp,
                    const TensorView& lse, const TensorView& entropy) {
  contract::check_linear_logprob("linear_logprob", Device::kCPU, h, w, targets, params, cfg, logp,
                                 lse, entropy);
  const int64_t T = h.size(0), V = w.size(0);
  if (T == 0) return;
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  // [T, 4] states: 16 bytes per token (never [T, V]).
  std::vector<float> st(static_cast<size_t>(T * 4));
  shard_states(h, w, targets, params, cfg, lay, 0, cfg.vocab_segments, st.data(), 4);
  parallel_for(T, 256, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* p = st.data() + t * 4;
      bool ignored = read_index(targets, t) == params.ignore_index;
      finish_token(LogprobState{p[0], p[1], p[2]}, p[3], ignored, &f32_at(logp, t), &f32_at(lse, t),
                   &f32_at(entropy, t));
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
