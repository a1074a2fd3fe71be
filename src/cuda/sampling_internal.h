// Host-side pieces of cuda::sample (docs/contract.md §S; kernels: sampling.cuh) that the parity
// test and the sampling benchmark call directly: a block of rows is (1) its LogP state (y = z /
// τ_lp, tile states, fold -> lse, entropy: §S.3 = §L) and (2) the choice (the filters, then the
// mass choice: §S.4-S.7). The op runs (1) then (2) per row block after the logits GEMM; the
// benchmark times (2) alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/elementwise_common.cuh"  // IndexRef
#include "lockstep/contract/logprob.h"
#include "lockstep/contract/sampling.h"

namespace lockstep::cuda::detail {

enum SampleMode : int { kGreedy = 0, kPlain = 1, kFiltered = 2 };

// One row's settings (from SamplingParams, on the device).
struct SampleRow {
  uint64_t seed;
  float temperature;
  float tau_lp;  // logprob_temperature()
  int64_t top_k;
  float top_p;
  float min_p;
  int mode;      // SampleMode: kPlain = no filter or min-p only, kFiltered = top-k and/or top-p
  int top_k_on;  // 0 < top_k < V
};
SampleRow sample_row(const SamplingParams& p, int64_t V);

// A block of `rows` rows (token rows row0 ...) of one cuda::sample call.
struct SampleBlockParams {
  float* y;  // [rows, ldy]: z before sample_block_state, y = z / τ_lp (padding −inf) after
  int64_t ldy, rows, row0, V;
  float* states;  // [rows, n_tiles, 3]: the rows' LogP tile states (m, s, w)
  int64_t n_tiles, tile;
  const SampleRow* info;    // [T]
  IndexRef rid, pos;        // [T]
  float* lse;               // [T] (row stats, canonical)
  float* entropy;           // [T]
  int64_t* out_id;          // [T]
  float* out_logp;          // [T]
  unsigned long long* seg;  // [rows, sample_seg_count()]: plain rows' segment masses (scratch)
  // The block holds a plain row (its segment masses are needed; set on the host from the rows'
  // modes: 0 skips the masses' kernel).
  int any_plain = 1;
};

// (1) y = z / τ_lp, the tile states and fold of every row of the block: lse, entropy (§S.3).
void sample_block_state(const SampleBlockParams& p, const LogprobVocabLayout& lay,
                        cudaStream_t stream, const char* op);
// (2) The filters and the choice of every row of the block (one CTA per row): out_id, out_logp
// (−1 / NaN for a row whose lse is not finite).
void sample_block_choose(const SampleBlockParams& p, cudaStream_t stream, const char* op);
// Segments of a plain row's mass sums (SampleBlockParams::seg holds rows × this many).
int64_t sample_seg_count();
// The choice kernel's configuration (threads, shared memory, bucket and list sizes), printable.
std::string sample_choose_config();

}  // namespace lockstep::cuda::detail
