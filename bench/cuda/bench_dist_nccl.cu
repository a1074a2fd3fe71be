// NCCL timing on every visible GPU (one thread per GPU; the thread transport as the bootstrap):
// the row-parallel layer's output over t ranks, rank r holding its fp32 partial [T, H] (H = 4096),
// each way timed per call in us (median of 50 blocking calls after 5 warm-ups, host wall clock of
// rank 0; the ranks start each way together after a barrier):
//   all_gather       the NCCL transport's all_gather of the partials (descriptor exchange, then
//                    ncclAllGather, each waited for): [t, T, H] on every rank
//   + combine        that, then gemm_tree_combine of the t partials into y [T, H] bf16 on every
//   rank
//                    (lockstep's path: the contract's bits, the same for every t, §G.5)
//   nccl all_gather  ncclAllGather alone on a plain NCCL communicator, then cudaStreamSynchronize
//   nccl all_reduce  ncclAllReduce (sum, f32) of the partial, then cudaStreamSynchronize: the
//                    usual way and issue 15's baseline (its bits depend on NCCL's algorithm and on
//                    t). Only this benchmark reduces with NCCL, never the transport.
//   ./build-gpu/bench_dist_nccl [--quick]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"  // CK
#include "dist/nccl/nccl_transport.h"
#include "dist/thread_transport.h"
#include "lockstep/cuda/gemm.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::TensorView;
using lockstep::dist::Communicator;

namespace {

constexpr int64_t kH = 4096;

#define NCCL_CK(x)                                                                         \
  do {                                                                                     \
    ncclResult_t r_ = (x);                                                                 \
    if (r_ != ncclSuccess) {                                                               \
      std::printf("NCCL error %s at %s:%d\n", ncclGetErrorString(r_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// Median us of `iters` calls of f (each blocking), after `warm` untimed ones; all ranks enter the
// timed loop together.
template <typename F>
double median_us(Communicator& comm, F f, int warm = 5, int iters = 50) {
  for (int i = 0; i < warm; ++i) f();
  comm.barrier();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TensorView dview(void* p, DType dt, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(p, dt, shape, Device::kCUDA);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "bench_dist_nccl: no CUDA device\n");
    return 2;
  }
  lockstep::dist::disable_nccl_nvls();  // before any NCCL call (nccl_transport.h)
  const int t = gpus;
  const bool combine = t <= 8 && (t & (t - 1)) == 0;
  std::printf(
      "bench_dist_nccl: %d rank(s), one per GPU; %s; partials [T, %lld] f32; median of 50 "
      "blocking calls, us%s\n",
      t, lockstep::dist::nccl_version().c_str(), (long long)kH,
      t == 1 ? " (1 GPU: no communication, the numbers are the calls' fixed cost)" : "");
  std::printf("%6s %10s %12s %12s %16s %16s\n", "T", "MB/rank", "all_gather", "+ combine",
              "nccl all_gather", "nccl all_reduce");
  std::vector<int64_t> tokens = {1, 16, 128, 1024, 4096};
  if (quick) tokens = {1, 128};
  lockstep::dist::run_ranks(t, [&](Communicator& boot) {
    const int r = boot.rank();
    CK(cudaSetDevice(r));
    auto comm = lockstep::dist::make_nccl_communicator(boot, r);
    // A plain blocking NCCL communicator for the raw NCCL calls, its id through the bootstrap.
    lockstep::Tensor id_bytes(DType::kU8, {int64_t(sizeof(ncclUniqueId))});
    ncclUniqueId id{};
    if (r == 0) NCCL_CK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data(), &id, sizeof(id));
    boot.broadcast(id_bytes.view(), 0);
    std::memcpy(&id, id_bytes.data(), sizeof(id));
    ncclComm_t raw = nullptr;
    NCCL_CK(ncclCommInitRank(&raw, t, id, r));
    cudaStream_t stream = nullptr;
    CK(cudaStreamCreate(&stream));
    for (int64_t T : tokens) {
      const size_t n = size_t(T * kH);
      float *part = nullptr, *all = nullptr, *sum = nullptr;
      uint16_t* y = nullptr;
      CK(cudaMalloc(&part, n * 4));
      CK(cudaMalloc(&all, n * 4 * size_t(t)));
      CK(cudaMalloc(&sum, n * 4));
      CK(cudaMalloc(&y, n * 2));
      CK(cudaMemset(part, 0, n * 4));
      const TensorView send = dview(part, DType::kF32, {T, kH});
      const TensorView recv = dview(all, DType::kF32, {t, T, kH});
      std::vector<TensorView> partials;
      for (int q = 0; q < t; ++q)
        partials.push_back(dview(all + size_t(q) * n, DType::kF32, {T, kH}));
      const double ag = median_us(*comm, [&] { comm->all_gather(send, recv); });
      double ag_combine = -1;
      if (combine)
        ag_combine = median_us(*comm, [&] {
          comm->all_gather(send, recv);
          lockstep::cuda::gemm_tree_combine(partials, nullptr, dview(y, DType::kBF16, {T, kH}));
          CK(cudaDeviceSynchronize());
        });
      const double raw_ag = median_us(*comm, [&] {
        NCCL_CK(ncclAllGather(part, all, n, ncclFloat32, raw, stream));
        CK(cudaStreamSynchronize(stream));
      });
      const double raw_ar = median_us(*comm, [&] {
        NCCL_CK(ncclAllReduce(part, sum, n, ncclFloat32, ncclSum, raw, stream));
        CK(cudaStreamSynchronize(stream));
      });
      if (r == 0) {
        char c[32] = "-";
        if (ag_combine >= 0) std::snprintf(c, sizeof(c), "%.1f", ag_combine);
        std::printf("%6lld %10.2f %12.1f %12s %16.1f %16.1f\n", (long long)T, double(n * 4) / 1e6,
                    ag, c, raw_ag, raw_ar);
      }
      comm->barrier();
      for (void* p : {static_cast<void*>(part), static_cast<void*>(all), static_cast<void*>(sum),
                      static_cast<void*>(y)})
        CK(cudaFree(p));
    }
    CK(cudaStreamDestroy(stream));
    NCCL_CK(ncclCommDestroy(raw));
  });
  if (!combine) std::printf("(+ combine: gemm_tree_combine takes 1, 2, 4 or 8 partials)\n");
  return 0;
}
