// Device memory and copies behind include/lockstep/cuda/runtime.h.
//   empty():  stream-ordered allocation (cudaMallocAsync on the legacy default stream, the stream
//             every op of the engine runs on) from the device's default memory pool, kept cached
//             (release threshold = max) so the engine's per-call activations cost no driver
//             round trip; the deleter is cudaFreeAsync on the same stream, ordered after every op
//             issued before it, so a tensor may be dropped while kernels that read it are queued.
//   copy():   one cudaMemcpy2DAsync per copy when each side's rows form one pitched block (the
//             usual case: contiguous tensors, column blocks, row blocks), else one per 2-D slab;
//             cudaMemcpyDefault (unified addressing) picks the direction.
//   synchronize(): waits for the stream, then reports any pending CUDA error.
//   EventPool: timing events created once and re-recorded after clear() (no create / destroy per
//             mark: bench-engine --profile-ops records two per op).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/cuda/runtime.h"
#include "lockstep/error.h"

namespace lockstep::cuda {

namespace {

void check_cuda(cudaError_t e, const char* op, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, ": ", cudaGetErrorString(e));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Keep freed blocks in the default pool (no release at every synchronization).
void configure_pool_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess) return;
    uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  });
}

}  // namespace

bool available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear
    return false;
  }
  return n > 0;
}

std::string device_summary() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cuda::device_summary", "cudaGetDevice");
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, dev), "cuda::device_summary", "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.0f GiB), driver %d.%d, runtime %d.%d",
                p.name, p.major, p.minor, p.multiProcessorCount,
                double(p.totalGlobalMem) / double(1ull << 30), driver / 1000, (driver % 1000) / 10,
                runtime / 1000, (runtime % 1000) / 10);
  return buf;
}

int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cuda::current_device", "cudaGetDevice");
  return dev;
}

void set_device(int ordinal) {
  check_cuda(cudaSetDevice(ordinal), "cuda::set_device", "cudaSetDevice");
}

Tensor empty(DType dtype, std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t e : shape) {
    LS_CHECK(e >= 0, "cuda::empty", "negative extent ", e);
    numel *= e;
  }
  if (numel == 0) return Tensor::adopt(dtype, std::move(shape), nullptr, Device::kCUDA);
  configure_pool_once();
  const size_t bytes = size_t(numel) * size_t(dtype_size(dtype));
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, nullptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error(detail::concat(
        "cuda::empty: cannot allocate ", bytes, " bytes (", dtype_name(dtype), ", ", numel,
        " elements): ", cudaGetErrorString(e), "; ", free_b, " of ", total_b, " bytes free"));
  }
  // Freed on the legacy default stream, after everything issued before the last reference
  // went away. Never throws (it may run at exit, after the runtime is gone).
  std::shared_ptr<void> storage(p, [](void* q) { cudaFreeAsync(q, nullptr); });
  return Tensor::adopt(dtype, std::move(shape), std::move(storage), Device::kCUDA);
}

void copy(const TensorView& dst, const TensorView& src, void* stream) {
  const char* op = "cuda::copy";
  LS_CHECK(dst.dtype == src.dtype && dst.ndim == src.ndim, op, "dst ", dst.describe(), " and src ",
           src.describe(), " differ in dtype or rank");
  for (int d = 0; d < src.ndim; ++d)
    LS_CHECK(dst.shape[d] == src.shape[d], op, "dst ", dst.describe(), " and src ", src.describe(),
             " differ in shape");
  LS_CHECK(src.inner_contiguous() && dst.inner_contiguous(), op,
           "last dimension must be contiguous: dst ", dst.describe(), ", src ", src.describe());
  const int64_t numel = src.numel();
  if (numel == 0) return;
  LS_CHECK(src.data != nullptr && dst.data != nullptr, op, "null data pointer");
  const int64_t es = dtype_size(src.dtype);
  const cudaStream_t s = as_stream(stream);
  const int64_t inner = src.ndim == 0 ? 1 : src.shape[src.ndim - 1];
  const int64_t rows = numel / inner;
  const size_t width = size_t(inner * es);
  // Outer dims of a side collapse to one row pitch when each outer stride is the next one times
  // its extent (dims of extent 1 are skipped).
  auto row_pitch = [&](const TensorView& v, int64_t* pitch) {
    int64_t expect = -1;  // stride the next-outer dim must have
    int64_t p = -1;
    for (int d = v.ndim - 2; d >= 0; --d) {
      if (v.shape[d] == 1) continue;
      if (p < 0) {
        p = v.stride[d];
      } else if (v.stride[d] != expect) {
        return false;
      }
      expect = v.stride[d] * v.shape[d];
    }
    *pitch = p < 0 ? inner : p;
    return true;
  };
  int64_t sp = 0, dp = 0;
  if (row_pitch(src, &sp) && row_pitch(dst, &dp) && sp >= inner && dp >= inner) {
    if (rows == 1 || (sp == inner && dp == inner)) {
      check_cuda(cudaMemcpyAsync(dst.data, src.data, size_t(numel * es), cudaMemcpyDefault, s), op,
                 "cudaMemcpyAsync");
    } else {
      check_cuda(cudaMemcpy2DAsync(dst.data, size_t(dp * es), src.data, size_t(sp * es), width,
                                   size_t(rows), cudaMemcpyDefault, s),
                 op, "cudaMemcpy2DAsync");
    }
    return;
  }
  // General case: one pitched copy per slab of the last two dims (or per row if pitches overlap).
  const int64_t mid = src.ndim >= 2 ? src.shape[src.ndim - 2] : 1;
  const int64_t slabs = rows / std::max<int64_t>(mid, 1);
  const int64_t ss = src.ndim >= 2 ? src.stride[src.ndim - 2] : inner;
  const int64_t ds = dst.ndim >= 2 ? dst.stride[dst.ndim - 2] : inner;
  for (int64_t k = 0; k < slabs; ++k) {
    int64_t rem = k, so = 0, doff = 0;
    for (int d = src.ndim - 3; d >= 0; --d) {
      const int64_t i = rem % src.shape[d];
      rem /= src.shape[d];
      so += i * src.stride[d];
      doff += i * dst.stride[d];
    }
    const char* sb = static_cast<const char*>(src.data) + so * es;
    char* db = static_cast<char*>(dst.data) + doff * es;
    if (ss >= inner && ds >= inner) {
      check_cuda(cudaMemcpy2DAsync(db, size_t(ds * es), sb, size_t(ss * es), width, size_t(mid),
                                   cudaMemcpyDefault, s),
                 op, "cudaMemcpy2DAsync");
    } else {
      for (int64_t r = 0; r < mid; ++r)
        check_cuda(cudaMemcpyAsync(db + r * ds * es, sb + r * ss * es, width, cudaMemcpyDefault, s),
                   op, "cudaMemcpyAsync");
    }
  }
}

void synchronize(void* stream) {
  check_cuda(cudaStreamSynchronize(as_stream(stream)), "cuda::synchronize",
             "a device operation failed");
  check_cuda(cudaGetLastError(), "cuda::synchronize", "pending CUDA error");
}

EventPool::~EventPool() {
  // Never throws (it may run at exit, after the runtime is gone).
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

int EventPool::record(void* stream) {
  if (used_ == int(events_.size())) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cuda::EventPool::record", "cudaEventCreate");
    events_.push_back(e);
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(events_[size_t(used_)]), as_stream(stream)),
             "cuda::EventPool::record", "cudaEventRecord");
  return used_++;
}

int EventPool::keep_only(int i) {
  LS_CHECK(i >= 0 && i < used_, "cuda::EventPool::keep_only", "event ", i, " is not recorded (",
           used_, " since the last clear)");
  std::swap(events_[0], events_[size_t(i)]);
  used_ = 1;
  return 0;
}

double EventPool::seconds(int a, int b) const {
  LS_CHECK(a >= 0 && b >= 0 && a < used_ && b < used_, "cuda::EventPool::seconds", "events ", a,
           " and ", b, " are not both recorded (", used_, " since the last clear)");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[size_t(a)]),
                                  static_cast<cudaEvent_t>(events_[size_t(b)])),
             "cuda::EventPool::seconds", "cudaEventElapsedTime (synchronize after recording)");
  return 1e-3 * double(ms);
}

}  // namespace lockstep::cuda
