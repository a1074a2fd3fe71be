// The log-prob backward's fused GEMM epilogue (docs/contract.md §B.8; the kDxFused path of
// src/cuda/backward/logprob.cu): the Hopper kernel's 128x256 tiles of the logits z = h·Wᵀ (one
// segment, the GEMM contract's chain, as cuda::gemm_bf16_nt computes them) become G's bf16 entries
// straight from the accumulators — lpb_entry_f32 per entry (logprob.cuh), rounded by
// pack_bf16_rn_canonical (RNE, canonical NaN: the bits of lpb_entry's f32_to_bf16_bits) — instead
// of z going through global memory to lpb_grad_kernel. With `states` (the one pass, §B.8 "The
// forward from the backward"; vocab_tile 256 = the tile's width) the same accumulators first give
// the forward's tile states and target logits (the forward's fused epilogue,
// src/cuda/logprob_epilogue.cuh). G [M, ldy] (y, ldy of the
// parameters): column n = vocab id v0 + n; rows >= M and columns >= N are not written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/backward/logprob.cuh"  // LpbTokenInputs, lpb_entry_f32
#include "cuda/logprob_epilogue.cuh"  // Sm90LpParams, sm90_logprob_epilogue
#include "cuda/mma_sync.cuh"          // pack_bf16_rn_canonical

namespace lockstep::cuda::detail {

// The fused kernel's parameters: the forward's (its `lp` used when `states` is set; y = G with
// ldy = ldg, y_vec = 1) and G's.
struct Sm90LpbParams : Sm90LpParams {
  int states;          // 1: also the forward's tile states (lp) from the same accumulators
  const int64_t* src;  // [M]: the micro-batch row of the launch's row m (token inputs)
  LpbTokenInputs tok;
  int64_t v0;  // vocab id of column 0
  float tau;
};

// Thread (warp, lane) holds rows wrow0 + lane/4 + 8h (h = 0, 1) and columns 8i + 2(lane%4) + c of
// them in acc[4i + 2h + c] (logprob_epilogue.cuh says how). 32 columns (16 accumulators) at a time
// through this warp's staging rows: each thread turns its own entries into G's fp32 values there
// (the loops stay rolled, as the forward's do, and acc is only read), then each lane rounds and
// stores 8-column chunks of the warp's 16 rows (16-byte stores along G's rows).
__device__ __forceinline__ void sm90_logprob_grad_epilogue(const Sm90LpbParams& p,
                                                           float (&acc)[128], float* buf,
                                                           int64_t wrow0, int64_t n0, int lane) {
  if (p.states) {
    sm90_logprob_epilogue(p, acc, buf, wrow0, n0, lane);  // (sets columns >= N to −inf)
    __syncwarp();
  }
  const bool with_ent = p.tok.g_ent != nullptr;
  const int q = lane & 3;
  LpbToken tk0, tk1;
  {
    const int64_t r0 = wrow0 + (lane >> 2), r1 = r0 + 8;
    const LpbToken none{0.0f, 0.0f, 0.0f, 0.0f, -1, true};  // a row past M: never stored
    tk0 = r0 < p.M ? p.tok.load(p.src[r0]) : none;
    tk1 = r1 < p.M ? p.tok.load(p.src[r1]) : none;
  }
  const int64_t v = p.v0 + n0 + 2 * q;  // vocab id of this thread's column 2q (+ 8i + c)
  uint16_t* const G = static_cast<uint16_t*>(p.y);
#pragma unroll 1
  for (int qc = 0; qc < 8; ++qc) {  // columns 32qc .. 32qc + 31 = acc[16qc .. 16qc + 15]
#pragma unroll
    for (int qq = 0; qq < 8; ++qq)
      if (qq == qc) {
#pragma unroll
        for (int k = 0; k < 16; ++k) buf[k * 32 + lane] = acc[16 * qq + k];
      }
#pragma unroll 1
    for (int k = 0; k < 16; ++k) {  // column 8(4qc + k/4) + 2q + k%2 of row h = (k/2) % 2
      const bool h1 = (k & 2) != 0;
      LpbToken tk;  // (field by field: a select of whole structs went through the stack)
      tk.lse = h1 ? tk1.lse : tk0.lse;
      tk.mu = h1 ? tk1.mu : tk0.mu;
      tk.g_lp = h1 ? tk1.g_lp : tk0.g_lp;
      tk.g_ent = h1 ? tk1.g_ent : tk0.g_ent;
      tk.target = h1 ? tk1.target : tk0.target;
      tk.ignored = h1 ? tk1.ignored : tk0.ignored;
      float& x = buf[k * 32 + lane];
      x = lpb_entry_f32(x, v + 8 * (4 * qc + (k >> 2)) + (k & 1), tk, with_ent, p.tau);
    }
    __syncwarp();
    // Chunk (row r, 8-column block cb): entries k = 4cb + 2h + c of lanes 4(r % 8) + q', h = r / 8.
#pragma unroll 1
    for (int t = 0; t < 2; ++t) {
      const int chunk = lane + 32 * t, r = chunk >> 2, cb = chunk & 3;
      const int64_t row = wrow0 + r, col = n0 + 32 * qc + 8 * cb;
      const float* src = buf + (4 * cb + 2 * (r >> 3)) * 32 + 4 * (r & 7);
      const uint32_t w0 = pack_bf16_rn_canonical(src[0], src[32]);
      const uint32_t w1 = pack_bf16_rn_canonical(src[1], src[33]);
      const uint32_t w2 = pack_bf16_rn_canonical(src[2], src[34]);
      const uint32_t w3 = pack_bf16_rn_canonical(src[3], src[35]);
      if (row >= p.M || col >= p.N) continue;
      uint16_t* const dst = G + row * p.ldy + col;
      if (col + 8 <= p.N) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w0, w1, w2, w3);
      } else {  // the last chunk of a row whose N is not a multiple of 8
#pragma unroll 1
        for (int e = 0; e < int(p.N - col); ++e) {
          const uint32_t wd = e < 2 ? w0 : e < 4 ? w1 : e < 6 ? w2 : w3;
          dst[e] = uint16_t(wd >> (16 * (e & 1)));
        }
      }
    }
    __syncwarp();  // the chunks are read before the next piece's entries are written
  }
}

// The epilogue as the Hopper kernel's Epi parameter.
struct LogprobGradEpilogue {
  using Params = Sm90LpbParams;
  static constexpr bool kFused = true;
  __device__ __forceinline__ static void apply(const Params& p, float (&acc)[128], float* buf,
                                               int64_t wrow0, int64_t n0, int lane) {
    sm90_logprob_grad_epilogue(p, acc, buf, wrow0, n0, lane);
  }
};

}  // namespace lockstep::cuda::detail
