// Element types and the bf16 storage type. bf16 <-> fp32 conversion rounds to nearest even (RNE);
// NaN stays NaN (quiet, sign kept). Usable from host and device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LS_DTYPE_HD __host__ __device__ __forceinline__
#else
#define LS_DTYPE_HD inline
#endif

namespace lockstep {

enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU8 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

inline int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

LS_DTYPE_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
LS_DTYPE_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// bf16 as a plain 16-bit pattern: trivially copyable, same layout as __nv_bfloat16.
struct bf16 {
  uint16_t bits;
};

LS_DTYPE_HD float bf16_to_f32(bf16 h) { return f32_from_bits(uint32_t(h.bits) << 16); }

// NOTE: IEEE leaves NaN payloads and signs to the hardware (x86 makes 0xFFC00000 for inf-inf, a
// GPU 0x7FFFFFFF), so for CPU/GPU bit parity every NaN an op stores is ONE pattern: 0x7FC0 in bf16,
// 0x7FC00000 in fp32 (contract §2).
constexpr uint16_t kCanonicalNanBf16 = 0x7FC0;
constexpr uint32_t kCanonicalNanF32 = 0x7FC00000u;

LS_DTYPE_HD bool is_nan_f32(float f) { return (f32_bits(f) & 0x7fffffffu) > 0x7f800000u; }

// fp32 value as stored by an op: NaN becomes the canonical NaN, everything else is unchanged.
LS_DTYPE_HD float canonical_f32(float f) {
  return is_nan_f32(f) ? f32_from_bits(kCanonicalNanF32) : f;
}

// Round to nearest, ties to even. Any NaN -> the canonical NaN 0x7FC0.
LS_DTYPE_HD bf16 f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{kCanonicalNanBf16};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t((u + rounding) >> 16)};
}

LS_DTYPE_HD bool bf16_bits_equal(bf16 a, bf16 b) { return a.bits == b.bits; }

}  // namespace lockstep
