// Helpers shared by the elementwise op tests (norm, rope, activation, embedding).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "lockstep/tensor.h"
#include "util/test_util.h"

namespace lockstep::test {

constexpr uint16_t kCanonNan = 0x7FC0;  // the one NaN pattern elementwise ops store

// Batch sizes and odd feature sizes used across the elementwise tests.
inline const std::vector<int64_t> kBatchSizes = {1, 3, 17, 256};

inline float f(bf16 h) { return bf16_to_f32(h); }
inline bool is_nan(bf16 h) { return (h.bits & 0x7fffu) > 0x7f80u; }

// Expects fn() to throw lockstep::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected lockstep::Error mentioning '" << (parts.empty() ? "" : parts[0])
                  << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    }
  }
}

// A [rows, cols] bf16 view inside a wider buffer: row stride `ld` >= cols (tests strided rows).
inline TensorView strided_view(const Tensor& buf, int64_t rows, int64_t cols, int64_t ld,
                               int64_t col_offset = 0) {
  TensorView v = TensorView::contiguous(buf.ptr<bf16>() + col_offset, DType::kBF16, {rows, cols});
  v.stride[0] = ld;
  return v;
}

// Copies row `src_row` of a contiguous [*, cols] bf16 tensor into row `dst_row` of another.
inline void copy_row(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                     int64_t cols) {
  std::memcpy(dst.ptr<bf16>() + dst_row * cols, src.ptr<bf16>() + src_row * cols,
              size_t(cols) * sizeof(bf16));
}

// |a - b| in units of bf16 ulp of b (ulp taken at b's binade; b a finite double reference).
inline double bf16_ulps(float a, double b) {
  if (b == 0) return a == 0 ? 0 : INFINITY;
  int e;
  std::frexp(b, &e);  // |b| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 8, -133));
  return std::fabs(double(a) - b) / ulp;
}

}  // namespace lockstep::test
