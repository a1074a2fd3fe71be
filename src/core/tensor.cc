// TensorView / Tensor helpers and argument checks.
#include "lockstep/tensor.h"

#include <cstdlib>
#include <sstream>

namespace lockstep {

static TensorView make_contiguous(void* data, DType dtype, const int64_t* shape, int ndim,
                                  Device device) {
  LS_CHECK(ndim <= kMaxDims, "TensorView", "at most ", kMaxDims, " dims, got ", ndim);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = ndim;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    LS_CHECK(shape[i] >= 0, "TensorView", "negative extent ", shape[i], " in dim ", i);
    v.shape[i] = shape[i];
    v.stride[i] = s;
    s *= shape[i];
  }
  return v;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape.begin(), int(shape.size()), device);
}
TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape.data(), int(shape.size()), device);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << shape_string() << " " << device_name(device) << " strides [";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << stride[i];
  os << "]";
  return os.str();
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  LS_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0], "TensorView::rows",
           "range [", begin, ", ", end, ") outside ", shape_string());
  TensorView v = *this;
  v.shape[0] = end - begin;
  v.data = static_cast<char*>(data) + begin * stride[0] * dtype_size(dtype);
  return v;
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

static int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) {
    LS_CHECK(e >= 0, "Tensor", "negative extent ", e);
    n *= e;
  }
  return n;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_);
  size_t bytes = size_t(numel_ * dtype_size(dtype_));
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  LS_CHECK(p != nullptr, "Tensor", "out of memory allocating ", bytes, " bytes");
  storage_ = std::shared_ptr<void>(p, Free());
}

TensorView Tensor::view() const { return TensorView::contiguous(data(), dtype_, shape_, device_); }

Tensor Tensor::adopt(DType dtype, std::vector<int64_t> shape, std::shared_ptr<void> storage,
                     Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.numel_ = checked_numel(t.shape_);
  LS_CHECK(storage != nullptr || t.numel_ == 0, "Tensor", "adopt: null storage for ", t.numel_,
           " elements");
  t.storage_ = std::move(storage);
  return t;
}

static void check_shape(const char* op, const char* arg, const TensorView& t,
                        std::initializer_list<int64_t> shape, Device device) {
  LS_CHECK(t.device == device, op, "argument '", arg, "' expected device ", device_name(device),
           ", got ", device_name(t.device));
  const int64_t* want = shape.begin();  // -1: any extent
  bool ok = t.ndim == int(shape.size());
  for (int i = 0; ok && i < t.ndim; ++i) ok = want[i] < 0 || t.shape[i] == want[i];
  if (!ok) {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      text += (i ? ", " : "") + (want[i] < 0 ? std::string("*") : std::to_string(want[i]));
    LS_CHECK(false, op, "argument '", arg, "' expected shape ", text + "]", ", got ",
             t.shape_string());
  }
  LS_CHECK(t.numel() == 0 || t.data != nullptr, op, "argument '", arg, "' has a null data pointer");
}

void check_tensor(const char* op, const char* arg, const TensorView& t, DType dtype,
                  std::initializer_list<int64_t> shape, Device device) {
  LS_CHECK(t.dtype == dtype, op, "argument '", arg, "' expected dtype ", dtype_name(dtype),
           ", got ", dtype_name(t.dtype));
  check_shape(op, arg, t, shape, device);
}

void check_tensor_dtypes(const char* op, const char* arg, const TensorView& t,
                         std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape,
                         Device device) {
  bool ok = false;
  std::string names;
  for (DType d : dtypes) {
    ok = ok || d == t.dtype;
    names += names.empty() ? "" : " or ";
    names += dtype_name(d);
  }
  LS_CHECK(ok, op, "argument '", arg, "' expected dtype ", names, ", got ", dtype_name(t.dtype));
  check_shape(op, arg, t, shape, device);
}

void check_inner_contiguous(const char* op, const char* arg, const TensorView& t) {
  LS_CHECK(t.inner_contiguous(), op, "argument '", arg,
           "' must have stride 1 in its last dimension, got ", t.describe());
}

}  // namespace lockstep
