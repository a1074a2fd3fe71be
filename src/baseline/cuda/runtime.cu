// Runtime pieces of the CUDA baseline backend: the cuBLAS context, stream-ordered scratch and
// host <-> device copies (declared in cuda/baseline.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "baseline/cuda/common.cuh"

namespace lockstep::cuda::baseline {

namespace {
constexpr const char* kOp = "baseline cuda";
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS workspace (Hopper recommends 32 MiB)
}  // namespace

Context::Context() {
  int dev = 0;
  LS_BASE_CUDA(kOp, cudaGetDevice(&dev));
  LS_BASE_CUDA(kOp, cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev));
  cublasHandle_t h = nullptr;
  const cublasStatus_t st = cublasCreate(&h);
  LS_CHECK(st == CUBLAS_STATUS_SUCCESS, kOp, "cublasCreate failed: ", cublasGetStatusString(st));
  handle_ = h;
  LS_BASE_CUDA(kOp, cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  cublasStatus_t s2 = cublasSetStream(h, nullptr);
  // NOTE: split-K partial sums stay fp32 for bf16 outputs too (no reduced-precision reduction),
  // so the bf16 GEMM meets the fp32 error bound plus one rounding.
  if (s2 == CUBLAS_STATUS_SUCCESS)
    s2 = cublasSetMathMode(
        h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (s2 == CUBLAS_STATUS_SUCCESS) s2 = cublasSetWorkspace(h, workspace_, workspace_bytes_);
  LS_CHECK(s2 == CUBLAS_STATUS_SUCCESS, kOp,
           "cublasSetStream/SetWorkspace failed: ", cublasGetStatusString(s2));
}

Context::~Context() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
}

std::string Context::summary() const {
  int ver = 0;
  cublasGetVersion(static_cast<cublasHandle_t>(handle_), &ver);
  return detail::concat("baseline cuda: ", num_sms_, " SMs, cuBLAS ", ver / 10000, ".",
                        (ver / 100) % 100, ".", ver % 100, ", workspace ", workspace_bytes_ >> 20,
                        " MiB");
}

DeviceBuffer::DeviceBuffer(size_t bytes, void* stream) : stream_(stream) {
  if (bytes == 0) return;
  LS_BASE_CUDA(kOp, cudaMallocAsync(&p_, bytes, as_stream(stream)));
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFreeAsync(p_, as_stream(stream_));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeAsync(p_, as_stream(stream_));
    p_ = o.p_;
    stream_ = o.stream_;
    o.p_ = nullptr;
  }
  return *this;
}

void upload(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  LS_BASE_CUDA(kOp, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}

void download(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  LS_BASE_CUDA(kOp, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
}

void fill_bytes(void* dst, int value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  LS_BASE_CUDA(kOp, cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
}

void stream_synchronize(void* stream, const char* op) {
  LS_BASE_CUDA(op, cudaStreamSynchronize(as_stream(stream)));
  LS_BASE_CUDA(op, cudaGetLastError());
}

}  // namespace lockstep::cuda::baseline
