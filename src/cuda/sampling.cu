// Launcher of cuda::sample (docs/contract.md §S; kernels: sampling.cuh, logprob.cuh). Per block of
// rows (bounded: whole padded vocab rows, sample_plan): logits by the GEMM contract into scratch,
// y = z / τ_lp, the LogP tile states / fold / finish (lse, entropy: §S.3 = §L exactly), then the
// choice — greedy and plain rows in one kernel; top-k / top-p rows sorted by (y desc, v asc) with
// CUB's segmented radix sort (unique 53-bit keys: the order is total, stability does not matter)
// and filtered with exact integer masses. Results go to [T] scratch; the op then synchronizes the
// stream, throws lockstep::Error naming the first row whose lse is not finite (writing nothing),
// and otherwise scatters ids, logp, lse, entropy into the outputs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <vector>

#include "contract/checks.h"
#include "cuda/logprob_internal.h"
#include "cuda/sampling.cuh"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::cuda {
namespace {

static_assert(kSampleMaxVocab == int64_t(1) << detail::kVocabBits,
              "the kernels pack vocab ids in kVocabBits");

void check_cuda(const char* op, cudaError_t e, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, " failed: ", cudaGetErrorString(e));
}

}  // namespace

void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
            const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
            const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
            const TensorView& entropy, void* stream) {
  const char* op = "cuda::sample";
  contract::check_sample(op, Device::kCUDA, h, w, params, request_ids, positions, cfg, token_ids,
                         logp, lse, entropy);
  const int64_t T = h.size(0), V = w.size(0);
  if (T == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t n_tiles = lay.padded / lay.tile;
  const detail::SamplePlan sp = detail::sample_plan(lay);

  // Per-row settings and mode.
  std::vector<detail::SampleRow> info(static_cast<size_t>(T));
  bool any_sorted = false;
  for (int64_t t = 0; t < T; ++t) {
    const SamplingParams& p = params[size_t(t)];
    detail::SampleRow& r = info[size_t(t)];
    r.seed = p.seed;
    r.temperature = p.temperature;
    r.tau_lp = p.logprob_temperature();
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    r.top_k_on = (p.top_k > 0 && p.top_k < V) ? 1 : 0;
    if (p.temperature == 0.0f) {
      r.mode = detail::kGreedy;
    } else if (r.top_k_on || p.top_p < 1.0f) {
      r.mode = detail::kSorted;
      any_sorted = true;
    } else {
      r.mode = detail::kPlain;  // min-p alone is an elementwise test: no sort
    }
  }

  detail::Scratch scratch(op, s);
  detail::SampleRow* d_info = scratch.alloc_n<detail::SampleRow>(T);
  check_cuda(op,
             cudaMemcpyAsync(d_info, info.data(), size_t(T) * sizeof(detail::SampleRow),
                             cudaMemcpyHostToDevice, s),
             "copy of the sampling params");
  const detail::IndexRef rid = detail::stage_index(request_ids, scratch, s);
  const detail::IndexRef pos = detail::stage_index(positions, scratch, s);
  int64_t* out_id = scratch.alloc_n<int64_t>(T);
  float* out_logp = scratch.alloc_n<float>(T);
  float* out_lse = scratch.alloc_n<float>(T);
  float* out_ent = scratch.alloc_n<float>(T);
  const int64_t rows_max = std::min(T, sp.row_block);
  float* z = scratch.alloc_n<float>(rows_max * lay.padded);
  float* states = scratch.alloc_n<float>(rows_max * n_tiles * 3);

  uint64_t* keys_in = nullptr;
  uint64_t* keys_out = nullptr;
  int* offsets = nullptr;
  void* cub_temp = nullptr;
  size_t cub_bytes = 0;
  if (any_sorted) {
    keys_in = scratch.alloc_n<uint64_t>(sp.sort_batch * V);
    keys_out = scratch.alloc_n<uint64_t>(sp.sort_batch * V);
    offsets = scratch.alloc_n<int>(sp.sort_batch + 1);
    detail::sample_offsets_kernel<<<1, 128, 0, s>>>(offsets, int(sp.sort_batch), int(V));
    detail::check_launch(op);
  }

  // The row-state launches of every block (all of a row's tiles; the rows are per block).
  detail::TileStateParams tp{};
  tp.z = z;
  tp.ldz = lay.padded;
  tp.ntiles = n_tiles;
  tp.L = lay.tile;
  tp.valid = V;
  tp.tau = 1.0f;  // unused: y is already tempered
  tp.states = states;
  tp.n_tiles = n_tiles;
  detail::FoldParams fp{};
  fp.states = states;
  fp.n_tiles = n_tiles;
  fp.tps = lay.tiles_per_segment;
  fp.seg_count = lay.segments;
  fp.mode = detail::kFoldRowStats;
  fp.lse = out_lse;
  fp.entropy = out_ent;
  fp.lse_s = 1;
  fp.entropy_s = 1;

  const GemmConfig gcfg = logprob_logits_gemm(cfg);
  for (int64_t r0 = 0; r0 < T; r0 += sp.row_block) {
    const int64_t rows = std::min(sp.row_block, T - r0);
    TensorView zv = TensorView::contiguous(z, DType::kF32, {rows, V}, Device::kCUDA);
    zv.stride[0] = lay.padded;
    gemm_bf16_nt(h.rows(r0, r0 + rows), w, nullptr, gcfg, zv, stream);

    detail::SampleBlockParams bp{};
    bp.y = z;
    bp.ldy = lay.padded;
    bp.rows = rows;
    bp.row0 = r0;
    bp.V = V;
    bp.info = d_info;
    bp.rid = rid;
    bp.pos = pos;
    bp.lse = out_lse;
    bp.out_id = out_id;
    bp.out_logp = out_logp;
    detail::sample_temper_kernel<<<detail::grid_for(rows * lay.padded, 256), 256, 0, s>>>(bp);
    detail::check_launch(op);

    // The LogP state of each row at τ_lp (§S.3): tile states of the already tempered y, fold,
    // tree, finish -> lse, entropy.
    tp.rows = rows;
    detail::launch_tile_states(tp, false, s, op);
    fp.rows = rows;
    fp.row0 = r0;
    detail::launch_fold(fp, s, op);

    detail::sample_select_kernel<<<unsigned(rows), detail::kSelectThreads, 0, s>>>(bp);
    detail::check_launch(op);

    if (!any_sorted) continue;
    std::vector<int> sorted_rows;
    for (int64_t r = 0; r < rows; ++r)
      if (info[size_t(r0 + r)].mode == detail::kSorted) sorted_rows.push_back(int(r));
    for (size_t b0 = 0; b0 < sorted_rows.size(); b0 += size_t(sp.sort_batch)) {
      detail::SortRows sr{};
      sr.n = int(std::min<size_t>(size_t(sp.sort_batch), sorted_rows.size() - b0));
      for (int i = 0; i < sr.n; ++i) sr.row[i] = sorted_rows[b0 + size_t(i)];
      const dim3 kgrid(unsigned(std::min<int64_t>((V + 255) / 256, 1024)), unsigned(sr.n));
      detail::sample_keys_kernel<<<kgrid, 256, 0, s>>>(bp, sr, keys_in);
      detail::check_launch(op);
      const int items = int(int64_t(sr.n) * V);
      size_t need = 0;
      check_cuda(op,
                 cub::DeviceSegmentedRadixSort::SortKeys(nullptr, need, keys_in, keys_out, items,
                                                         sr.n, offsets, offsets + 1, 0,
                                                         detail::kVocabBits + 32, s),
                 "cub segmented sort (size query)");
      if (need > cub_bytes) {
        cub_temp = scratch.alloc(int64_t(need));
        cub_bytes = need;
      }
      check_cuda(op,
                 cub::DeviceSegmentedRadixSort::SortKeys(cub_temp, cub_bytes, keys_in, keys_out,
                                                         items, sr.n, offsets, offsets + 1, 0,
                                                         detail::kVocabBits + 32, s),
                 "cub segmented sort");
      detail::sample_filter_kernel<<<unsigned(sr.n), detail::kSelectThreads, 0, s>>>(bp, sr,
                                                                                     keys_out);
      detail::check_launch(op);
    }
  }

  // A row that cannot be sampled is an error, and then nothing is written (§S.3).
  std::vector<float> host_lse(static_cast<size_t>(T));
  check_cuda(op,
             cudaMemcpyAsync(host_lse.data(), out_lse, size_t(T) * 4, cudaMemcpyDeviceToHost, s),
             "copy of the row logsumexps");
  check_cuda(op, cudaStreamSynchronize(s), "stream synchronize");
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

}  // namespace lockstep::cuda
