// Shared test helpers: bitwise comparison that names the first differing element, seeded random
// fills (the seed is printed; set LOCKSTEP_TEST_SEED to replay), poison fills.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace lockstep::test {

// One seed per test binary: from LOCKSTEP_TEST_SEED if set, else from the clock. Printed once.
inline uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("LOCKSTEP_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 0)
                     : uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("[lockstep] test seed %llu (LOCKSTEP_TEST_SEED=%llu to replay)\n",
                (unsigned long long)s, (unsigned long long)s);
    return s;
  }();
  return seed;
}

// A generator for one test: seeded from the binary's seed and a per-call salt.
inline std::mt19937_64 rng(uint64_t salt = 0) {
  return std::mt19937_64(test_seed() * 0x9E3779B97F4A7C15ull + salt);
}

inline float element_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16*>(p)[i]);
    case DType::kI32:
      return float(static_cast<const int32_t*>(p)[i]);
    case DType::kI64:
      return float(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

// memcmp-based; on mismatch names the first differing index, both values and both bit patterns,
// and how many elements differ.
inline ::testing::AssertionResult bitwise_equal(const void* a, const void* b, int64_t n, DType t) {
  int64_t es = dtype_size(t);
  if (n == 0 || std::memcmp(a, b, size_t(n * es)) == 0) return ::testing::AssertionSuccess();
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es,
                    size_t(es)) != 0) {
      if (first < 0) first = i;
      ++count;
    }
  }
  auto bits = [&](const void* p) {
    uint64_t u = 0;
    std::memcpy(&u, static_cast<const char*>(p) + first * es, size_t(es));
    std::ostringstream os;
    os << "0x" << std::hex << u;
    return os.str();
  };
  return ::testing::AssertionFailure()
         << count << " of " << n << " elements differ; first at index " << first << ": "
         << element_as_float(a, t, first) << " (" << bits(a) << ") vs "
         << element_as_float(b, t, first) << " (" << bits(b) << ")";
}

inline ::testing::AssertionResult bitwise_equal(const std::vector<float>& a,
                                                const std::vector<float>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  return bitwise_equal(a.data(), b.data(), int64_t(a.size()), DType::kF32);
}

#define EXPECT_BITWISE_EQ(a, b, n, dtype) \
  EXPECT_TRUE(::lockstep::test::bitwise_equal(a, b, n, dtype))
#define ASSERT_BITWISE_EQ(a, b, n, dtype) \
  ASSERT_TRUE(::lockstep::test::bitwise_equal(a, b, n, dtype))

// Random bf16 values ~ N(0, scale), never exactly zero unless allow_zero.
inline void fill_bf16(bf16* p, int64_t n, std::mt19937_64& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < n; ++i) {
    bf16 v = f32_to_bf16(d(g));
    if ((v.bits & 0x7fff) == 0) v = f32_to_bf16(scale * 0.001f);
    p[i] = v;
  }
}
inline void fill_f32(float* p, int64_t n, std::mt19937_64& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < n; ++i) p[i] = d(g);
}
// Poison: a NaN pattern nobody computes, so an unwritten element is caught.
inline void poison(void* p, int64_t bytes) { std::memset(p, 0xA5, size_t(bytes)); }

inline Tensor random_bf16(std::vector<int64_t> shape, std::mt19937_64& g, float scale = 1.0f) {
  Tensor t(DType::kBF16, std::move(shape));
  fill_bf16(t.ptr<bf16>(), t.numel(), g, scale);
  return t;
}
inline Tensor random_f32(std::vector<int64_t> shape, std::mt19937_64& g, float scale = 1.0f) {
  Tensor t(DType::kF32, std::move(shape));
  fill_f32(t.ptr<float>(), t.numel(), g, scale);
  return t;
}
inline Tensor poisoned(DType dtype, std::vector<int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  poison(t.data(), t.nbytes());
  return t;
}

// f() must throw a lockstep::Error whose message contains `needle`.
inline void expect_error_mentioning(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

}  // namespace lockstep::test
