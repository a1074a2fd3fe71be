// TensorView: a non-owning view (pointer, dtype, shape, strides in elements, device), and Tensor,
// an owning, 64-byte aligned CPU buffer. Ops take views and check them with check_tensor(),
// which throws lockstep::Error naming the op, the argument, and expected vs got.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/error.h"

namespace lockstep {

enum class Device : uint8_t { kCPU, kCUDA };
inline const char* device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // in elements

  // Row-major contiguous view over `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::kCPU);
  static TensorView contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                               Device device = Device::kCPU);

  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  bool is_contiguous() const;
  // Innermost dimension has stride 1 (rows may be strided).
  bool inner_contiguous() const {
    return ndim == 0 || stride[ndim - 1] == 1 || shape[ndim - 1] <= 1;
  }
  std::string shape_string() const;  // "[3, 4]"
  std::string describe() const;      // "bf16[3, 4] cpu strides [4, 1]"

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Sub-view of rows [begin, end) along dimension 0.
  TensorView rows(int64_t begin, int64_t end) const;
};

// Owning contiguous tensor: CPU storage (64-byte aligned) or adopted storage (e.g. device memory).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);
  static Tensor empty(DType dtype, std::vector<int64_t> shape) {
    return Tensor(dtype, std::move(shape));
  }
  // A contiguous tensor over storage owned elsewhere (e.g. device memory from
  // lockstep::cuda::empty, whose deleter is cudaFree). `storage` must hold numel·dtype bytes.
  static Tensor adopt(DType dtype, std::vector<int64_t> shape, std::shared_ptr<void> storage,
                      Device device);

  TensorView view() const;
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  void* data() const { return storage_.get(); }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data());
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::shared_ptr<void> storage_;
};

// Shape spec for checks: -1 matches any extent.
// check_tensor("rmsnorm", "x", x, DType::kBF16, {-1, hidden});
void check_tensor(const char* op, const char* arg, const TensorView& t, DType dtype,
                  std::initializer_list<int64_t> shape, Device device = Device::kCPU);
// Same, for a set of allowed dtypes.
void check_tensor_dtypes(const char* op, const char* arg, const TensorView& t,
                         std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape,
                         Device device = Device::kCPU);
void check_inner_contiguous(const char* op, const char* arg, const TensorView& t);

}  // namespace lockstep
