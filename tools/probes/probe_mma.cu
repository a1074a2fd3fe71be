// H200 probe of the tensor-core bf16 MMA arithmetic (docs/probes.md, docs/contract.md §M).
// Runs mma.sync m16n8k16 and wgmma m64n8k16 / m64n16k16 / m64n32k16 / m64n48k16 / m64n64k16
// (operands from shared memory, or A from registers) chained over k-blocks on generated tiles
// (random data with wide exponent spreads, and edge cases: subnormals, zeros, cancellation,
// inf/NaN, overflow, near FLT_MAX), compares every GPU output bitwise with the CPU model
// (mma_chain_bf16) and writes inputs + GPU outputs as golden files (tests/golden/README.md).
//
// Usage: probe_mma OUTDIR [--instr 1..8] [--seed N] [--quick] [--fake]   (scripts/probe_mma.sh)
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "lockstep/dtype.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

using lockstep::bf16;

// ---------------------------------------------------------------------------------------------
// Instructions probed. The numeric code is stored in the golden file header.
enum Instr : uint32_t {
  kMmaSync = 1,    // mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, c from registers
  kWgmmaSS8 = 2,   // wgmma m64n8k16, A and B from shared memory (no-swizzle descriptors)
  kWgmmaRS8 = 3,   // wgmma m64n8k16, A from registers, B from shared memory
  kWgmmaSS64 = 4,  // wgmma m64n64k16, A and B from shared memory
  kWgmmaSS8Z = 5,  // as 2, but the first k-block uses scale-d = 0 (D = A*B, C ignored; C stored
                   // as +0 in the file)
  kWgmmaSS32 = 6,  // wgmma m64n32k16, A and B from shared memory (a small-M GEMM candidate form)
  kWgmmaSS16 = 7,  // wgmma m64n16k16, A and B from shared memory
  kWgmmaSS48 = 8,  // wgmma m64n48k16, A and B from shared memory
  kLastInstr = kWgmmaSS48,
};

// The N of an instruction's tile (M: 16 for mma.sync, 64 for wgmma).
uint32_t instr_n(uint32_t i) {
  return i == kWgmmaSS64   ? 64
         : i == kWgmmaSS48 ? 48
         : i == kWgmmaSS32 ? 32
         : i == kWgmmaSS16 ? 16
                           : 8;
}

const char* instr_name(uint32_t i) {
  switch (i) {
    case kMmaSync:
      return "mma.sync.m16n8k16";
    case kWgmmaSS8:
      return "wgmma.m64n8k16.SS";
    case kWgmmaRS8:
      return "wgmma.m64n8k16.RS";
    case kWgmmaSS64:
      return "wgmma.m64n64k16.SS";
    case kWgmmaSS8Z:
      return "wgmma.m64n8k16.SS.d0";
    case kWgmmaSS32:
      return "wgmma.m64n32k16.SS";
    case kWgmmaSS16:
      return "wgmma.m64n16k16.SS";
    case kWgmmaSS48:
      return "wgmma.m64n48k16.SS";
  }
  return "?";
}

// A set of tiles of one shape: D[M,N] = chain over K of A[M,K] * B[K,N] + C[M,N].
struct TileSet {
  uint32_t instr = 0, M = 0, N = 0, K = 0, ntiles = 0;
  std::string category;
  std::vector<uint16_t> A;   // [tiles, M, K]   bf16 bits, row-major
  std::vector<uint16_t> Bt;  // [tiles, N, K]   bf16 bits, column n of B contiguous in k
  std::vector<uint32_t> C;   // [tiles, M, N]   fp32 bits
  std::vector<uint32_t> D;   // [tiles, M, N]   fp32 bits, GPU result
  void alloc() {
    A.assign(size_t(ntiles) * M * K, 0);
    Bt.assign(size_t(ntiles) * N * K, 0);
    C.assign(size_t(ntiles) * M * N, 0);
    D.assign(size_t(ntiles) * M * N, 0xA5A5A5A5u);
  }
};

// ---------------------------------------------------------------------------------------------
// Device side.

__device__ __forceinline__ uint32_t ld_pair(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);  // p even-aligned: element p[0] in the low half
}

// One warp per tile; chains K/16 mma.sync k-blocks with the accumulator kept in registers.
__global__ void k_mma_sync(const uint16_t* A, const uint16_t* Bt, const float* C, float* D, int K) {
  const int tile = blockIdx.x, lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const uint16_t* a = A + size_t(tile) * 16 * K;
  const uint16_t* b = Bt + size_t(tile) * 8 * K;
  const float* c = C + size_t(tile) * 128;
  float d0 = c[g * 8 + 2 * t], d1 = c[g * 8 + 2 * t + 1];
  float d2 = c[(g + 8) * 8 + 2 * t], d3 = c[(g + 8) * 8 + 2 * t + 1];
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a0 = ld_pair(a + g * K + k0 + 2 * t);
    uint32_t a1 = ld_pair(a + (g + 8) * K + k0 + 2 * t);
    uint32_t a2 = ld_pair(a + g * K + k0 + 2 * t + 8);
    uint32_t a3 = ld_pair(a + (g + 8) * K + k0 + 2 * t + 8);
    uint32_t b0 = ld_pair(b + g * K + k0 + 2 * t);
    uint32_t b1 = ld_pair(b + g * K + k0 + 2 * t + 8);
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float* d = D + size_t(tile) * 128;
  d[g * 8 + 2 * t] = d0;
  d[g * 8 + 2 * t + 1] = d1;
  d[(g + 8) * 8 + 2 * t] = d2;
  d[(g + 8) * 8 + 2 * t + 1] = d3;
}

// wgmma shared-memory matrix descriptor, no swizzle ("interleave"): operands are stored as 8x8
// core matrices (8 rows of 16 contiguous bytes = 128 contiguous bytes). lbo = byte distance
// between core matrices adjacent in K, sbo = adjacent in M/N (PTX ISA, "Matrix Descriptor").
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((sbo & 0x3FFFF) >> 4) << 32;
  return d;  // base offset 0, swizzle mode 0
}

// Byte offset of element (row r, k) inside one k-block's operand of R rows x 16 k: core matrix
// (r/8, k/8) at ((r/8)*2 + k/8)*128, so K-adjacent cores are 128 B apart, M/N-adjacent 256 B.
__device__ __forceinline__ uint32_t core_off(int r, int k) {
  return uint32_t(((r >> 3) * 2 + (k >> 3)) * 128 + (r & 7) * 16 + (k & 7) * 2);
}

__device__ __forceinline__ void wg_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ void wgmma_ss_n8(float (&d)[4], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_n8(float (&d)[4], const uint32_t (&a)[4], uint64_t db,
                                            int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, "
      "1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db,
                                             int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], uint64_t da, uint64_t db,
                                             int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
      "0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss_n16(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss_n48(float (&d)[24], uint64_t da, uint64_t db,
                                             int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23}, %24, %25, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(da), "l"(db), "r"(scale_d));
}

constexpr int kMaxK = 64;  // k per tile in the wgmma kernels (4 k-blocks)

// One warpgroup (128 threads) per tile of M=64 rows, N columns. mode: 0 = SS, 1 = RS.
// swap_lbo: use the other reading of the descriptor's LBO/SBO fields (probed with exact data).
// zero_first: first k-block with scale-d = 0.
// Everything that selects instructions is a template parameter, so the wgmma chain has no
// divergent path and ptxas issues the k-blocks back to back (as a real kernel does).
template <int N, int NKB, int MODE, int ZERO_FIRST>
__global__ void __launch_bounds__(128)
    k_wgmma(const uint16_t* A, const uint16_t* Bt, const float* C, float* D, int swap_lbo) {
  constexpr int M = 64, K = NKB * 16, mode = MODE, zero_first = ZERO_FIRST, nkb = NKB;
  constexpr int kABytes = M * 16 * 2, kBBytes = N * 16 * 2;  // one k-block
  __shared__ __align__(1024) uint8_t sa[kMaxK / 16 * kABytes];
  __shared__ __align__(1024) uint8_t sb[kMaxK / 16 * kBBytes];
  const int tile = blockIdx.x, tid = threadIdx.x;
  const uint16_t* a = A + size_t(tile) * M * K;
  const uint16_t* b = Bt + size_t(tile) * N * K;
  for (int i = tid; i < M * K; i += 128) {
    int r = i / K, k = i % K;
    *reinterpret_cast<uint16_t*>(sa + (k / 16) * kABytes + core_off(r, k % 16)) = a[i];
  }
  for (int i = tid; i < N * K; i += 128) {
    int r = i / K, k = i % K;
    *reinterpret_cast<uint16_t*>(sb + (k / 16) * kBBytes + core_off(r, k % 16)) = b[i];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  constexpr int NR = N / 2;  // accumulator registers per thread
  float d[NR];
  const float* c = C + size_t(tile) * M * N;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    d[4 * j + 0] = c[(16 * w + g) * N + 8 * j + 2 * t];
    d[4 * j + 1] = c[(16 * w + g) * N + 8 * j + 2 * t + 1];
    d[4 * j + 2] = c[(16 * w + g + 8) * N + 8 * j + 2 * t];
    d[4 * j + 3] = c[(16 * w + g + 8) * N + 8 * j + 2 * t + 1];
  }
  // A fragments for the RS form (same per-warp layout as mma.sync's A, warp w owns rows 16w..).
  uint32_t af[kMaxK / 16][4] = {};
  if constexpr (mode == 1) {
#pragma unroll
    for (int kb = 0; kb < kMaxK / 16; ++kb) {
      if (kb < nkb) {
        const uint16_t* ar = a + kb * 16;
        af[kb][0] = ld_pair(ar + (16 * w + g) * K + 2 * t);
        af[kb][1] = ld_pair(ar + (16 * w + g + 8) * K + 2 * t);
        af[kb][2] = ld_pair(ar + (16 * w + g) * K + 2 * t + 8);
        af[kb][3] = ld_pair(ar + (16 * w + g + 8) * K + 2 * t + 8);
      }
    }
  }
  const uint32_t base_a = uint32_t(__cvta_generic_to_shared(sa));
  const uint32_t base_b = uint32_t(__cvta_generic_to_shared(sb));
  const uint32_t lbo = swap_lbo ? 256 : 128, sbo = swap_lbo ? 128 : 256;
#pragma unroll
  for (int i = 0; i < NR; ++i) wg_fence_operand(d[i]);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kb = 0; kb < kMaxK / 16; ++kb) {
    if (kb < nkb) {
      uint64_t da = make_desc(base_a + kb * kABytes, lbo, sbo);
      uint64_t db = make_desc(base_b + kb * kBBytes, lbo, sbo);
      int scale_d = (zero_first && kb == 0) ? 0 : 1;
      if constexpr (N == 8) {
        if constexpr (mode == 1)
          wgmma_rs_n8(d, af[kb], db, scale_d);
        else
          wgmma_ss_n8(d, da, db, scale_d);
      } else if constexpr (N == 16) {
        wgmma_ss_n16(d, da, db, scale_d);
      } else if constexpr (N == 32) {
        wgmma_ss_n32(d, da, db, scale_d);
      } else if constexpr (N == 48) {
        wgmma_ss_n48(d, da, db, scale_d);
      } else {
        static_assert(N == 64, "wgmma N");
        wgmma_ss_n64(d, da, db, scale_d);
      }
    }
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < NR; ++i) wg_fence_operand(d[i]);
  float* o = D + size_t(tile) * M * N;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    o[(16 * w + g) * N + 8 * j + 2 * t] = d[4 * j + 0];
    o[(16 * w + g) * N + 8 * j + 2 * t + 1] = d[4 * j + 1];
    o[(16 * w + g + 8) * N + 8 * j + 2 * t] = d[4 * j + 2];
    o[(16 * w + g + 8) * N + 8 * j + 2 * t + 1] = d[4 * j + 3];
  }
}

template <int N, int MODE, int Z>
void launch_wgmma_k(uint32_t nkb, uint32_t tiles, const uint16_t* A, const uint16_t* B,
                    const float* C, float* D, int swap_lbo) {
  switch (nkb) {
    case 1:
      k_wgmma<N, 1, MODE, Z><<<tiles, 128>>>(A, B, C, D, swap_lbo);
      break;
    case 2:
      k_wgmma<N, 2, MODE, Z><<<tiles, 128>>>(A, B, C, D, swap_lbo);
      break;
    case 4:
      k_wgmma<N, 4, MODE, Z><<<tiles, 128>>>(A, B, C, D, swap_lbo);
      break;
    default:
      std::fprintf(stderr, "unsupported k-block count %u\n", nkb);
      std::exit(2);
  }
}

void launch_wgmma(uint32_t instr, uint32_t nkb, uint32_t tiles, const uint16_t* A,
                  const uint16_t* B, const float* C, float* D, int swap_lbo) {
  switch (instr) {
    case kWgmmaSS8:
      launch_wgmma_k<8, 0, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaRS8:
      launch_wgmma_k<8, 1, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaSS64:
      launch_wgmma_k<64, 0, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaSS8Z:
      launch_wgmma_k<8, 0, 1>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaSS32:
      launch_wgmma_k<32, 0, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaSS16:
      launch_wgmma_k<16, 0, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
    case kWgmmaSS48:
      launch_wgmma_k<48, 0, 0>(nkb, tiles, A, B, C, D, swap_lbo);
      break;
  }
}

uint32_t model(const TileSet& ts, uint32_t t, uint32_t m, uint32_t n);
bool g_fake = false;  // --fake: D from the CPU model instead of the GPU (tests this program)

// Runs the tile set's instruction on the GPU and fills ts.D.
void run_gpu(TileSet& ts, int swap_lbo) {
  if (g_fake) {
    for (uint32_t t = 0; t < ts.ntiles; ++t)
      for (uint32_t m = 0; m < ts.M; ++m)
        for (uint32_t n = 0; n < ts.N; ++n)
          ts.D[(size_t(t) * ts.M + m) * ts.N + n] = model(ts, t, m, n);
    return;
  }
  uint16_t *dA, *dB;
  float *dC, *dD;
  CK(cudaMalloc(&dA, ts.A.size() * 2));
  CK(cudaMalloc(&dB, ts.Bt.size() * 2));
  CK(cudaMalloc(&dC, ts.C.size() * 4));
  CK(cudaMalloc(&dD, ts.D.size() * 4));
  CK(cudaMemcpy(dA, ts.A.data(), ts.A.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dB, ts.Bt.data(), ts.Bt.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dC, ts.C.data(), ts.C.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dD, 0xA5, ts.D.size() * 4));
  if (ts.instr == kMmaSync) {
    k_mma_sync<<<ts.ntiles, 32>>>(dA, dB, dC, dD, int(ts.K));
  } else {
    launch_wgmma(ts.instr, ts.K / 16, ts.ntiles, dA, dB, dC, dD, swap_lbo);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(ts.D.data(), dD, ts.D.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(dA));
  CK(cudaFree(dB));
  CK(cudaFree(dC));
  CK(cudaFree(dD));
}

// ---------------------------------------------------------------------------------------------
// Host side: generators.

struct Gen {
  std::mt19937_64 g;
  explicit Gen(uint64_t seed) : g(seed) {}
  uint32_t u32() { return uint32_t(g()); }
  double uni() { return double(g() >> 11) * 0x1.0p-53; }
  int irange(int lo, int hi) { return lo + int(g() % uint64_t(hi - lo + 1)); }  // [lo, hi]
  bool coin(double p) { return uni() < p; }
  uint16_t sgn() { return coin(0.5) ? 0x8000 : 0; }
  // Normal bf16 with unbiased exponent in [elo, ehi] (clamped to the normal range).
  uint16_t bf_normal(int elo, int ehi) {
    int e = irange(elo, ehi);
    if (e < -126) e = -126;
    if (e > 127) e = 127;
    return uint16_t(sgn() | uint16_t(e + 127) << 7 | (u32() & 0x7f));
  }
  uint16_t bf_sub() { return uint16_t(sgn() | (1 + u32() % 127)); }
  uint16_t bf_gauss(float s) {
    std::normal_distribution<float> d(0.0f, s);
    bf16 v = lockstep::f32_to_bf16(d(g));
    if ((v.bits & 0x7fff) == 0) v.bits = 0x3c00;
    return v.bits;
  }
  uint16_t bf_nan() {
    static const uint16_t p[] = {0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff, 0x7fa5};
    return p[u32() % 6];
  }
  uint32_t f_normal(int elo, int ehi) {
    int e = irange(elo, ehi);
    if (e < -126) e = -126;
    if (e > 127) e = 127;
    return (uint32_t(sgn()) << 16) | uint32_t(e + 127) << 23 | (u32() & 0x7fffff);
  }
  uint32_t f_sub() { return (uint32_t(sgn()) << 16) | (1 + u32() % 0x7fffff); }
  uint32_t f_gauss(float s) {
    std::normal_distribution<float> d(0.0f, s);
    return lockstep::f32_bits(d(g));
  }
  uint32_t f_nan() {
    static const uint32_t p[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fc12345u, 0xffffffffu};
    return p[u32() % 5];
  }
};

// A category: how to fill one tile. elem(role 0 = A / 1 = B, tile mode) gives one bf16; cval one
// fp32; post may impose structure over the whole tile.
struct Category {
  std::string name;
  int K;
  bool random;  // random category: counted fully, only a prefix (and mismatches) saved
  int modes;    // tiles cycle through modes 0..modes-1
  std::function<uint16_t(Gen&, int role, int mode)> elem;
  std::function<uint32_t(Gen&, int mode)> cval;
  std::function<void(TileSet&, uint32_t tile, Gen&, int mode)> post;
};

std::vector<Category> categories() {
  std::vector<Category> cs;
  // (a) random data: the model's normal regime, with wide exponent spreads.
  cs.push_back({"rand_normal", 64, true, 1, [](Gen& g, int, int) { return g.bf_gauss(1.0f); },
                [](Gen& g, int) { return g.f_gauss(1.0f); }, nullptr});
  cs.push_back({"rand_spread", 64, true, 1, [](Gen& g, int, int) { return g.bf_normal(-15, 15); },
                [](Gen& g, int) { return g.coin(0.25) ? 0u : g.f_normal(-30, 30); }, nullptr});
  cs.push_back({"rand_bigc", 32, true, 1, [](Gen& g, int, int) { return g.bf_normal(-4, 4); },
                [](Gen& g, int) { return g.f_normal(8, 40); }, nullptr});
  cs.push_back({"rand_smallc", 32, true, 1, [](Gen& g, int, int) { return g.bf_normal(-4, 4); },
                [](Gen& g, int) { return g.f_normal(-40, -8); }, nullptr});
  // Terms of nearly one magnitude and random signs: heavy cancellation, so the bits below the
  // truncation point decide the low bits of the result.
  cs.push_back({"rand_close", 32, true, 1, [](Gen& g, int, int) { return g.bf_normal(0, 1); },
                [](Gen& g, int) { return g.f_normal(0, 6); }, nullptr});
  cs.push_back({"rand_sparse", 64, true, 1,
                [](Gen& g, int role, int) {
                  return (role == 0 && g.coin(0.5)) ? uint16_t(g.sgn()) : g.bf_normal(-20, 20);
                },
                [](Gen& g, int) { return g.coin(0.2) ? 0u : g.f_normal(-40, 40); }, nullptr});

  // (b) edge cases.
  // Subnormal bf16 inputs. mode 0: subnormal a x wide b; 1: subnormal x subnormal/tiny (products
  // far below fp32's range); 2: subnormal a x huge b (products of ordinary size) with c of that
  // size.
  cs.push_back({"sub_in", 16, false, 3,
                [](Gen& g, int role, int mode) -> uint16_t {
                  if (mode == 0)
                    return g.coin(0.5) ? g.bf_sub()
                                       : g.bf_normal(role ? -20 : -126, role ? 127 : -110);
                  if (mode == 1) return g.coin(0.6) ? g.bf_sub() : g.bf_normal(-126, -115);
                  if (role == 0) return g.coin(0.7) ? g.bf_sub() : g.bf_normal(-126, -120);
                  return g.bf_normal(100, 127);
                },
                [](Gen& g, int mode) -> uint32_t {
                  int r = g.irange(0, 3);
                  if (r == 0) return g.coin(0.5) ? 0u : 0x80000000u;
                  if (r == 1) return g.f_sub();
                  return mode == 2 ? g.f_normal(-30, 0) : g.f_normal(-126, -100);
                },
                nullptr});
  // Products that are subnormal (or below) in fp32; c zero, subnormal or tiny.
  cs.push_back({"sub_out", 16, false, 2,
                [](Gen& g, int, int mode) -> uint16_t {
                  if (g.coin(0.15)) return uint16_t(g.sgn());
                  return mode == 0 ? g.bf_normal(-75, -55) : g.bf_normal(-80, -70);
                },
                [](Gen& g, int) -> uint32_t {
                  int r = g.irange(0, 3);
                  if (r == 0) return g.coin(0.5) ? 0u : 0x80000000u;
                  if (r == 1) return g.f_sub();
                  return g.f_normal(-126, -118);
                },
                nullptr});
  // Subnormal c. mode 0: all products zero (result = c?); 1: tiny products; 2: products ~1.
  cs.push_back({"sub_c", 16, false, 3,
                [](Gen& g, int role, int mode) -> uint16_t {
                  if (mode == 0) return role == 0 ? uint16_t(g.sgn()) : g.bf_normal(-5, 5);
                  if (mode == 1) return g.coin(0.3) ? uint16_t(g.sgn()) : g.bf_normal(-75, -60);
                  return g.bf_normal(-3, 3);
                },
                [](Gen& g, int) { return g.f_sub(); }, nullptr});
  // Signed zeros: most inputs +-0, c +-0; sign of an exact-zero result.
  cs.push_back({"zeros", 32, false, 2,
                [](Gen& g, int, int mode) -> uint16_t {
                  if (g.coin(mode == 0 ? 0.97 : 0.85)) return uint16_t(g.sgn());
                  return g.bf_normal(-2, 2);
                },
                [](Gen& g, int) -> uint32_t {
                  if (g.coin(0.9)) return g.coin(0.5) ? 0u : 0x80000000u;
                  return g.f_normal(-3, 3);
                },
                nullptr});
  // Exact cancellation: B columns hold b, -b pairs and A rows a, a pairs, so every output's
  // products cancel pairwise (mode 0: all pairs; mode 1: the first half of the k-block).
  cs.push_back({"cancel", 32, false, 2, [](Gen& g, int, int) { return g.bf_normal(-10, 10); },
                [](Gen& g, int) -> uint32_t {
                  int r = g.irange(0, 3);
                  if (r == 0) return 0u;
                  if (r == 1) return 0x80000000u;
                  return g.f_normal(-30, 12);
                },
                [](TileSet& ts, uint32_t tile, Gen&, int mode) {
                  for (uint32_t r = 0; r < ts.M; ++r)
                    for (uint32_t k = 0; k + 1 < ts.K; k += 2) {
                      if (mode == 1 && (k % 16) >= 8) continue;
                      uint16_t* a = &ts.A[(size_t(tile) * ts.M + r) * ts.K];
                      a[k + 1] = a[k];
                    }
                  for (uint32_t n = 0; n < ts.N; ++n)
                    for (uint32_t k = 0; k + 1 < ts.K; k += 2) {
                      if (mode == 1 && (k % 16) >= 8) continue;
                      uint16_t* b = &ts.Bt[(size_t(tile) * ts.N + n) * ts.K];
                      b[k + 1] = b[k] ^ 0x8000;
                    }
                }});
  // inf and NaN (several payloads, signalling ones too) at rates 1%, 3%, 10% per element.
  cs.push_back({"infnan", 16, false, 3,
                [](Gen& g, int, int mode) -> uint16_t {
                  double rate = mode == 0 ? 0.01 : mode == 1 ? 0.03 : 0.10;
                  double u = g.uni();
                  if (u < rate) return 0x7f80;
                  if (u < 2 * rate) return 0xff80;
                  if (u < 3 * rate) return g.bf_nan();
                  if (u < 4 * rate) return uint16_t(g.sgn());
                  return g.bf_normal(-5, 5);
                },
                [](Gen& g, int) -> uint32_t {
                  int r = g.irange(0, 9);
                  if (r == 0) return 0x7f800000u;
                  if (r == 1) return 0xff800000u;
                  if (r == 2) return g.f_nan();
                  return g.f_normal(-5, 5);
                },
                nullptr});
  // Finite inputs whose products or sums overflow fp32. mode 0: random signs; 1: all positive;
  // 2: products individually beyond FLT_MAX (2^129..) cancelling in sign.
  cs.push_back({"overflow", 16, false, 3,
                [](Gen& g, int role, int mode) -> uint16_t {
                  uint16_t v = mode == 2 ? g.bf_normal(62, 66) : g.bf_normal(56, 64);
                  if (mode == 1) v &= 0x7fff;
                  if (mode == 2 && role == 0) v &= 0x7fff;
                  return v;
                },
                [](Gen& g, int mode) -> uint32_t {
                  int r = g.irange(0, 3);
                  uint32_t v = r == 0 ? 0x7f7fffffu : r == 1 ? 0u : g.f_normal(100, 127);
                  if (g.coin(0.5)) v |= 0x80000000u;
                  if (mode == 1) v &= 0x7fffffffu;
                  return v;
                },
                nullptr});
  // c at or near +-FLT_MAX with products around its ulp (2^104): does a sum past FLT_MAX give
  // inf or FLT_MAX (round toward zero)?
  cs.push_back({"nearmax", 16, false, 2,
                [](Gen& g, int, int mode) -> uint16_t {
                  if (g.coin(0.3)) return uint16_t(g.sgn());
                  return mode == 0 ? g.bf_normal(48, 54) : g.bf_normal(56, 63);
                },
                [](Gen& g, int) -> uint32_t {
                  uint32_t v = 0x7f7fffffu - (g.coin(0.5) ? 0u : g.u32() % 64);
                  return g.coin(0.5) ? v | 0x80000000u : v;
                },
                nullptr});
  // Few terms: A rows with one or two nonzero elements (wide exponent range, subnormals too), so
  // each output is c plus one or two products; c from subnormal to large.
  cs.push_back({"few_terms", 16, false, 1,
                [](Gen& g, int role, int) -> uint16_t {
                  if (role == 1) return g.bf_normal(-70, 70);
                  if (!g.coin(2.0 / 16)) return uint16_t(g.sgn());
                  return g.coin(0.1) ? g.bf_sub() : g.bf_normal(-126, 60);
                },
                [](Gen& g, int) -> uint32_t {
                  double u = g.uni();
                  if (u < 0.1) return g.coin(0.5) ? 0u : 0x80000000u;
                  if (u < 0.2) return g.f_sub();
                  return g.f_normal(-126, 127);
                },
                nullptr});
  // Products around the truncation-unit floor (E near -133, unit 2^-158) and around fp32's
  // smallest normal 2^-126; c zero, subnormal or tiny. (Added after the first H200 run showed
  // the floor; the second run checks it on fresh data.)
  cs.push_back({"tiny_floor", 16, false, 3,
                [](Gen& g, int, int mode) -> uint16_t {
                  if (g.coin(0.2)) return uint16_t(g.sgn());
                  if (mode == 0) return g.bf_normal(-72, -60);
                  if (mode == 1) return g.bf_normal(-66, -62);
                  return g.bf_normal(-70, -66);
                },
                [](Gen& g, int) -> uint32_t {
                  double u = g.uni();
                  if (u < 0.4) return g.coin(0.5) ? 0u : 0x80000000u;
                  if (u < 0.7) return g.f_sub();
                  return g.f_normal(-126, -120);
                },
                nullptr});
  // Aimed at the unit floor 2^-158: k < 8 give products with exponent -135/-134 whose sum
  // lies on fp32's subnormal grid (last bit 2^-149) and E - 25 < -158; k >= 8 give products of
  // the opposite sign around 2^-162..2^-156. Whether those tip the result below the grid point
  // depends on where the truncation unit stops (2^-158, not 2^(E-25)).
  cs.push_back({"unit_floor", 16, false, 4, [](Gen& g, int, int) { return g.bf_normal(-70, -60); },
                [](Gen& g, int) -> uint32_t { return g.coin(0.5) ? 0u : 0x80000000u; },
                [](TileSet& ts, uint32_t tile, Gen& g, int mode) {
                  // modes 0/1: small products in [2^-162, 2^-158); 2/3: in [2^-158, 2^-157)
                  // (b an exact power of two).
                  const uint16_t big_sign = (mode & 1) ? 0x8000 : 0;
                  const int alo = mode < 2 ? -82 : -79, blo = mode < 2 ? -80 : -79;
                  for (uint32_t r = 0; r < ts.M; ++r)
                    for (uint32_t k = 0; k < ts.K; ++k) {
                      uint16_t& a = ts.A[(size_t(tile) * ts.M + r) * ts.K + k];
                      bool big = (k % 16) < 8;
                      a = big ? g.bf_normal(-68, -67) : g.bf_normal(alo, mode < 2 ? alo + 1 : alo);
                      a = uint16_t((a & 0x7fff) | (big ? big_sign : big_sign ^ 0x8000));
                    }
                  for (uint32_t n = 0; n < ts.N; ++n)
                    for (uint32_t k = 0; k < ts.K; ++k) {
                      uint16_t& b = ts.Bt[(size_t(tile) * ts.N + n) * ts.K + k];
                      bool big = (k % 16) < 8;
                      b = uint16_t((big ? g.bf_normal(-67, -67) : g.bf_normal(blo, blo + 1)) &
                                   0x7fff);
                      if (!big && mode >= 2) b = uint16_t((blo + 127) << 7);
                    }
                }});
  // Everything at once, chained over two k-blocks.
  cs.push_back({"mixed", 32, false, 1,
                [](Gen& g, int, int) -> uint16_t {
                  double u = g.uni();
                  if (u < 0.01) return 0x7f80 | g.sgn();
                  if (u < 0.015) return g.bf_nan();
                  if (u < 0.10) return uint16_t(g.sgn());
                  if (u < 0.25) return g.bf_sub();
                  if (u < 0.35) return g.bf_normal(50, 64);
                  if (u < 0.45) return g.bf_normal(-126, -60);
                  return g.bf_normal(-20, 20);
                },
                [](Gen& g, int) -> uint32_t {
                  double u = g.uni();
                  if (u < 0.02) return 0x7f800000u | (uint32_t(g.sgn()) << 16);
                  if (u < 0.03) return g.f_nan();
                  if (u < 0.15) return g.coin(0.5) ? 0u : 0x80000000u;
                  if (u < 0.30) return g.f_sub();
                  if (u < 0.40) return g.f_normal(100, 127);
                  return g.f_normal(-40, 40);
                },
                nullptr});
  return cs;
}

void fill(TileSet& ts, const Category& cat, uint64_t seed) {
  Gen g(seed);
  ts.alloc();
  for (uint32_t t = 0; t < ts.ntiles; ++t) {
    int mode = int(t % uint32_t(cat.modes));
    for (size_t i = 0; i < size_t(ts.M) * ts.K; ++i)
      ts.A[size_t(t) * ts.M * ts.K + i] = cat.elem(g, 0, mode);
    for (size_t i = 0; i < size_t(ts.N) * ts.K; ++i)
      ts.Bt[size_t(t) * ts.N * ts.K + i] = cat.elem(g, 1, mode);
    for (size_t i = 0; i < size_t(ts.M) * ts.N; ++i)
      ts.C[size_t(t) * ts.M * ts.N + i] = ts.instr == kWgmmaSS8Z ? 0u : cat.cval(g, mode);
    if (cat.post) cat.post(ts, t, g, mode);
  }
}

// Model output for element (tile, m, n).
uint32_t model(const TileSet& ts, uint32_t t, uint32_t m, uint32_t n) {
  const bf16* a = reinterpret_cast<const bf16*>(&ts.A[(size_t(t) * ts.M + m) * ts.K]);
  const bf16* b = reinterpret_cast<const bf16*>(&ts.Bt[(size_t(t) * ts.N + n) * ts.K]);
  float c = lockstep::f32_from_bits(ts.C[(size_t(t) * ts.M + m) * ts.N + n]);
  return lockstep::f32_bits(lockstep::mma_chain_bf16(a, b, ts.K, c));
}

// Appends one section (header + tiles [list] of ts) to a golden-format file
// (tests/golden/README.md).
void write_section(FILE* f, const TileSet& ts, const std::vector<uint32_t>& list) {
  char magic[8] = {'L', 'S', 'M', 'M', 'A', 'G', 'D', '1'};
  uint32_t hdr[6] = {ts.instr, ts.M, ts.N, ts.K, uint32_t(list.size()), 0};
  char name[32] = {};
  std::snprintf(name, sizeof name, "%s", ts.category.c_str());
  std::fwrite(magic, 1, 8, f);
  std::fwrite(hdr, 4, 6, f);
  std::fwrite(name, 1, 32, f);
  for (uint32_t t : list) {
    std::fwrite(&ts.A[size_t(t) * ts.M * ts.K], 2, size_t(ts.M) * ts.K, f);
    std::fwrite(&ts.Bt[size_t(t) * ts.N * ts.K], 2, size_t(ts.N) * ts.K, f);
    std::fwrite(&ts.C[size_t(t) * ts.M * ts.N], 4, size_t(ts.M) * ts.N, f);
    std::fwrite(&ts.D[size_t(t) * ts.M * ts.N], 4, size_t(ts.M) * ts.N, f);
  }
}

FILE* open_out(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  return f;
}

// File name of an instruction's data: "mma_sync_m16n8k16", "wgmma_m64n8k16_ss", ...
std::string file_stem(uint32_t instr) {
  std::string s = instr_name(instr);
  for (auto& ch : s) ch = ch == '.' ? '_' : char(std::tolower(ch));
  return s;
}

struct Result {
  uint64_t outputs = 0, mismatches = 0;
};

// Compares GPU with model; returns counts, fills mism with mismatching tiles; prints up to `show`
// mismatches.
Result check(const TileSet& ts, std::vector<uint32_t>& mism, int show) {
  Result r;
  for (uint32_t t = 0; t < ts.ntiles; ++t) {
    bool bad = false;
    for (uint32_t m = 0; m < ts.M; ++m)
      for (uint32_t n = 0; n < ts.N; ++n) {
        uint32_t want = model(ts, t, m, n), got = ts.D[(size_t(t) * ts.M + m) * ts.N + n];
        ++r.outputs;
        if (want != got) {
          ++r.mismatches;
          bad = true;
          if (show > 0) {
            --show;
            std::printf(
                "    mismatch %s/%s tile %u (%u,%u): gpu 0x%08x (%g) model 0x%08x (%g) c 0x%08x\n",
                instr_name(ts.instr), ts.category.c_str(), t, m, n, got,
                double(lockstep::f32_from_bits(got)), want, double(lockstep::f32_from_bits(want)),
                ts.C[(size_t(t) * ts.M + m) * ts.N + n]);
          }
        }
      }
    if (bad) mism.push_back(t);
  }
  return r;
}

// Exact small-integer data: the sum is exact in fp32, so any descriptor or fragment-layout error
// shows as a wrong value. Returns the number of wrong outputs.
uint64_t layout_check(uint32_t instr, int swap_lbo) {
  TileSet ts;
  ts.instr = instr;
  ts.M = instr == kMmaSync ? 16 : 64;
  ts.N = instr_n(instr);
  ts.K = 64;
  ts.ntiles = 8;
  ts.category = "layout";
  ts.alloc();
  Gen g(7);
  for (auto& v : ts.A) v = lockstep::f32_to_bf16(float(g.irange(-8, 8))).bits;
  for (auto& v : ts.Bt) v = lockstep::f32_to_bf16(float(g.irange(-8, 8))).bits;
  for (auto& v : ts.C) v = lockstep::f32_bits(float(g.irange(-100, 100)));
  run_gpu(ts, swap_lbo);
  uint64_t bad = 0;
  for (uint32_t t = 0; t < ts.ntiles; ++t)
    for (uint32_t m = 0; m < ts.M; ++m)
      for (uint32_t n = 0; n < ts.N; ++n) {
        double s = lockstep::f32_from_bits(ts.C[(size_t(t) * ts.M + m) * ts.N + n]);
        for (uint32_t k = 0; k < ts.K; ++k)
          s += double(lockstep::bf16_to_f32(bf16{ts.A[(size_t(t) * ts.M + m) * ts.K + k]})) *
               double(lockstep::bf16_to_f32(bf16{ts.Bt[(size_t(t) * ts.N + n) * ts.K + k]}));
        if (float(s) != lockstep::f32_from_bits(ts.D[(size_t(t) * ts.M + m) * ts.N + n])) ++bad;
      }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s OUTDIR [--instr 1..8|0=all] [--swap 0|1] [--seed N] [--layout-only] "
                 "[--quick] [--fake]\n",
                 argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  bool quick = false, layout_only = false;
  uint32_t only = 0;  // 0: every instruction
  int swap = 0;
  uint64_t seed = 0;  // varies all generated data
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    quick |= a == "--quick";
    g_fake |= a == "--fake";
    layout_only |= a == "--layout-only";
    if (a == "--instr" && i + 1 < argc) only = uint32_t(std::atoi(argv[++i]));
    if (a == "--swap" && i + 1 < argc) swap = std::atoi(argv[++i]);
    if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 0);
  }
  if (g_fake) {
    std::printf("probe_mma: --fake: outputs come from the CPU model, not a GPU\n");
  } else {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("probe_mma: device %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
  }

  // Layout / descriptor self-check with exact data (one process per instruction and descriptor
  // reading, so a wrong descriptor that faults cannot take the other runs down with it).
  bool layout_ok = true;
  for (uint32_t i = kMmaSync; i <= kLastInstr; ++i) {
    if (only != 0 && i != only) continue;
    uint64_t bad = layout_check(i == kWgmmaSS8Z ? kWgmmaSS8 : i, swap);
    std::printf("layout check %-22s swap=%d (lbo = %s): %llu wrong outputs of exact data\n",
                instr_name(i), swap, swap ? "M/N-direction stride" : "K-direction stride",
                (unsigned long long)bad);
    layout_ok &= bad == 0;
  }
  std::fflush(stdout);
  if (!layout_ok) return 3;
  if (layout_only) return 0;

  struct Plan {
    uint32_t instr;
    int rand_outputs;  // outputs per random category
    int edge_outputs;  // outputs per edge category
    int save_rand;     // random tiles saved (prefix)
  };
  const int q = quick ? 16 : 1;
  std::vector<Plan> plans = {
      {kMmaSync, 349526 / q, 32768 / q, 128}, {kWgmmaSS8, 349526 / q, 32768 / q, 32},
      {kWgmmaRS8, 131072 / q, 16384 / q, 16}, {kWgmmaSS64, 131072 / q, 16384 / q, 4},
      {kWgmmaSS8Z, 65536 / q, 16384 / q, 16}, {kWgmmaSS32, 131072 / q, 16384 / q, 4},
      {kWgmmaSS16, 131072 / q, 16384 / q, 8}, {kWgmmaSS48, 131072 / q, 16384 / q, 4}};
  std::printf("\n%-22s %-12s %4s %10s %10s\n", "instruction", "category", "K", "outputs",
              "mismatch");
  uint64_t total_bad = 0;
  for (const Plan& p : plans) {
    if (only != 0 && p.instr != only) continue;
    FILE* fall = open_out(out + "/" + file_stem(p.instr) + ".bin");
    FILE* fmism = nullptr;  // random-data tiles with mismatches, if any
    uint64_t ci = 0;
    for (const Category& cat : categories()) {
      ++ci;
      TileSet ts;
      ts.instr = p.instr;
      ts.M = p.instr == kMmaSync ? 16 : 64;
      ts.N = instr_n(p.instr);
      ts.K = uint32_t(cat.K);
      ts.category = cat.name;
      int outs = cat.random ? p.rand_outputs : p.edge_outputs;
      ts.ntiles = uint32_t((outs + ts.M * ts.N - 1) / (ts.M * ts.N));
      fill(ts, cat, 0x5eed0000ull + ci * 1000 + p.instr + seed * 0x9E3779B97F4A7C15ull);
      run_gpu(ts, swap);
      std::vector<uint32_t> mism;
      Result r = check(ts, mism, 3);
      total_bad += r.mismatches;
      std::printf("%-22s %-12s %4u %10llu %10llu\n", instr_name(p.instr), cat.name.c_str(), ts.K,
                  (unsigned long long)r.outputs, (unsigned long long)r.mismatches);
      std::fflush(stdout);
      std::vector<uint32_t> all;
      uint32_t nsave =
          cat.random ? std::min<uint32_t>(ts.ntiles, uint32_t(p.save_rand)) : ts.ntiles;
      for (uint32_t t = 0; t < nsave; ++t) all.push_back(t);
      write_section(fall, ts, all);
      if (cat.random && !mism.empty()) {
        if (mism.size() > 256) mism.resize(256);
        if (!fmism) fmism = open_out(out + "/" + file_stem(p.instr) + "_mism.bin");
        write_section(fmism, ts, mism);
      }
    }
    std::fclose(fall);
    if (fmism) std::fclose(fmism);
  }
  std::printf("\nprobe_mma: seed %llu, total mismatches vs model: %llu\n", (unsigned long long)seed,
              (unsigned long long)total_bad);
  return total_bad == 0 ? 0 : 1;  // 1: the model is wrong somewhere (a finding, not a crash)
}
