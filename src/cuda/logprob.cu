// Launchers of the CUDA LogP op (docs/contract.md §L; kernels: logprob.cuh): cuda::linear_logprob,
// linear_logprob_partial (one vocab-parallel rank's subtree state) and linear_logprob_combine.
// Work per call: token blocks; per block the tile states by one of two producers (same bits):
//   fused (vocab_tile 256, T > 64, TMA-compatible h / w): the Hopper GEMM kernel
//     (gemm/mainloop_sm90.cuh) with the log-prob epilogue (logprob_epilogue.cuh) computes each
//     (row, tile) state from its accumulators; no logits exist at all;
//   unfused (everything else): per vocab chunk, the logits z = h_block · w_chunkᵀ by the GEMM
//     contract (cuda::gemm_bf16_nt, fp32 out) into a bounded scratch, then the tile-state kernel;
// then the fold/tree/finish kernel. Scratch is O(token_block · (chunk + tiles)) whatever T is; no
// [T, V] buffer ever exists. logprob_launch_plan prints the choice.
// Every argument is checked before anything is launched, by the CPU op's own checks
// (src/contract/logprob.cc, Device::kCUDA): host targets are checked element by element, device
// targets are trusted (an invalid one gives NaN).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "contract/checks.h"
#include "cuda/gemm/internal.h"       // gemm_operands_tma_ok
#include "cuda/gemm/sm90_launch.cuh"  // the Hopper kernel with the fused epilogue below
#include "cuda/logprob.cuh"
#include "cuda/logprob_epilogue.cuh"  // the fused log-prob epilogue
#include "cuda/logprob_internal.h"
#include "cuda/sampling_internal.h"  // sample_choose_config
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::cuda {
namespace detail {

namespace {
// NOTE: 1024 rows per GEMM call (vocab in chunks to stay in the logits budget): W is streamed
// from HBM once per token block, so larger blocks cut its traffic; the fold runs once per block.
constexpr int64_t kTokenBlock = 1024;
constexpr int64_t kSampleRowBlock = 256;               // sampling: whole padded rows per block
constexpr int64_t kLogitsBudget = int64_t(160) << 20;  // bytes of [token_block, chunk] logits
constexpr int64_t kStatesBudget = int64_t(64) << 20;   // bytes of [token_block, tiles] states
// The fused producer keeps no logits: larger token blocks (fewer launches, one fold over many
// rows), bounded by the tile-state budget.
constexpr int64_t kFusedTokenBlock = 8192;
constexpr int64_t kSampleLogitsBudget = int64_t(128) << 20;

// Both plans' token block (fewer rows when a block's tile states would pass their budget: tiny
// tiles, huge V) and scratch, with one vocab chunk and no logits.
LogprobPlan block_plan(int64_t n_tiles, int64_t L, int64_t max_block, int64_t align) {
  LogprobPlan pl;
  pl.n_tiles = n_tiles;
  pl.L = L;
  int64_t tb = std::clamp<int64_t>(kStatesBudget / (n_tiles * 12), 1, max_block);
  if (tb >= align) tb = tb / align * align;
  pl.token_block = tb;
  pl.chunks = 1;
  pl.chunk_tiles = n_tiles;
  pl.states_bytes = tb * n_tiles * 12;
  pl.target_bytes = tb * 4;
  return pl;
}
}  // namespace

Scratch::~Scratch() {
  for (void* p : ptrs_) cudaFreeAsync(p, stream_);
}

void* Scratch::alloc(int64_t bytes) {
  void* p = nullptr;
  const int64_t n = std::max<int64_t>(bytes, 16);
  const cudaError_t e = cudaMallocAsync(&p, size_t(n), stream_);
  LS_CHECK(e == cudaSuccess, op_, "cudaMallocAsync of ", n,
           " bytes of scratch failed: ", cudaGetErrorString(e));
  ptrs_.push_back(p);
  bytes_ += n;
  return p;
}

LogprobPlan logprob_plan(int64_t n_tiles, int64_t L) {
  LogprobPlan pl = block_plan(n_tiles, L, kTokenBlock, 64);
  const int64_t tb = pl.token_block;
  const int64_t max_tiles = std::max<int64_t>(1, kLogitsBudget / (tb * L * 4));
  pl.chunks = std::max<int64_t>(1, (n_tiles + max_tiles - 1) / max_tiles);
  pl.chunk_tiles = std::max<int64_t>(1, (n_tiles + pl.chunks - 1) / pl.chunks);  // balanced
  pl.logits_bytes = tb * pl.chunk_tiles * L * 4;
  return pl;
}

LogprobPlan logprob_fused_plan(int64_t n_tiles, int64_t L) {
  return block_plan(n_tiles, L, kFusedTokenBlock, 128);  // whole 128-row GEMM tiles
}

bool logprob_fused_by_settings(const ContractConfig& cfg, int64_t T) {
  // The head's logits are one K segment in every contract (0.3: logprob_logits_gemm).
  return cfg.vocab_tile == kLogprobFusedTile && T > kLogprobFusedMinRows;
}

const char* logprob_producer_name(LogprobProducer p) {
  switch (p) {
    case LogprobProducer::kAuto:
      return "auto";
    case LogprobProducer::kFused:
      return "fused GEMM + tile-state epilogue";
    case LogprobProducer::kUnfused:
      return "GEMM into logits scratch + tile-state kernel";
  }
  return "?";
}

SamplePlan sample_plan(const LogprobVocabLayout& lay) {
  SamplePlan sp;
  int64_t rb = kSampleLogitsBudget / (lay.padded * 4);
  if (rb >= 32) rb = rb / 32 * 32;
  sp.row_block = std::clamp<int64_t>(rb, 1, kSampleRowBlock);
  sp.logits_bytes = sp.row_block * lay.padded * 4;
  sp.states_bytes = sp.row_block * (lay.padded / lay.tile) * 12;
  return sp;
}

IndexRef stage_index(const TensorView& v, Scratch& scratch, cudaStream_t stream) {
  if (v.device == Device::kCUDA) return index_ref(v);
  const int64_t n = v.shape[0];
  std::vector<int64_t> host(size_t(std::max<int64_t>(n, 1)));
  for (int64_t i = 0; i < n; ++i) host[size_t(i)] = contract::index_at(v, i);
  int64_t* dev = scratch.alloc_n<int64_t>(std::max<int64_t>(n, 1));
  // NOTE: from pageable memory: returns once the data is staged, so `host` may go away.
  const cudaError_t e =
      cudaMemcpyAsync(dev, host.data(), size_t(n) * 8, cudaMemcpyHostToDevice, stream);
  LS_CHECK(e == cudaSuccess, "cuda::stage_index",
           "copy to the device failed: ", cudaGetErrorString(e));
  IndexRef r;
  r.p = dev;
  r.stride = 1;
  r.is64 = 1;
  return r;
}

void launch_padding_tile_states(const TileStateParams& tiles, int64_t data_tiles, int64_t rows,
                                cudaStream_t stream, const char* op) {
  if (data_tiles >= tiles.n_tiles) return;
  TileStateParams tp = tiles;
  tp.z = tiles.states;
  tp.ldz = 0;
  tp.rows = rows;
  tp.tile0 = data_tiles;
  tp.ntiles = tiles.n_tiles - data_tiles;
  tp.y_target = nullptr;
  launch_tile_states(tp, true, stream, op);
}

void launch_tile_states(const TileStateParams& tp, bool temper, cudaStream_t stream,
                        const char* op) {
  constexpr int kTilesPerCta = kTileThreads / kLpLanes;
  TileStateParams q = tp;
  dim3 grid(unsigned((tp.ntiles + kTilesPerCta - 1) / kTilesPerCta), unsigned(tp.rows));
  // Narrow blocks (at most half a CTA of tiles per row): several rows per CTA.
  q.rows_per_cta = 1;
  if (tp.ntiles >= 1 && tp.ntiles <= kTilesPerCta / 2 && tp.rows > 1) {
    q.rows_per_cta = kTilesPerCta / tp.ntiles;
    grid = dim3(1u, unsigned((tp.rows + q.rows_per_cta - 1) / q.rows_per_cta));
  }
  const bool cached = tp.L <= int64_t(kLpLanes) * kLaneCache;
  if (temper && cached) {
    lp_tile_states_kernel<true, true><<<grid, kTileThreads, 0, stream>>>(q);
  } else if (temper) {
    lp_tile_states_kernel<true, false><<<grid, kTileThreads, 0, stream>>>(q);
  } else if (cached) {
    lp_tile_states_kernel<false, true><<<grid, kTileThreads, 0, stream>>>(q);
  } else {
    lp_tile_states_kernel<false, false><<<grid, kTileThreads, 0, stream>>>(q);
  }
  check_launch(op);
}

void fill_f32(float* p, int64_t n, uint32_t bits, cudaStream_t stream, const char* op) {
  if (n <= 0) return;
  lp_fill_kernel<<<grid_for(n, 256), 256, 0, stream>>>(p, n, bits);
  check_launch(op);
}

}  // namespace detail

namespace {

// The fused producer: the Hopper GEMM kernel (128x256 tiles, one segment of length seg_len = K
// rounded up to 16) with the log-prob epilogue (logprob_epilogue.cuh). Requires
// gemm_operands_tma_ok; M, N >= 1.
void gemm_bf16_nt_logprob_fused(const uint16_t* x, int64_t M, int64_t ldx, const uint16_t* w,
                                int64_t N, int64_t ldw, int64_t K, int64_t seg_len,
                                const detail::GemmLogprobEpilogue& e, cudaStream_t stream) {
  constexpr const char* op = "cuda::linear_logprob (fused GEMM)";
  LS_CHECK(detail::gemm_operands_tma_ok(x, M, ldx, w, N, ldw, K), op,
           "internal: operands not TMA-compatible");
  LS_CHECK(seg_len >= K && seg_len % 16 == 0 && seg_len - K < 16, op,
           "internal: seg_len = ", seg_len, " is not K = ", K, " rounded up to 16");
  static_assert(detail::kLogprobFusedTile == 256, "the fused tile is the 128x256 one");
  detail::Sm90LpParams p{};
  p.M = M;
  p.N = N;
  p.seg_len = seg_len;
  p.nseg = 1;
  p.ws_mode = 0;
  p.lp = e;
  const CUtensorMap tx = detail::sm90_tensor_map(op, x, M, K, ldx, 128);
  const CUtensorMap tw = detail::sm90_tensor_map(op, w, N, K, ldw, 256);
  detail::launch_sm90_tile<128, 256, 4, 0, detail::LogprobEpilogue>(op, tx, tw, p, stream);
}

// One vocab part (all of it, or one rank's aligned subtree of segments): local entries
// [0, valid) are rows of w_local and global ids v_begin + e; tiles_per_segment · seg_count tiles.
// Token blocks: tile states by the chosen producer (fused: one GEMM launch with the tile-state
// epilogue over the tiles holding real entries, the tile-state kernel for all-padding tiles;
// unfused: logits chunk by chunk (GEMM) -> tile-state kernel) -> fold (mode of `out`).
// Returns the producer that ran.
detail::LogprobProducer run_states(const char* op, const TensorView& h, const TensorView& w_local,
                                   int64_t valid, int64_t v_begin, const LogprobVocabLayout& lay,
                                   int seg_count, const detail::IndexRef& targets,
                                   const LogprobParams& params, const ContractConfig& cfg,
                                   detail::FoldParams out, detail::Scratch& scratch,
                                   detail::LogprobProducer force, cudaStream_t stream) {
  using detail::LogprobProducer;
  const int64_t T = h.size(0), H = h.size(1);
  const int64_t L = lay.tile;
  const int64_t n_tiles = lay.tiles_per_segment * seg_count;
  // The producer: settings, sizes and alignment only (a forced choice still needs the settings).
  const bool fused =
      force != LogprobProducer::kUnfused &&
      detail::logprob_fused_by_settings(
          cfg, force == LogprobProducer::kFused ? detail::kLogprobFusedMinRows + 1 : T) &&
      valid >= 1 &&
      detail::gemm_operands_tma_ok(h.data, T, h.stride[0], w_local.data, valid, w_local.stride[0],
                                   H);
  const detail::LogprobPlan pl =
      fused ? detail::logprob_fused_plan(n_tiles, L) : detail::logprob_plan(n_tiles, L);
  const int64_t rows_max = std::min(T, pl.token_block);
  const int64_t chunk_cols = pl.chunk_tiles * L;
  float* z = fused ? nullptr : scratch.alloc_n<float>(rows_max * chunk_cols);
  float* states = scratch.alloc_n<float>(rows_max * n_tiles * 3);
  float* y_target = scratch.alloc_n<float>(rows_max);
  const GemmConfig gcfg = logprob_logits_gemm(cfg);
  const int64_t data_tiles = (valid + L - 1) / L;  // tiles holding a real entry (fused)
  // What every tile-state launch below shares (z, rows and the tile range are per launch).
  detail::TileStateParams tiles{};
  detail::logprob_states_shared(lay, seg_count, valid, v_begin, targets, params, states, y_target,
                                tiles, out);

  for (int64_t r0 = 0; r0 < T; r0 += pl.token_block) {
    const int64_t rows = std::min(pl.token_block, T - r0);
    detail::fill_f32(y_target, rows, kCanonicalNanF32, stream, op);
    const TensorView h_blk = h.rows(r0, r0 + rows);
    if (fused) {
      const detail::GemmLogprobEpilogue e = detail::fused_states_epilogue(tiles, r0, 0);
      gemm_bf16_nt_logprob_fused(static_cast<const uint16_t*>(h_blk.data), rows, h.stride[0],
                                 static_cast<const uint16_t*>(w_local.data), valid,
                                 w_local.stride[0], H, gemm_k_layout(gcfg, H).segment_len, e,
                                 stream);
      detail::launch_padding_tile_states(tiles, data_tiles, rows, stream, op);
    } else {
      for (int64_t c = 0; c < pl.chunks; ++c) {
        const int64_t tile0 = c * pl.chunk_tiles;
        if (tile0 >= n_tiles) break;
        const int64_t ntiles = std::min(pl.chunk_tiles, n_tiles - tile0);
        // The logits producer: z[r, col] = logit of local entry tile0·L + col (GEMM contract).
        const int64_t e0 = tile0 * L;
        const int64_t ncols = std::clamp<int64_t>(valid - e0, 0, ntiles * L);
        if (ncols > 0) {
          TensorView zv = TensorView::contiguous(z, DType::kF32, {rows, ncols}, Device::kCUDA);
          zv.stride[0] = chunk_cols;
          gemm_bf16_nt(h_blk, w_local.rows(e0, e0 + ncols), nullptr, gcfg, zv, stream);
        }
        detail::TileStateParams tp = tiles;
        tp.z = z;
        tp.ldz = chunk_cols;
        tp.rows = rows;
        tp.tile0 = tile0;
        tp.ntiles = ntiles;
        tp.row0 = r0;
        detail::launch_tile_states(tp, true, stream, op);
      }
    }
    out.rows = rows;
    out.row0 = r0;
    detail::launch_fold(out, stream, op);
  }
  return fused ? LogprobProducer::kFused : LogprobProducer::kUnfused;
}

}  // namespace

namespace detail {

LogprobProducer linear_logprob_with_producer(const TensorView& h, const TensorView& w,
                                             const TensorView& targets, const LogprobParams& params,
                                             const ContractConfig& cfg, const TensorView& logp,
                                             const TensorView& lse, const TensorView& entropy,
                                             LogprobProducer producer, void* stream) {
  const char* op = "cuda::linear_logprob";
  contract::check_linear_logprob(op, Device::kCUDA, h, w, targets, params, cfg, logp, lse, entropy);
  const int64_t T = h.size(0), V = w.size(0);
  if (T == 0) return LogprobProducer::kUnfused;  // nothing runs
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  detail::Scratch scratch(op, s);
  const detail::IndexRef tg = detail::stage_index(targets, scratch, s);
  return run_states(op, h, w, V, 0, lay, lay.segments, tg, params, cfg,
                    detail::fold_to_outputs(logp, lse, entropy), scratch, producer, s);
}

LogprobProducer linear_logprob_partial_with_producer(
    const TensorView& h, const TensorView& w_shard, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const LogprobShard& shard,
    const TensorView& state, LogprobProducer producer, void* stream) {
  const char* op = "cuda::linear_logprob_partial";
  const contract::ShardRows sr = contract::check_linear_logprob_partial(
      op, Device::kCUDA, h, w_shard, targets, params, cfg, shard, state);
  const int64_t T = h.size(0);
  if (T == 0) return LogprobProducer::kUnfused;  // nothing runs
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  detail::Scratch scratch(op, s);
  const detail::IndexRef tg = detail::stage_index(targets, scratch, s);
  detail::FoldParams out{};
  out.mode = detail::kFoldState;
  out.state = state.ptr<float>();
  out.state_ld = state.stride[0];
  // An all-padding rank (v0 == v1 == V) has no rows: every tile is empty.
  return run_states(op, h, w_shard, sr.v1 - sr.v0, int64_t(shard.seg_begin) * sr.lay.segment_len,
                    sr.lay, shard.seg_count, tg, params, cfg, out, scratch, producer, s);
}

}  // namespace detail

void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                    const LogprobParams& params, const ContractConfig& cfg, const TensorView& logp,
                    const TensorView& lse, const TensorView& entropy, void* stream) {
  (void)detail::linear_logprob_with_producer(h, w, targets, params, cfg, logp, lse, entropy,
                                             detail::LogprobProducer::kAuto, stream);
}

void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                            const TensorView& targets, const LogprobParams& params,
                            const ContractConfig& cfg, const LogprobShard& shard,
                            const TensorView& state, void* stream) {
  (void)detail::linear_logprob_partial_with_producer(h, w_shard, targets, params, cfg, shard, state,
                                                     detail::LogprobProducer::kAuto, stream);
}

void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                            const LogprobParams& params, const ContractConfig& cfg,
                            int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                            const TensorView& entropy, void* stream) {
  const char* op = "cuda::linear_logprob_combine";
  const LogprobVocabLayout lay = contract::check_linear_logprob_combine(
      op, Device::kCUDA, states, targets, params, cfg, vocab_size, logp, lse, entropy);
  const int64_t R = states.size(0), T = states.size(1);
  if (T == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  detail::Scratch scratch(op, s);
  detail::LpCombineParams p{};
  p.states = states.ptr<float>();
  p.sr = states.stride[0];
  p.st = states.stride[1];
  p.R = int(R);
  p.T = T;
  p.rank_len = lay.segment_len * (cfg.vocab_segments / R);
  p.targets = detail::stage_index(targets, scratch, s);
  p.ignore_index = params.ignore_index;
  p.logp = logp.ptr<float>();
  p.lse = lse.ptr<float>();
  p.entropy = entropy.ptr<float>();
  p.logp_s = logp.stride[0];
  p.lse_s = lse.stride[0];
  p.entropy_s = entropy.stride[0];
  detail::lp_combine_kernel<<<detail::fold_blocks(T), detail::kFoldThreads, 0, s>>>(p);
  detail::check_launch(op);
}

std::string logprob_launch_plan(const ContractConfig& cfg, int64_t hidden, int64_t vocab) {
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, vocab);
  const int64_t n_tiles = lay.padded / lay.tile;
  const detail::LogprobPlan pl = detail::logprob_plan(n_tiles, lay.tile);
  const detail::LogprobPlan fp = detail::logprob_fused_plan(n_tiles, lay.tile);
  const detail::SamplePlan sp = detail::sample_plan(lay);
  const bool fusable = detail::logprob_fused_by_settings(cfg, detail::kLogprobFusedMinRows + 1);
  auto mib = [](int64_t b) { return double(b) / double(1 << 20); };
  char fused[512];
  if (fusable) {
    std::snprintf(fused, sizeof fused,
                  "T > %lld with h, w 16-byte aligned and row strides a multiple of 8: FUSED "
                  "(token_block=%lld, per block one wgmma 128x256 GEMM launch whose epilogue "
                  "writes the tile states, no logits; -> fold/tree/finish; scratch %.1f MiB: tile "
                  "states %.1f + targets %.3f); otherwise: UNFUSED ",
                  (long long)detail::kLogprobFusedMinRows, (long long)fp.token_block,
                  mib(fp.total_bytes()), mib(fp.states_bytes), mib(fp.target_bytes));
  } else {
    std::snprintf(fused, sizeof fused, "UNFUSED (the fused producer needs vocab_tile=256) ");
  }
  char buf[2048];
  std::snprintf(
      buf, sizeof buf,
      "logprob: H=%lld V=%lld V_pad=%lld vocab_tile=%lld vocab_segments=%d logits K segments=%d "
      "tiles=%lld | linear_logprob: %s(token_block=%lld, vocab chunks=%lld x %lld tiles (%lld "
      "entries), per block: GEMM [%lld x %lld] fp32 -> tile states (8 lanes/tile, 32 tiles/CTA) "
      "-> fold/tree/finish (1 thread/token); scratch %.1f MiB (logits %.1f + tile states %.1f + "
      "targets %.3f)) whatever T is | sample: row_block=%lld; scratch %.1f MiB (logits %.1f + "
      "tile states %.1f) + 20 B per token; %s",
      (long long)hidden, (long long)vocab, (long long)lay.padded, (long long)lay.tile, lay.segments,
      logprob_logits_gemm(cfg).segments, (long long)n_tiles, fused, (long long)pl.token_block,
      (long long)pl.chunks, (long long)pl.chunk_tiles, (long long)(pl.chunk_tiles * lay.tile),
      (long long)pl.token_block, (long long)(pl.chunk_tiles * lay.tile), mib(pl.total_bytes()),
      mib(pl.logits_bytes), mib(pl.states_bytes), mib(pl.target_bytes), (long long)sp.row_block,
      mib(sp.logits_bytes + sp.states_bytes), mib(sp.logits_bytes), mib(sp.states_bytes),
      detail::sample_choose_config().c_str());
  return buf;
}

}  // namespace lockstep::cuda
