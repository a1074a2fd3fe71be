// Helpers shared by the elementwise CPU ops (norm, rope, activation, embedding): the canonical-NaN
// bf16 store and row addressing of [T, H] / [T, heads, D] views. Host/device-safe where it matters.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "lockstep/dtype.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Every bf16 written by an elementwise op goes through f32_to_bf16, which stores any NaN as the
// canonical 0x7FC0 (lockstep/dtype.h).
LS_HD bf16 round_bf16_canonical(float f) { return f32_to_bf16(f); }

namespace detail {

// Rows of a 2-D [R, C] or 3-D [A, B, C] view whose last dimension is contiguous: row r of the
// flattened [R = A·B, C] lives at element offset (r / B)·stride[0] + (r % B)·stride[1].
struct RowAddr {
  char* base = nullptr;
  int64_t s0 = 0, s1 = 0, inner = 1, esize = 1;  // strides in bytes; inner = B

  explicit RowAddr(const TensorView& v)
      : base(static_cast<char*>(v.data)), esize(dtype_size(v.dtype)) {
    if (v.ndim == 3) {
      inner = v.shape[1];
      s0 = v.stride[0] * esize;
      s1 = v.stride[1] * esize;
    } else {
      s0 = v.stride[0] * esize;
    }
  }
  template <typename T>
  T* row(int64_t r) const {
    if (inner == 1) return reinterpret_cast<T*>(base + r * s0);
    return reinterpret_cast<T*>(base + (r / inner) * s0 + (r % inner) * s1);
  }
};

}  // namespace detail
}  // namespace lockstep
