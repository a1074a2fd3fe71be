// RoPE on the CPU, the executable form of docs/contract.md §E "RoPE": host double
// cos/sin table rounded to fp32; per pair (i, i + D/2) of a row at position p, with c = cos[p,i],
// s = sin[p,i]: y_i = round(x_i*c - x_{i+D/2}*s), y_{i+D/2} = round(x_{i+D/2}*c + x_i*s), each
// product and the sum a separate fp32 RNE op. One task computes a whole (token, head) row.
#include "lockstep/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/thread_pool.h"
#include "cpu/checks.h"
#include "cpu/elementwise_common.h"

namespace lockstep {

void RopeConfig::validate() const {
  LS_CHECK(head_dim >= 2 && head_dim % 2 == 0, "RopeConfig", "head_dim must be even and >= 2, got ",
           head_dim);
  LS_CHECK(std::isfinite(theta) && theta > 0.0, "RopeConfig", "theta must be finite and > 0, got ",
           theta);
  LS_CHECK(max_positions >= 1, "RopeConfig", "max_positions must be >= 1, got ", max_positions);
}

std::string RopeConfig::to_string() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rope: head_dim=%lld theta=%.17g max_positions=%lld",
                (long long)head_dim, theta, (long long)max_positions);
  return buf;
}

RopeTable RopeTable::build(const RopeConfig& config) {
  config.validate();
  RopeTable t;
  t.config = config;
  const int64_t D = config.head_dim, half = D / 2;
  t.cos.resize(size_t(config.max_positions * half));
  t.sin.resize(size_t(config.max_positions * half));
  // NOTE: double libm (std::pow/cos/sin) is allowed here and only here: the table is a host
  // artifact computed once and shared bit for bit; no fp32 device math ever recomputes it.
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[size_t(i)] = 1.0 / std::pow(config.theta, double(2 * i) / double(D));
  }
  for (int64_t p = 0; p < config.max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * inv_freq[size_t(i)];
      t.cos[size_t(p * half + i)] = float(std::cos(angle));
      t.sin[size_t(p * half + i)] = float(std::sin(angle));
    }
  }
  return t;
}

uint64_t RopeTable::hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  auto eat = [&h](const std::vector<float>& v) {
    for (float f : v) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      for (int b = 0; b < 4; ++b) {
        h ^= (u >> (8 * b)) & 0xffu;
        h *= 0x100000001b3ull;
      }
    }
  };
  eat(cos);
  eat(sin);
  return h;
}

std::string RopeTable::to_string() const {
  char buf[48];
  std::snprintf(buf, sizeof buf, " table_fnv1a=0x%016llx", (unsigned long long)hash());
  return config.to_string() + buf;
}

TensorView RopeTable::cos_view() const {
  return TensorView::contiguous(const_cast<float*>(cos.data()), DType::kF32,
                                {config.max_positions, half_dim()});
}
TensorView RopeTable::sin_view() const {
  return TensorView::contiguous(const_cast<float*>(sin.data()), DType::kF32,
                                {config.max_positions, half_dim()});
}

namespace cpu {
namespace check_detail {

void check_rope_args(const char* op, const TensorView& x, const TensorView& positions, int64_t D,
                     int64_t P, const TensorView& y) {
  check_tensor(op, "x", x, DType::kBF16, {-1, -1, D});
  check_inner_contiguous(op, "x", x);
  const int64_t T = x.shape[0], heads = x.shape[1];
  check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T});
  check_tensor(op, "y", y, DType::kBF16, {T, heads, D});
  check_inner_contiguous(op, "y", y);
  // Every position is checked before anything is written.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t off = t * positions.stride[0];
    const int64_t p = positions.dtype == DType::kI32 ? int64_t(positions.ptr<const int32_t>()[off])
                                                     : positions.ptr<const int64_t>()[off];
    LS_CHECK(p >= 0 && p < P, op, "argument 'positions' element ", t, " = ", p,
             " is outside the table's range [0, ", P, ")");
  }
}

}  // namespace check_detail

void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
          const TensorView& y) {
  const char* op = "rope";
  table.config.validate();
  const int64_t D = table.config.head_dim, half = D / 2, P = table.config.max_positions;
  LS_CHECK(int64_t(table.cos.size()) == P * half && int64_t(table.sin.size()) == P * half, op,
           "argument 'table' has ", table.cos.size(), " cos and ", table.sin.size(),
           " sin entries, expected ", P * half, " each (build it with RopeTable::build)");
  check_detail::check_rope_args(op, x, positions, D, P, y);
  const int64_t T = x.shape[0], heads = x.shape[1];
  auto pos_at = [&](int64_t t) -> int64_t {
    const int64_t off = t * positions.stride[0];
    return positions.dtype == DType::kI32 ? int64_t(positions.ptr<const int32_t>()[off])
                                          : positions.ptr<const int64_t>()[off];
  };
  const int64_t rows = T * heads;
  if (rows == 0) return;

  const detail::RowAddr xa(x), ya(y);
  parallel_for(rows, std::max<int64_t>(1, 16384 / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = pos_at(r / heads);
      const float* c = table.cos.data() + p * half;
      const float* s = table.sin.data() + p * half;
      const bf16* xr = xa.row<const bf16>(r);
      bf16* yr = ya.row<bf16>(r);
      for (int64_t i = 0; i < half; ++i) {
        // Read the pair before writing it: y may be the same view as x.
        const float a = bf16_to_f32(xr[i]), b = bf16_to_f32(xr[i + half]);
        const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        yr[i] = round_bf16_canonical(ac - bs);
        yr[i + half] = round_bf16_canonical(bc + as);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
