// The RoPE contract (docs/contract.md §E): settings, the host-built cos/sin table, argument checks.
#include "lockstep/contract/rope.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "contract/checks.h"

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

}  // namespace lockstep

namespace lockstep::contract {

void check_rope_args(const char* op, Device dev, const TensorView& x, const TensorView& positions,
                     int64_t D, int64_t P, const TensorView& y) {
  check_view(op, "x", x, DType::kBF16, {-1, -1, D}, dev);
  const int64_t T = x.shape[0], heads = x.shape[1];
  check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T}, dev);
  check_view(op, "y", y, DType::kBF16, {T, heads, D}, dev);
  // Every host position is checked before anything is written (device positions: the kernel
  // guards them).
  if (dev != Device::kCPU) return;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = index_at(positions, t);
    LS_CHECK(p >= 0 && p < P, op, "argument 'positions' element ", t, " = ", p,
             " is outside the table's range [0, ", P, ")");
  }
}

}  // namespace lockstep::contract
