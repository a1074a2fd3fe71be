// The §G.4 segment fold (docs/contract.md), written once for every GEMM kernel: the S segment
// values s_0 .. s_{S-1} of an output are combined by the balanced tree ((s0 + s1) + (s2 + s3)) +
// ((s4 + s5) + (s6 + s7)) (S = 8; the left operand is always the earlier subtree), fp32 RNE.
// A kernel streams its segments in ascending order and calls fold_segment after each; the
// tree is kept as a stack of pending left subtrees, one per level, in binary-counter order: after
// segment sg, one completed left subtree is folded in per trailing 1 bit of sg (innermost first),
// and the result is parked at the level of sg's lowest 0 bit unless it is the root. The tree
// kernel over fp32 planes (tree_combine.cuh) runs the same fold over its S plane values.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

namespace lockstep::cuda::detail {

// acc = left + acc elementwise (one tree node, left = the earlier subtree), over an accumulator
// array of any rank, in row-major order.
__device__ __forceinline__ void tree_add(float& acc, const float& left) {
  acc = __fadd_rn(left, acc);
}
template <typename T, int N>
__device__ __forceinline__ void tree_add(T (&acc)[N], const T (&left)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) tree_add(acc[i], left[i]);
}
// a = +0 elementwise (a chain's start), over an array of any rank.
template <typename T>
__device__ __forceinline__ void zero_all(T& a) {
  a = T(0);
}
template <typename T, int N>
__device__ __forceinline__ void zero_all(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_all(a[i]);
}
// dst = src, and src = +0 when RESET (a chain that restarts from its register value).
template <bool RESET>
__device__ __forceinline__ void tree_park(float& dst, float& src) {
  dst = src;
  if constexpr (RESET) src = 0.0f;
}
template <bool RESET, typename T, int N>
__device__ __forceinline__ void tree_park(T (&dst)[N], T (&src)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) tree_park<RESET>(dst[i], src[i]);
}

// The fold after segment sg (of nseg) of one thread's accumulators acc (an array of any rank:
// float[R] for wgmma, float[MT][NT][4] for mma.sync), stack = the pending levels (S <= 2^LEVELS,
// LEVELS 1..3), a plain array the kernel declares. After the last segment acc holds the root, the
// tree value. MMA_SYNC selects how the stack is addressed, not the tree:
//   true  (mma.sync chains, which start from the register value): a parked accumulator is zeroed,
//         and the level is a run-time index, so that ptxas may keep the stack in local memory
//         where the accumulators fill the register file (the 128x128 tile);
//   false (wgmma chains, which start with scale-d = 0): no reset; levels by compile-time index
//         only, the stack stays in registers (wgmma accumulators must).
template <bool MMA_SYNC, int LEVELS, typename Acc, typename I>
__device__ __forceinline__ void fold_segment(Acc& acc, Acc (&stack)[LEVELS], I sg, int nseg) {
  static_assert(LEVELS >= 1 && LEVELS <= 3, "S <= 8");
  if constexpr (MMA_SYNC) {
    // [tiles][tiles][4] fragments, written out as three loops (the form ptxas schedules best).
    static_assert(std::rank_v<Acc> == 3, "mma.sync accumulators are [tiles][tiles][4]");
    constexpr int A = std::extent_v<Acc, 0>, B = std::extent_v<Acc, 1>, C = std::extent_v<Acc, 2>;
    int lvl = 0;
    for (; (sg >> lvl) & 1; ++lvl) {
#pragma unroll
      for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < B; ++j)
#pragma unroll
          for (int c = 0; c < C; ++c) acc[i][j][c] = __fadd_rn(stack[lvl][i][j][c], acc[i][j][c]);
    }
    if (sg + 1 < nseg) {
#pragma unroll
      for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < B; ++j)
#pragma unroll
          for (int c = 0; c < C; ++c) {
            stack[lvl][i][j][c] = acc[i][j][c];
            acc[i][j][c] = 0.0f;
          }
    }
  } else {
    if (sg & 1) {
      tree_add(acc, stack[0]);
      if constexpr (LEVELS >= 2) {
        if (sg & 2) {
          tree_add(acc, stack[1]);
          if constexpr (LEVELS >= 3) {
            if (sg & 4) tree_add(acc, stack[2]);
          }
        }
      }
    }
    if (sg + 1 < nseg) {
      const int lvl = (sg & 1) == 0 ? 0 : (sg & 2) == 0 ? 1 : 2;
      if (lvl == 0) {
        tree_park<false>(stack[0], acc);
      } else if constexpr (LEVELS >= 2) {
        if (lvl == 1) {
          tree_park<false>(stack[1], acc);
        } else if constexpr (LEVELS >= 3) {
          tree_park<false>(stack[2], acc);
        }
      }
    }
  }
}

// fold_segment<false, 2> (S <= 4) with the upper level in shared memory: top = this thread's
// first word, its R words STRIDE floats apart (a warpgroup's threads side by side: no bank
// conflict; only the thread that wrote a word reads it). The same adds in the same order.
template <int STRIDE, int R>
__device__ __forceinline__ void fold_segment_top_smem(float (&acc)[R], float (&low)[R], float* top,
                                                      int sg, int nseg) {
  if (sg & 1) {
    tree_add(acc, low);
    if (sg & 2) {
#pragma unroll
      for (int i = 0; i < R; ++i) acc[i] = __fadd_rn(top[i * STRIDE], acc[i]);
    }
  }
  if (sg + 1 < nseg) {
    if ((sg & 1) == 0) {
      tree_park<false>(low, acc);
    } else if ((sg & 2) == 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) top[i * STRIDE] = acc[i];
    }
  }
}

}  // namespace lockstep::cuda::detail
