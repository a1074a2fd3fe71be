// Host-side pieces shared by the CUDA LogP launchers (logprob.cu) and sampling (sampling.cu):
// stream-ordered scratch, the bounded work plan (token block x vocab chunk; its size depends on
// V, H and the settings only, never on T), and host-or-device index arguments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/elementwise_common.cuh"
#include "lockstep/contract.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda::detail {

// cudaMallocAsync'd buffers, freed (cudaFreeAsync, same stream) when this goes out of scope —
// also when the op throws.
class Scratch {
 public:
  Scratch(const char* op, cudaStream_t stream) : op_(op), stream_(stream) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  void* alloc(int64_t bytes);
  template <typename T>
  T* alloc_n(int64_t n) {
    return static_cast<T*>(alloc(n * int64_t(sizeof(T))));
  }
  int64_t bytes() const { return bytes_; }

 private:
  const char* op_;
  cudaStream_t stream_;
  std::vector<void*> ptrs_;
  int64_t bytes_ = 0;
};

// The LogP work plan for one call's vocab part (n_tiles tiles of L entries).
struct LogprobPlan {
  int64_t n_tiles = 0;      // tiles of the (local) vocab
  int64_t L = 0;            // vocab_tile
  int64_t token_block = 0;  // tokens per block (the last block may be shorter)
  int64_t chunk_tiles = 0;  // tiles per vocab chunk (one GEMM call)
  int64_t chunks = 0;
  int64_t logits_bytes = 0;  // [token_block, chunk_tiles·L] f32
  int64_t states_bytes = 0;  // [token_block, n_tiles] (m, s, w)
  int64_t target_bytes = 0;  // [token_block] f32
  int64_t total_bytes() const { return logits_bytes + states_bytes + target_bytes; }
};
LogprobPlan logprob_plan(int64_t n_tiles, int64_t L);

// The logits -> tile-states producer of linear_logprob / _partial.
//   kUnfused: GEMM (cuda::gemm_bf16_nt, fp32) into the bounded logits scratch, then the tile-state
//             kernel (logprob.cuh), chunk by chunk;
//   kFused:   the Hopper GEMM kernel (src/cuda/gemm/mainloop_sm90.cuh) with the log-prob epilogue
//             (logprob_epilogue.cuh): tile states straight from the accumulators, no logits.
// Both write the same bits (tested). The launcher picks kFused iff vocab_tile == 256,
// T > kLogprobFusedMinRows, and h and w are TMA-compatible (16-byte aligned
// bases, row strides a multiple of 8 elements): sizes, settings and alignment only.
enum class LogprobProducer : int { kAuto = 0, kFused, kUnfused };
constexpr int64_t kLogprobFusedMinRows = 64;  // the GEMM's small-M kernel takes T <= 64
// Settings / sizes part of the choice (alignment is checked at the call).
bool logprob_fused_by_settings(const ContractConfig& cfg, int64_t T);
// The fused plan: one GEMM launch per token block over the whole local vocab, no logits scratch.
LogprobPlan logprob_fused_plan(int64_t n_tiles, int64_t L);
const char* logprob_producer_name(LogprobProducer p);

// cuda::linear_logprob / _partial with the producer as an option: kAuto is the launcher's choice
// (what the public functions run); kFused runs the fused producer wherever it can (the settings
// and alignment still decide; T does not), kUnfused never. Returns the producer that ran.
LogprobProducer linear_logprob_with_producer(const TensorView& h, const TensorView& w,
                                             const TensorView& targets, const LogprobParams& params,
                                             const ContractConfig& cfg, const TensorView& logp,
                                             const TensorView& lse, const TensorView& entropy,
                                             LogprobProducer producer, void* stream = nullptr);
LogprobProducer linear_logprob_partial_with_producer(
    const TensorView& h, const TensorView& w_shard, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const LogprobShard& shard,
    const TensorView& state, LogprobProducer producer, void* stream = nullptr);

// Sampling's plan: a row block holds whole padded vocab rows (the filters need the full row).
struct SamplePlan {
  int64_t row_block = 0;  // rows per GEMM call
  int64_t logits_bytes = 0, states_bytes = 0;
};
SamplePlan sample_plan(const LogprobVocabLayout& lay);

// A [T] i32/i64 index argument on the device: a device view as is (trusted), or a host view whose
// values were already checked, copied (as i64) into scratch on `stream`.
IndexRef stage_index(const TensorView& v, Scratch& scratch, cudaStream_t stream);

// The tile-state kernel (logprob.cuh) for tp (temper: y = z / tp.tau), register-cached when
// vocab_tile <= 256.
struct TileStateParams;
void launch_tile_states(const TileStateParams& tp, bool temper, cudaStream_t stream,
                        const char* op);
// The empty states of tiles.n_tiles's tiles [data_tiles, n_tiles) of `rows` rows (all padding:
// nothing is read), as the forward gives them; `tiles` as logprob_states_shared (logprob.cuh)
// sets it.
void launch_padding_tile_states(const TileStateParams& tiles, int64_t data_tiles, int64_t rows,
                                cudaStream_t stream, const char* op);

// Fills n floats with the bit pattern `bits` (e.g. canonical NaN) on `stream`.
void fill_f32(float* p, int64_t n, uint32_t bits, cudaStream_t stream, const char* op);

}  // namespace lockstep::cuda::detail
