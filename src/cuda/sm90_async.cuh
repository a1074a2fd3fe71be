// PTX helpers shared by the Hopper kernels (gemm/mainloop_sm90.cuh, the small-M TMA ones):
// shared-memory addresses, mbarriers, the global timer and the 2-D TMA load. Arithmetic-free: they
// move data and order it, the kernels decide the chains.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep::cuda::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ uint32_t mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// NOTE: a wait that has not completed after kMbarWaitLimitNs traps (the launch fails with an
// error) instead of hanging the process: every wait here lasts microseconds when the pipeline is
// sound, so this only turns a deadlock bug into an error.
// The trap sits in a function of its own: an inline trap in a warp-specialized kernel made ptxas
// keep every warp at the launch bound's register count (168 at 384 threads), ignoring the
// consumers' setmaxnreg.inc (docs/perf.md, 2026-12-04 evening).
constexpr uint64_t kMbarWaitLimitNs = 10000000000ull;
__device__ __noinline__ inline void mbar_wait_timed_out() { __trap(); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (global_ns() - t0 > kMbarWaitLimitNs) mbar_wait_timed_out();
  }
}

// Named barriers 1..15 (0 is __syncthreads): sync waits until `threads` threads have arrived or
// synced on it; arrive counts this thread without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// One 2-D box (64 k x rows) of a bf16 tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t k,
                                            int32_t row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}

// The bulk-copy store side (the TN accumulate kernel's y tile, mainloop_sm90.cuh): threads that
// wrote shared memory for a TMA store make it visible to the async proxy first; a store reads its
// box from shared memory and writes it to global memory (clipped to the tensor's bounds), in bulk
// groups that the issuing thread commits and waits on (.read: the shared memory is free again;
// without: the writes are done).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int32_t col,
                                             int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(col), "r"(row)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace lockstep::cuda::detail
