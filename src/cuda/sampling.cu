// Launcher of cuda::sample (docs/contract.md §S; kernels: sampling.cuh, logprob.cuh). Per block of
// rows (bounded: whole padded vocab rows, sample_plan): logits by the GEMM contract into scratch,
// then sample_block_state (y = z / τ_lp, the LogP tile states / fold / finish: lse, entropy, §S.3
// = §L exactly) and sample_block_choose (one CTA per row: greedy's argmax, or the filters by an
// exact radix select on the canonical order, then the mass choice; sampling.cuh). Results go to [T]
// scratch; the op then synchronizes the stream, throws lockstep::Error naming the first row whose
// lse is not finite (writing nothing), and otherwise scatters ids, logp, lse, entropy into the
// outputs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "contract/checks.h"
#include "cuda/logprob_internal.h"
#include "cuda/sampling.cuh"
#include "cuda/sampling_internal.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::cuda {
namespace detail {

static_assert(kSampleMaxVocab == int64_t(1) << kVocabBits,
              "the kernels pack vocab ids in kVocabBits");
static_assert(sizeof(ChooseSmem) <= 227 * 1024, "the choice kernel's shared memory fits an SM");

namespace {
void check_cuda(const char* op, cudaError_t e, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, " failed: ", cudaGetErrorString(e));
}
}  // namespace

SampleRow sample_row(const SamplingParams& p, int64_t V) {
  SampleRow r{};
  r.seed = p.seed;
  r.temperature = p.temperature;
  r.tau_lp = p.logprob_temperature();
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k_on = (p.top_k > 0 && p.top_k < V) ? 1 : 0;
  if (p.temperature == 0.0f) {
    r.mode = kGreedy;
  } else if (r.top_k_on || p.top_p < 1.0f) {
    r.mode = kFiltered;
  } else {
    r.mode = kPlain;  // min-p alone is an elementwise test
  }
  return r;
}

void sample_block_state(const SampleBlockParams& p, const LogprobVocabLayout& lay,
                        cudaStream_t stream, const char* op) {
  sample_temper_kernel<<<grid_for(p.rows * p.ldy, 256), 256, 0, stream>>>(p);
  check_launch(op);
  // The LogP state of each row at τ_lp (§S.3): tile states of the already tempered y, fold, tree,
  // finish -> lse, entropy.
  const TileStateParams tp{.z = p.y,
                           .ldz = p.ldy,
                           .rows = p.rows,
                           .ntiles = p.n_tiles,
                           .L = p.tile,
                           .valid = p.V,
                           .tau = 1.0f,  // unused: y is already tempered
                           .states = p.states,
                           .n_tiles = p.n_tiles};
  launch_tile_states(tp, false, stream, op);
  const FoldParams fp{.states = p.states,
                      .n_tiles = p.n_tiles,
                      .tps = lay.tiles_per_segment,
                      .seg_count = lay.segments,
                      .rows = p.rows,
                      .row0 = p.row0,
                      .mode = kFoldRowStats,
                      .lse = p.lse,
                      .entropy = p.entropy,
                      .lse_s = 1,
                      .entropy_s = 1};
  launch_fold(fp, stream, op);
}

void sample_block_choose(const SampleBlockParams& p, cudaStream_t stream, const char* op) {
  if (p.rows == 0) return;
  const int smem = int(sizeof(ChooseSmem));
  check_cuda(
      op,
      cudaFuncSetAttribute(sample_choose_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
      "shared memory size of the choice kernel");
  if (p.any_plain) {
    sample_plain_sums_kernel<<<dim3(kPlainSlices, unsigned(p.rows)), kPlainThreads, 0, stream>>>(p);
    check_launch(op);
  }
  sample_choose_kernel<<<unsigned(p.rows), kChooseThreads, size_t(smem), stream>>>(p);
  check_launch(op);
}

int64_t sample_seg_count() { return kPlainSegs; }

std::string sample_choose_config() {
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "choice: 1 CTA of %d threads per row, %.1f KiB shared memory (plain rows' "
                "masses: %d CTAs of %d threads per row); top-k/top-p: level "
                "0 = %d bins of 1/128 nat of lse - y + tail, list of %d boundary entries (top-k "
                "<= tiles: bins from the tile maxima; top-p <= %.6f alone: bins bracketed from "
                "level 0's counts, one mass pass), %d-bit list digits, %d-bit row digits past the "
                "list, then %d segments' masses",
                kChooseThreads, double(sizeof(ChooseSmem)) / 1024.0, kPlainSlices, kPlainThreads,
                kBuckets - 1, kListCap, double(kBracketTopPMax), kListDigitBits, kBucketBits,
                kChooseWarps);
  return buf;
}

}  // namespace detail

namespace {

// sample and sample_logits after their checks: T rows of vocab V; `logits(r0, rows, zv)` writes
// the raw logits of rows [r0, r0 + rows) into zv ([rows, V] f32, row stride lay.padded) on the
// stream; then each block's tempering, LogP state and choice, and the scatter of the results.
template <typename LogitsFn>
void sample_rows(const char* op, int64_t T, int64_t V, std::span<const SamplingParams> params,
                 const TensorView& request_ids, const TensorView& positions,
                 const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                 const TensorView& lse, const TensorView& entropy, cudaStream_t s,
                 const LogitsFn& logits) {
  if (T == 0) return;
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t n_tiles = lay.padded / lay.tile;
  const detail::SamplePlan sp = detail::sample_plan(lay);

  std::vector<detail::SampleRow> info(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) info[size_t(t)] = detail::sample_row(params[size_t(t)], V);

  detail::Scratch scratch(op, s);
  detail::SampleRow* d_info = scratch.alloc_n<detail::SampleRow>(T);
  detail::check_cuda(op,
                     cudaMemcpyAsync(d_info, info.data(), size_t(T) * sizeof(detail::SampleRow),
                                     cudaMemcpyHostToDevice, s),
                     "copy of the sampling params");
  int64_t* out_id = scratch.alloc_n<int64_t>(T);
  float* out_logp = scratch.alloc_n<float>(T);
  float* out_lse = scratch.alloc_n<float>(T);
  float* out_ent = scratch.alloc_n<float>(T);
  const int64_t rows_max = std::min(T, sp.row_block);
  float* z = scratch.alloc_n<float>(rows_max * lay.padded);

  detail::SampleBlockParams bp{
      .y = z,
      .ldy = lay.padded,
      .V = V,
      .states = scratch.alloc_n<float>(rows_max * n_tiles * 3),
      .n_tiles = n_tiles,
      .tile = lay.tile,
      .info = d_info,
      .rid = detail::stage_index(request_ids, scratch, s),
      .pos = detail::stage_index(positions, scratch, s),
      .lse = out_lse,
      .entropy = out_ent,
      .out_id = out_id,
      .out_logp = out_logp,
      .seg = scratch.alloc_n<unsigned long long>(rows_max * detail::sample_seg_count())};
  for (int64_t r0 = 0; r0 < T; r0 += sp.row_block) {
    const int64_t rows = std::min(sp.row_block, T - r0);
    TensorView zv = TensorView::contiguous(z, DType::kF32, {rows, V}, Device::kCUDA);
    zv.stride[0] = lay.padded;
    logits(r0, rows, zv);
    bp.rows = rows;
    bp.row0 = r0;
    bp.any_plain = 0;
    for (int64_t t = r0; t < r0 + rows; ++t)
      bp.any_plain |= info[size_t(t)].mode == detail::kPlain ? 1 : 0;
    detail::sample_block_state(bp, lay, s, op);
    detail::sample_block_choose(bp, s, op);
  }
  // A row that cannot be sampled is an error, and then nothing is written (§S.3).
  std::vector<float> host_lse(static_cast<size_t>(T));
  detail::check_cuda(
      op, cudaMemcpyAsync(host_lse.data(), out_lse, size_t(T) * 4, cudaMemcpyDeviceToHost, s),
      "copy of the row logsumexps");
  detail::check_cuda(op, cudaStreamSynchronize(s), "stream synchronize");
  for (int64_t t = 0; t < T; ++t) {
    LS_CHECK(std::isfinite(host_lse[size_t(t)]), op, "row ", t, ": logsumexp is ",
             host_lse[size_t(t)], " (NaN or +inf logits, or every logit -inf): nothing to sample");
  }
  detail::SampleScatterParams sc{};
  sc.T = T;
  sc.id = out_id;
  sc.logp = out_logp;
  sc.lse = out_lse;
  sc.entropy = out_ent;
  sc.token_ids = token_ids.data;
  sc.ids64 = token_ids.dtype == DType::kI64 ? 1 : 0;
  sc.o_logp = logp.ptr<float>();
  sc.o_lse = lse.ptr<float>();
  sc.o_entropy = entropy.ptr<float>();
  sc.s_ids = token_ids.stride[0];
  sc.s_logp = logp.stride[0];
  sc.s_lse = lse.stride[0];
  sc.s_entropy = entropy.stride[0];
  detail::sample_scatter_kernel<<<detail::grid_for(T, 256), 256, 0, s>>>(sc);
  detail::check_launch(op);
}

}  // namespace

void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
            const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
            const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
            const TensorView& entropy, void* stream) {
  const char* op = "cuda::sample";
  contract::check_sample(op, Device::kCUDA, h, w, params, request_ids, positions, cfg, token_ids,
                         logp, lse, entropy);
  const GemmConfig gcfg = logprob_logits_gemm(cfg);
  sample_rows(op, h.size(0), w.size(0), params, request_ids, positions, cfg, token_ids, logp, lse,
              entropy, static_cast<cudaStream_t>(stream),
              [&](int64_t r0, int64_t rows, const TensorView& zv) {
                gemm_bf16_nt(h.rows(r0, r0 + rows), w, nullptr, gcfg, zv, stream);
              });
}

void lm_head_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg,
                    const TensorView& z, void* stream) {
  contract::check_lm_head_logits("cuda::lm_head_logits", Device::kCUDA, h, w, cfg, z);
  if (h.size(0) == 0 || w.size(0) == 0) return;
  gemm_bf16_nt(h, w, nullptr, logprob_logits_gemm(cfg), z, stream);
}

void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                   const TensorView& request_ids, const TensorView& positions,
                   const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                   const TensorView& lse, const TensorView& entropy, void* stream) {
  const char* op = "cuda::sample_logits";
  contract::check_sample_logits(op, Device::kCUDA, z, params, request_ids, positions, cfg,
                                token_ids, logp, lse, entropy);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t V = z.size(1);
  sample_rows(op, z.size(0), V, params, request_ids, positions, cfg, token_ids, logp, lse, entropy,
              s, [&](int64_t r0, int64_t rows, const TensorView& zv) {
                // The block's rows into the padded scratch (the tempering kernel pads).
                detail::check_cuda(op,
                                   cudaMemcpy2DAsync(zv.data, size_t(zv.stride[0]) * 4,
                                                     z.ptr<const float>() + r0 * z.stride[0],
                                                     size_t(z.stride[0]) * 4, size_t(V) * 4,
                                                     size_t(rows), cudaMemcpyDeviceToDevice, s),
                                   "copy of the logits");
              });
}

}  // namespace lockstep::cuda
