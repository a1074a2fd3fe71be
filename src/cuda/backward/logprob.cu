// The CUDA linear log-prob backward, docs/contract.md §B.8: the same bits as
// cpu::linear_logprob_backward (src/cpu/backward/logprob.cc). Work per call:
//   token chunks: runs of consecutive canonical token blocks (§B.1; the rows no sequence covers
//   last), at most plan.rows rows; a chunk whose rows are not one consecutive run of h is gathered
//   into a compact buffer. Per chunk and vocab segment k (entries [k·seg_len, k·seg_len + n_k) of
//   W, n_k the real ones):
//     logits z = the forward's GEMM contract (cuda::gemm_bf16_nt, fp32, one K segment) on
//       [chunk rows × vocab columns] blocks (the GEMM is row- and column-invariant: the forward's
//       bits), then G_k = round_bf16(gy ⊘ τ) as [rows, seg_pad] bf16 (and its transpose);
//     dh's segment value dh_k — one MMA chain over the segment's entries in k-blocks of 16 from +0,
//       exactly §B.8's per-segment chain — by one of three paths (LogprobBwdPath, same bits):
//       B.3's weight-gradient chain with the entries as tokens (cuda::gemm_bf16_dw on Gᵀ_k and W's
//       rows in place; the default: no Wᵀ exists), the same chain from G_k itself and W's rows in
//       place (gemm_bf16_nn_accumulate: no Gᵀ either), or cuda::gemm_bf16_nt(G_k, Wᵀ_k, one
//       segment) on a device re-layout of W_k;
//     dW rows of segment k: cuda::gemm_bf16_dw(G_k's real columns, the chunk's h rows, the chunk's
//       TokenOrder), which continues each dw element's chain over the chunk's blocks in order.
//   dh = cuda::gemm_tree_combine of the S_v segment values (the G.4 tree = §B.8's tree).
// The CPU computes the same per-segment chains and tree with one gemm_bf16_nt call on a
// segment-padded layout of width S_v·seg_pad (its K segments are exactly these). Nothing depends
// on the chunk sizes (tested on the CPU form), so the plan is free to follow the memory budget.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "contract/checks.h"
#include "cuda/backward/logprob.cuh"
#include "cuda/backward/logprob_epilogue.cuh"  // the fused G epilogue (kDxFused)
#include "cuda/backward/logprob_plan.h"
#include "cuda/gemm/internal.h"       // gemm_bf16_nn_accumulate, gemm_operands_tma_ok
#include "cuda/gemm/sm90_launch.cuh"  // the Hopper kernel with the fused G epilogue
#include "cuda/logprob.cuh"           // the forward's tile-state and fold kernels (recompute)
#include "cuda/logprob_internal.h"    // Scratch, launch_tile_states
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"  // linear_logprob (the two-pass fallback of the recompute)
#include "lockstep/ops/gemm.h"

namespace lockstep::cuda {
namespace detail {
namespace {

constexpr int64_t kMaxChunkRows = 8192;
constexpr int64_t kWtMaxChunkRows = 1024;             // kWtGemm: G holds whole segments
constexpr int64_t kLogitsBudget = int64_t(32) << 20;  // [rows, columns] f32 logits per GEMM call
constexpr int64_t kMinSlice = 512;                    // kDwForm: vocab entries per slice, at least

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One run of chunk rows that are consecutive rows of h: rows [src, src + n). in_order: part of a
// sequence of `order` (positions [pos, pos + n), pos a multiple of 16 by construction), else rows
// no sequence covers (dh only).
struct Piece {
  int64_t src = 0, n = 0;
  bool in_order = false;
  int64_t seq = -1;  // index into order.seqs() (in_order only)
};

struct Chunk {
  std::vector<Piece> pieces;
  int64_t rows = 0;
  int64_t row0 = 0;  // first entry of this chunk in the row table
};

// The token blocks of `order` in canonical order, then the rows no sequence covers in runs of at
// most 16 (as the CPU form), cut into chunks of at most max_rows rows (max_rows >= 16).
std::vector<Chunk> make_chunks(const TokenOrder& order, int64_t T, int64_t max_rows) {
  std::vector<Piece> blocks;
  std::vector<char> covered(size_t(T), 0);
  const auto seqs = order.seqs();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const TokenSeq& s = seqs[i];
    for (int64_t p = 0; p < s.len; p += kTokenBlock)
      blocks.push_back({s.row + p, std::min<int64_t>(kTokenBlock, s.len - p), true, int64_t(i)});
    std::fill(covered.begin() + s.row, covered.begin() + s.row + s.len, char(1));
  }
  for (int64_t r = 0; r < T;) {
    if (covered[size_t(r)]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < T && !covered[size_t(e)] && e - r < kTokenBlock) ++e;
    blocks.push_back({r, e - r, false, -1});
    r = e;
  }
  std::vector<Chunk> chunks;
  int64_t row0 = 0;
  for (const Piece& b : blocks) {
    if (chunks.empty() || chunks.back().rows + b.n > max_rows) {
      chunks.push_back({});
      chunks.back().row0 = row0;
    }
    Chunk& c = chunks.back();
    Piece* last = c.pieces.empty() ? nullptr : &c.pieces.back();
    if (last && last->in_order == b.in_order && last->seq == b.seq && last->src + last->n == b.src)
      last->n += b.n;  // the next block of the same sequence (or padding run): one piece
    else
      c.pieces.push_back(b);
    c.rows += b.n;
    row0 += b.n;
  }
  return chunks;
}

// G of one slice from the logits GEMM's epilogue (logprob_epilogue.cuh): the Hopper kernel's
// 128x256 tiles over p.M chunk rows (x: rows ldx apart) and p.N vocab rows of w (ldw apart), one
// K segment (the head's logits contract) of K = H. Requires gemm_operands_tma_ok.
void gemm_bf16_nt_logprob_grad(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw,
                               int64_t K, const Sm90LpbParams& p, cudaStream_t stream) {
  constexpr const char* op = "cuda::linear_logprob_backward (fused logits GEMM)";
  LS_CHECK(gemm_operands_tma_ok(x, p.M, ldx, w, p.N, ldw, K), op,
           "internal: operands not TMA-compatible");
  static_assert(kLogprobFusedTile == 256, "the fused tile is the 128x256 one");
  const CUtensorMap tx = sm90_tensor_map(op, x, p.M, K, ldx, 128);
  const CUtensorMap tw = sm90_tensor_map(op, w, p.N, K, ldw, 256);
  launch_sm90_tile<128, 256, 4, 0, LogprobGradEpilogue>(op, tx, tw, p, stream);
}

}  // namespace

const char* logprob_bwd_path_name(LogprobBwdPath p) {
  switch (p) {
    case LogprobBwdPath::kAuto:
      return "auto";
    case LogprobBwdPath::kDwForm:
      return "dh by gemm_bf16_dw on G^T and W in place";
    case LogprobBwdPath::kWtGemm:
      return "dh by gemm_bf16_nt on G and a re-laid-out W^T";
    case LogprobBwdPath::kDxForm:
      return "dh by gemm_bf16_nn_accumulate on G and W in place";
    case LogprobBwdPath::kDxFused:
      return "G from the logits GEMM's epilogue, dh by gemm_bf16_nn_accumulate on G and W in place";
  }
  return "?";
}

bool logprob_rows_in_place(const TokenOrder& order, int64_t T) {
  int64_t next = 0;
  for (const Chunk& c : make_chunks(order, T, std::max<int64_t>(T, kTokenBlock)))
    for (const Piece& p : c.pieces) {
      if (p.src != next) return false;
      next += p.n;
    }
  return next == T;
}

LogprobBwdPlan logprob_backward_plan(const LogprobVocabLayout& lay, int64_t H, int64_t T,
                                     LogprobBwdPath path, bool in_place, bool recompute) {
  LogprobBwdPlan pl;
  // recompute: slices and logits blocks of whole vocab tiles (the tile-state kernel's unit).
  const int64_t unit = recompute ? std::max<int64_t>(lay.tile, kTokenBlock) : kTokenBlock;
  const int64_t n_tiles = lay.tiles_per_segment * lay.segments;
  // kAuto: dh from G itself (no Gᵀ copy); the caller falls back to kDwForm where W is not
  // TMA-readable (linear_logprob_backward_with_path).
  pl.path = path == LogprobBwdPath::kAuto ? LogprobBwdPath::kDxFused : path;
  const bool dw_form = pl.path != LogprobBwdPath::kWtGemm;  // kDw/kDx forms: dh accumulated
  const bool fused = pl.path == LogprobBwdPath::kDxFused;   // no logits buffer
  const int64_t g_copies = pl.path == LogprobBwdPath::kDwForm ? 2 : 1;  // G (and Gᵀ)
  const int64_t S = lay.segments;
  pl.seg_pad = round_up(lay.segment_len, kTokenBlock);
  const int64_t wt_all = S * H * pl.seg_pad * 2;
  int64_t rows = std::min(dw_form ? kMaxChunkRows : kWtMaxChunkRows,
                          round_up(std::max<int64_t>(T, 1), kTokenBlock));
  for (;; rows = std::max<int64_t>(kTokenBlock, (rows * 3 / 4) / kTokenBlock * kTokenBlock)) {
    pl.rows = rows;
    pl.partial_bytes = S > 1 ? S * rows * H * 4 : 0;
    pl.gather_bytes = in_place ? 0 : rows * (round_up(H, 8) * 2 + H * 4);  // h rows + dh rows
    pl.states_bytes = recompute ? rows * (n_tiles * 12 + 4) : 0;
    const int64_t zc = std::max<int64_t>(unit, kLogitsBudget / (rows * 4) / unit * unit);
    if (dw_form) {
      // G [rows, slice] (+ Gᵀ [slice, rows]) bf16 and the logits [rows, zcols] f32.
      const int64_t left =
          kLogprobBwdWorkspaceBudget - pl.partial_bytes - pl.gather_bytes - pl.states_bytes;
      pl.zcols = std::min(zc, pl.seg_pad);
      int64_t slice =
          std::max<int64_t>(left - (fused ? 0 : rows * pl.zcols * 4), 0) / (rows * 2 * g_copies);
      slice = std::min(pl.seg_pad, slice / unit * unit);
      if (slice >= std::min(pl.seg_pad, std::max(unit, kMinSlice)) || rows <= kTokenBlock) {
        pl.slice = std::max<int64_t>(slice, unit);
        pl.zcols = fused ? pl.slice : std::min(pl.zcols, pl.slice);
        pl.z_bytes = fused ? 0 : rows * pl.zcols * 4;
        pl.g_bytes = rows * pl.slice * 2 * g_copies;
        return pl;
      }
      continue;
    }
    // kWtGemm: G_k [rows, seg_pad] (whole segments), logits, Wᵀ (once, or hidden slices).
    pl.slice = pl.seg_pad;
    pl.zcols = std::min(zc, pl.seg_pad);
    pl.z_bytes = rows * pl.zcols * 4;
    pl.g_bytes = rows * pl.seg_pad * 2;
    const int64_t left = kLogprobBwdWorkspaceBudget - (pl.g_bytes + pl.z_bytes + pl.partial_bytes +
                                                       pl.gather_bytes + pl.states_bytes);
    if (wt_all <= left) {
      pl.wt_once = true;
      pl.hc = H;
      pl.wt_bytes = wt_all;
      return pl;
    }
    int64_t hc = std::min(H, std::max<int64_t>(left, 0) / (pl.seg_pad * 2));
    if (hc < H) hc = hc >= 64 ? hc / 64 * 64 : hc;
    if (hc >= std::min<int64_t>(H, 256) || rows <= kTokenBlock) {
      pl.hc = std::max<int64_t>(hc, 1);
      pl.wt_bytes = pl.hc * pl.seg_pad * 2;
      return pl;
    }
  }
}

std::string logprob_backward_plan_string(const ContractConfig& cfg, int64_t T, int64_t H, int64_t V,
                                         LogprobBwdPath path, bool in_place, bool recompute) {
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const LogprobBwdPlan pl = logprob_backward_plan(lay, H, T, path, in_place, recompute);
  auto mib = [](int64_t b) { return double(b) / double(1 << 20); };
  char wt[160] = "";
  if (pl.path == LogprobBwdPath::kWtGemm)
    std::snprintf(wt, sizeof wt, ", Wt hidden slice=%lld (%s)", (long long)pl.hc,
                  pl.wt_once ? "built once per call" : "re-laid out per chunk and segment");
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "linear_logprob_backward: T=%lld H=%lld V=%lld S_v=%d seg_len=%lld seg_pad=%lld | "
      "%s | chunk rows=%lld (%lld chunks), vocab slice=%lld, logits columns per GEMM=%lld%s | "
      "workspace "
      "%.1f MiB = G%s %.1f + logits %.1f + Wt %.1f + segment partials %.1f + gathered "
      "rows %.1f (only when a chunk's rows are not consecutive in h) + the row table "
      "%.3f + the forward's tile states %.1f (recompute)",
      (long long)T, (long long)H, (long long)V, lay.segments, (long long)lay.segment_len,
      (long long)pl.seg_pad, logprob_bwd_path_name(pl.path), (long long)pl.rows,
      (long long)((T + pl.rows - 1) / pl.rows), (long long)pl.slice, (long long)pl.zcols, wt,
      mib(pl.total_bytes() + T * 8), pl.path == LogprobBwdPath::kDwForm ? " + G^T" : "",
      mib(pl.g_bytes), mib(pl.z_bytes), mib(pl.wt_bytes), mib(pl.partial_bytes),
      mib(pl.gather_bytes), mib(T * 8), mib(pl.states_bytes));
  return buf;
}

LogprobBwdPath linear_logprob_backward_with_path(
    const TensorView& h, const TensorView& w, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const TensorView& lse,
    const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
    const TensorView& dh, const TokenOrder& order, const TensorView& dw, LogprobBwdPath path,
    void* stream, const LogprobBwdPlan* force, const LogprobRecompute* rc) {
  const char* op = "cuda::linear_logprob_backward";
  const LogprobVocabLayout lay = contract::check_linear_logprob_backward(
      op, Device::kCUDA, h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
  const int64_t T = h.size(0), H = h.size(1), V = w.size(0);
  const bool in_place = logprob_rows_in_place(order, T);
  const int64_t L = lay.tile;
  // kDxFused reads h's rows and W's by TMA, kDxForm W's (16-byte aligned rows).
  const bool w_tma = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.stride[0] % 8 == 0;
  const bool fusable = gemm_operands_tma_ok(h.data, T, h.stride[0], w.data, V, w.stride[0], H) &&
                       (!rc || L == kLogprobFusedTile);
  if (path == LogprobBwdPath::kAuto)
    path = fusable ? LogprobBwdPath::kDxFused
                   : (w_tma ? LogprobBwdPath::kDxForm : LogprobBwdPath::kDwForm);
  LS_CHECK(path != LogprobBwdPath::kDxFused || fusable, op, "the dh path '",
           logprob_bwd_path_name(path),
           "' needs h and w TMA-readable (16-byte aligned, row strides multiples of 8, H a "
           "multiple of 8) and, recomputing the forward, vocab_tile 256 (got ",
           cfg.vocab_tile, ")");
  if (rc) {
    LS_CHECK(in_place, op,
             "recomputing the forward's outputs needs the rows in place (the order's token "
             "blocks, then the rows no sequence covers, are rows 0 .. T - 1 in order)");
    LS_CHECK(L % kTokenBlock == 0, op,
             "recomputing the forward's outputs needs vocab_tile a multiple of 16, got ", L);
    for (const TensorView* v : {&rc->logp, &rc->lse, &rc->entropy})
      LS_CHECK(
          v->dtype == DType::kF32 && v->device == Device::kCUDA && v->ndim == 1 && v->shape[0] == T,
          op, "the recomputed forward outputs (logp, lse, entropy) must be [T] = [", T,
          "] f32 device views");
  }
  LogprobBwdPlan pl = logprob_backward_plan(lay, H, T, path, in_place, /*recompute=*/rc != nullptr);
  if (force) {
    pl = *force;
    if (pl.path == LogprobBwdPath::kAuto) pl.path = LogprobBwdPath::kDwForm;
    pl.seg_pad = round_up(lay.segment_len, kTokenBlock);
    const bool wt = pl.path == LogprobBwdPath::kWtGemm;
    LS_CHECK(pl.rows >= kTokenBlock && pl.rows % kTokenBlock == 0 && pl.slice >= kTokenBlock &&
                 pl.slice % kTokenBlock == 0 && pl.zcols >= 1 && pl.zcols <= pl.slice &&
                 (!wt || (pl.slice == pl.seg_pad && pl.hc >= 1 && pl.hc <= H)),
             op,
             "internal: a forced plan must have rows and slice multiples of 16 and 1 <= zcols "
             "<= slice (kWtGemm: slice = seg_pad, hc in [1, H])");
    LS_CHECK(!rc || (pl.slice % L == 0 && pl.zcols % L == 0), op,
             "internal: a forced plan that recomputes the forward needs slice and zcols "
             "multiples of vocab_tile");
    LS_CHECK(pl.path != LogprobBwdPath::kDxFused || fusable, op,
             "internal: a forced fused plan needs h and w TMA-readable (and vocab_tile 256 when "
             "recomputing)");
    pl.states_bytes = rc ? pl.rows * (lay.tiles_per_segment * lay.segments * 12 + 4) : 0;
    if (wt) {
      pl.wt_once = pl.hc == H;
      pl.wt_bytes = (pl.wt_once ? int64_t(lay.segments) : 1) * pl.hc * pl.seg_pad * 2;
    }
  }
  if (T == 0) return pl.path;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int S = lay.segments;
  const int64_t seg_len = lay.segment_len;
  const int64_t seg_pad = pl.seg_pad, R = pl.rows;
  const bool dw_form = pl.path != LogprobBwdPath::kWtGemm;  // dh accumulated slice by slice
  const bool fused = pl.path == LogprobBwdPath::kDxFused;   // G from the GEMM's epilogue
  const bool dx_form = pl.path == LogprobBwdPath::kDxForm || fused;  // ... from G (no Gᵀ)
  const uint16_t* const wp = static_cast<const uint16_t*>(w.data);
  LS_CHECK(!dx_form || w_tma, op, "the dh path '", logprob_bwd_path_name(pl.path),
           "' needs w 16-byte aligned with a row stride that is a multiple of 8 (got ", w.stride[0],
           ")");
  const GemmConfig logits_cfg = logprob_logits_gemm(cfg);
  const GemmConfig seg_cfg{1};  // one vocab segment: one chain over seg_pad entries

  const std::vector<Chunk> chunks = make_chunks(order, T, R);
  Scratch scratch(op, s);

  // The row table: chunk rows in order, each the h row it stands for.
  std::vector<int64_t> rowmap;
  rowmap.reserve(size_t(T));
  for (const Chunk& c : chunks)
    for (const Piece& p : c.pieces)
      for (int64_t i = 0; i < p.n; ++i) rowmap.push_back(p.src + i);
  int64_t* rowmap_d = scratch.alloc_n<int64_t>(T);
  {
    // NOTE: from pageable memory: returns once the data is staged, so `rowmap` may go away.
    const cudaError_t e =
        cudaMemcpyAsync(rowmap_d, rowmap.data(), size_t(T) * 8, cudaMemcpyHostToDevice, s);
    LS_CHECK(e == cudaSuccess, op, "copy of the row table failed: ", cudaGetErrorString(e));
  }

  const int64_t slice = pl.slice;  // G columns per pass over a segment (kWtGemm: seg_pad)
  float* z = fused ? nullptr : scratch.alloc_n<float>(R * pl.zcols);
  uint16_t* G = scratch.alloc_n<uint16_t>(R * slice);
  uint16_t* Gt = dw_form && !dx_form ? scratch.alloc_n<uint16_t>(slice * R) : nullptr;
  uint16_t* wt = dw_form ? nullptr : scratch.alloc_n<uint16_t>(pl.wt_bytes / 2);
  float* partials = S > 1 ? scratch.alloc_n<float>(int64_t(S) * R * H) : nullptr;
  const int64_t ldh = round_up(H, 8);
  uint16_t* h_gather = nullptr;
  float* dh_gather = nullptr;
  auto n_of = [&](int k) { return std::clamp<int64_t>(V - int64_t(k) * seg_len, 0, seg_len); };
  auto memset2d = [&](void* p, int64_t pitch_bytes, int64_t width_bytes, int64_t height,
                      const char* what) {
    const cudaError_t e =
        cudaMemset2DAsync(p, size_t(pitch_bytes), 0, size_t(width_bytes), size_t(height), s);
    LS_CHECK(e == cudaSuccess, op, "memset of ", what, " failed: ", cudaGetErrorString(e));
  };

  // kWtGemm: Wᵀ_k hidden columns [h0, h0 + hc): wt_k[j·seg_pad + e] = W[k·seg_len + e, h0 + j]
  // for e < n_k, +0 for e in [n_k, seg_pad).
  auto relayout = [&](int k, int64_t h0, int64_t hc, uint16_t* dst) {
    const int64_t nk = n_of(k);
    LpbRelayoutParams rp{};
    rp.w = static_cast<const uint16_t*>(w.data) + int64_t(k) * seg_len * w.stride[0];
    rp.ldw = w.stride[0];
    rp.n = nk;
    rp.h0 = h0;
    rp.hc = hc;
    rp.wt = dst;
    rp.ldt = seg_pad;
    if (nk < seg_pad) memset2d(dst, hc * seg_pad * 2, hc * seg_pad * 2, 1, "the Wt padding");
    if (nk == 0) return;
    const dim3 grid(unsigned((nk + kLpbTransposeTile - 1) / kLpbTransposeTile),
                    unsigned((hc + kLpbTransposeTile - 1) / kLpbTransposeTile));
    lpb_relayout_wt_kernel<<<grid, dim3(kLpbTransposeTile, 8), 0, s>>>(rp);
    check_launch(op);
  };
  if (!dw_form && pl.wt_once)
    for (int k = 0; k < S; ++k) relayout(k, 0, H, wt + int64_t(k) * H * seg_pad);

  LpbGradParams gp{};
  gp.ldz = pl.zcols;
  gp.tok.lse = lse.ptr<float>();
  gp.tok.lse_s = lse.stride[0];
  gp.tok.entropy = entropy.ptr<float>();
  gp.tok.entropy_s = entropy.stride[0];
  gp.tok.g_lp = g_lp.ptr<float>();
  gp.tok.g_lp_s = g_lp.stride[0];
  gp.tok.g_ent = g_ent ? g_ent->ptr<float>() : nullptr;
  gp.tok.g_ent_s = g_ent ? g_ent->stride[0] : 0;
  gp.tok.targets = index_ref(targets);
  gp.tok.ignore_index = params.ignore_index;
  gp.tau = params.temperature;
  gp.z = z;
  gp.G = G;
  gp.ldg = slice;
  gp.Gt = Gt;
  gp.ldgt = R;

  // recompute: the forward's unfused producer on the same logits (tile states per z block, then
  // the fold per chunk), as linear_logprob's; tiles past the last real entry get empty states.
  const int64_t n_tiles = lay.tiles_per_segment * S, data_tiles = (V + L - 1) / L;
  float* states = rc ? scratch.alloc_n<float>(R * n_tiles * 3) : nullptr;
  float* y_target = rc ? scratch.alloc_n<float>(R) : nullptr;
  TileStateParams tiles{};
  FoldParams fold{};
  if (rc) {
    fold = fold_to_outputs(rc->logp, rc->lse, rc->entropy);
    logprob_states_shared(lay, S, V, 0, gp.tok.targets, params, states, y_target, tiles, fold);
  }
  const bool temper = params.temperature != 1.0f;  // (z from the MMA: z ⊘ 1 = z bit for bit)

  for (const Chunk& c : chunks) {
    const int64_t rows = c.rows;
    // Consecutive rows of h (one micro-batch of packed sequences in step order, typically): h
    // and dh are used in place; otherwise gathered.
    bool direct = true;
    for (size_t i = 1; i < c.pieces.size(); ++i)
      direct = direct && c.pieces[i].src == c.pieces[i - 1].src + c.pieces[i - 1].n;
    const int64_t src0 = c.pieces.front().src;
    const int64_t* rmap = rowmap_d + c.row0;
    TensorView hx;  // the chunk's rows of h: in place when consecutive, else gathered
    if (direct) {
      hx = h.rows(src0, src0 + rows);
    } else {
      if (!h_gather) {
        h_gather = scratch.alloc_n<uint16_t>(R * ldh);
        dh_gather = scratch.alloc_n<float>(R * H);
      }
      lpb_gather_rows_kernel<<<grid_for(rows * H, kLpbThreads), kLpbThreads, 0, s>>>(
          static_cast<const uint16_t*>(h.data), h.stride[0], rmap, rows, H, h_gather, ldh);
      check_launch(op);
      hx = TensorView::contiguous(h_gather, DType::kBF16, {rows, H}, Device::kCUDA);
      hx.stride[0] = ldh;
    }
    const TensorView dh_out =
        direct ? dh.rows(src0, src0 + rows)
               : TensorView::contiguous(dh_gather, DType::kF32, {rows, H}, Device::kCUDA);
    // The chunk's TokenOrder on its own rows: its pieces in canonical order (step indices
    // renumbered in that order; a sequence cut at a chunk boundary is cut at a multiple of 16
    // positions, so its blocks are the same).
    std::vector<TokenSeq> seqs;
    for (int64_t i = 0, row = 0; i < int64_t(c.pieces.size()); row += c.pieces[size_t(i)].n, ++i)
      if (c.pieces[size_t(i)].in_order)
        seqs.push_back({int64_t(seqs.size()), row, c.pieces[size_t(i)].n});
    const TokenOrder corder = TokenOrder::make(op, seqs, rows);
    gp.rows = rows;
    gp.src = rmap;
    if (rc) fill_f32(y_target, rows, kCanonicalNanF32, s, op);

    std::vector<TensorView> parts;
    for (int k = 0; k < S; ++k) {
      const int64_t nk = n_of(k), v_seg = int64_t(k) * seg_len;
      const TensorView part = S > 1 ? TensorView::contiguous(partials + int64_t(k) * R * H,
                                                             DType::kF32, {rows, H}, Device::kCUDA)
                                    : dh_out;
      if (S > 1) parts.push_back(part);
      // A chain that starts from +0 (kDwForm: dh_k is the accumulator; an all-padding segment:
      // its chain is +0 and it has no dW rows).
      if (dw_form || nk == 0)
        memset2d(part.data, part.stride[0] * 4, H * 4, rows, "a segment's dh partial");
      if (nk == 0) continue;
      // Slices of `slice` entries (a multiple of 16, so every chain continues at a k-block
      // boundary; kWtGemm: the whole segment).
      for (int64_t s0 = 0; s0 < nk; s0 += slice) {
        const int64_t ns = std::min(slice, nk - s0), v0 = v_seg + s0;
        // kWtGemm: G_k's columns [nk, seg_pad) are +0 (its K runs over seg_pad entries).
        if (!dw_form && ns < seg_pad) memset2d(G, slice * 2, slice * 2, rows, "G's padding");
        // G of the slice straight from the logits GEMM's epilogue (and the forward's tile
        // states with rc: v0 and the slice are whole 256-entry tiles).
        if (fused) {
          Sm90LpbParams fp{};
          fp.M = rows;
          fp.N = ns;
          fp.seg_len = round_up(H, kTokenBlock);
          fp.nseg = 1;
          fp.ws_mode = 0;
          fp.y = G;
          fp.ldy = slice;
          fp.y_vec = 1;
          fp.src = rmap;
          fp.tok = gp.tok;
          fp.v0 = v0;
          fp.tau = params.temperature;
          fp.states = rc ? 1 : 0;
          if (rc) fp.lp = fused_states_epilogue(tiles, src0, v0 / L);
          gemm_bf16_nt_logprob_grad(static_cast<const uint16_t*>(hx.data), hx.stride[0],
                                    wp + v0 * w.stride[0], w.stride[0], H, fp, s);
        }
        // G (and Gᵀ) of the slice: the forward's logits per column block, then the entries.
        for (int64_t e0 = 0; !fused && e0 < ns; e0 += pl.zcols) {
          const int64_t ncols = std::min(pl.zcols, ns - e0);
          TensorView zv = TensorView::contiguous(z, DType::kF32, {rows, ncols}, Device::kCUDA);
          zv.stride[0] = pl.zcols;
          gemm_bf16_nt(hx, w.rows(v0 + e0, v0 + e0 + ncols), nullptr, logits_cfg, zv, s);
          if (rc) {  // (v0 + e0 and zcols are multiples of L: the block is whole tiles)
            TileStateParams tp = tiles;
            tp.z = z;
            tp.ldz = pl.zcols;
            tp.rows = rows;
            tp.tile0 = (v0 + e0) / L;
            tp.ntiles = (ncols + L - 1) / L;
            tp.row0 = src0;
            launch_tile_states(tp, temper, s, op);
          }
          gp.e0 = e0;
          gp.ncols = ncols;
          gp.v_seg = v0;
          const dim3 grid(unsigned((ncols + kLpbTransposeTile - 1) / kLpbTransposeTile),
                          unsigned((rows + kLpbTransposeTile - 1) / kLpbTransposeTile));
          lpb_grad_kernel<<<grid, dim3(kLpbTransposeTile, 8), 0, s>>>(gp);
          check_launch(op);
        }
        // dh's segment value: one chain over the segment's entries in k-blocks of 16 from +0,
        // continued slice by slice.
        if (dx_form) {
          detail::gemm_bf16_nn_accumulate(G, slice, wp + v0 * w.stride[0], w.stride[0], rows, H, ns,
                                          static_cast<float*>(part.data), part.stride[0], nullptr,
                                          s);
        } else if (dw_form) {
          TensorView gt = TensorView::contiguous(Gt, DType::kBF16, {ns, rows}, Device::kCUDA);
          gt.stride[0] = R;
          const TokenOrder entries = TokenOrder::make(op, {{0, 0, ns}}, ns);
          gemm_bf16_dw(gt, w.rows(v0, v0 + ns), entries, part, s);
        } else {
          const TensorView gk =
              TensorView::contiguous(G, DType::kBF16, {rows, seg_pad}, Device::kCUDA);
          for (int64_t h0 = 0; h0 < H; h0 += pl.hc) {
            const int64_t hc = std::min(pl.hc, H - h0);
            uint16_t* wk = wt + (pl.wt_once ? int64_t(k) * H * seg_pad + h0 * seg_pad : 0);
            if (!pl.wt_once) relayout(k, h0, hc, wk);
            TensorView y = TensorView::contiguous(static_cast<float*>(part.data) + h0, DType::kF32,
                                                  {rows, hc}, Device::kCUDA);
            y.stride[0] = part.stride[0];
            gemm_bf16_nt(gk, TensorView::contiguous(wk, DType::kBF16, {hc, seg_pad}, Device::kCUDA),
                         nullptr, seg_cfg, y, s);
          }
        }
        // dW rows [v0, v0 + ns): the chunk's blocks continue every element's chain.
        if (!corder.empty()) {
          TensorView dy = TensorView::contiguous(G, DType::kBF16, {rows, ns}, Device::kCUDA);
          dy.stride[0] = slice;
          gemm_bf16_dw(dy, hx, corder, dw.rows(v0, v0 + ns), s);
        }
      }
    }
    if (rc) {
      launch_padding_tile_states(tiles, data_tiles, rows, s, op);
      fold.rows = rows;
      fold.row0 = src0;
      launch_fold(fold, s, op);
    }
    if (S > 1) gemm_tree_combine(parts, nullptr, dh_out, s);
    if (!direct) {
      lpb_scatter_rows_kernel<<<grid_for(rows * H, kLpbThreads), kLpbThreads, 0, s>>>(
          dh_gather, H, rmap, rows, H, dh.ptr<float>(), dh.stride[0]);
      check_launch(op);
    }
  }
  return pl.path;
}

}  // namespace detail

void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                             const LogprobParams& params, const ContractConfig& cfg,
                             const TensorView& lse, const TensorView& entropy,
                             const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                             const TokenOrder& order, const TensorView& dw, void* stream) {
  (void)detail::linear_logprob_backward_with_path(h, w, targets, params, cfg, lse, entropy, g_lp,
                                                  g_ent, dh, order, dw,
                                                  detail::LogprobBwdPath::kAuto, stream);
}

bool linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                       const TensorView& targets, const LogprobParams& params,
                                       const ContractConfig& cfg, const TensorView& lse,
                                       const TensorView& entropy, const TensorView& g_lp,
                                       const TensorView* g_ent, const TensorView& dh,
                                       const TokenOrder& order, const TensorView& dw,
                                       const TensorView& logp_out, const TensorView& lse_out,
                                       const TensorView& entropy_out, void* stream) {
  // The one pass where the rows are in place and vocab_tile is a multiple of 16 (a malformed h
  // takes the two ops, whose checks report it).
  const int64_t T = h.ndim == 2 ? h.size(0) : 0;
  if (cfg.vocab_tile % kTokenBlock != 0 || !detail::logprob_rows_in_place(order, T)) {
    linear_logprob(h, w, targets, params, cfg, logp_out, lse_out, entropy_out, stream);
    linear_logprob_backward(h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh, order, dw,
                            stream);
    return false;
  }
  const detail::LogprobRecompute rc{logp_out, lse_out, entropy_out};
  (void)detail::linear_logprob_backward_with_path(
      h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh, order, dw,
      detail::LogprobBwdPath::kAuto, stream, nullptr, &rc);
  return true;
}

}  // namespace lockstep::cuda
