// The host side of ls_ex2_sfu (contract §P.11): 2^x exactly as Hopper's SFU computes it
// (MUFU.EX2, PTX ex2.approx.ftz.f32), from the two 2^23-entry tables the GPU produced
// (dev/ex2/probe_ex2.cu; src/core/ex2_sfu_tables.tar.xz, unpacked and checked by CMake).
#include <bit>
#include <cstdint>
#include <memory>

#include "core/math.h"
#include "lockstep/error.h"

#ifndef LOCKSTEP_EX2_TABLES_PATH
#error "LOCKSTEP_EX2_TABLES_PATH (the unpacked ex2_sfu_tables.bin) is set by CMakeLists.txt"
#endif

// The planes: T+ plane 0, T+ plane 1, T- plane 0, T- plane 1, 2^17 words each (see the tables'
// layout in dev/ex2/make_tables.py and contract §P.11).
asm(".section .rodata.lockstep_ex2_sfu,\"a\",@progbits\n"
    ".balign 64\n"
    ".globl lockstep_ex2_sfu_planes\n"
    ".hidden lockstep_ex2_sfu_planes\n"
    "lockstep_ex2_sfu_planes:\n"
    ".incbin \"" LOCKSTEP_EX2_TABLES_PATH
    "\"\n"
    ".globl lockstep_ex2_sfu_planes_end\n"
    ".hidden lockstep_ex2_sfu_planes_end\n"
    "lockstep_ex2_sfu_planes_end:\n"
    ".previous\n");
extern "C" const uint64_t lockstep_ex2_sfu_planes[];
extern "C" const uint64_t lockstep_ex2_sfu_planes_end[];

namespace lockstep::math_detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the embedded tables are little-endian 64-bit words");

constexpr uint32_t kWords = 1u << 17;  // 64 entries per word

// The sum of table t's (0: T+, 1: T-) steps in word w at the bits of mask.
uint32_t step_sum(int t, uint32_t w, uint64_t mask) {
  const uint64_t* p0 = lockstep_ex2_sfu_planes + size_t(2 * t) * kWords;  // bit 0 of the steps
  const uint64_t* p1 = p0 + kWords;                                       // bit 1
  return uint32_t(std::popcount(p0[w] & mask) + 2 * std::popcount(p1[w] & mask));
}

// base[t][w] = bits(T[64w]), from the steps (T[0] = 1.0; T+ increases, T- decreases).
struct Bases {
  uint32_t base[2][kWords];
  Bases() {
    const size_t bytes = size_t(reinterpret_cast<const char*>(lockstep_ex2_sfu_planes_end) -
                                reinterpret_cast<const char*>(lockstep_ex2_sfu_planes));
    LS_CHECK(bytes == 4 * size_t(kWords) * sizeof(uint64_t), "ls_ex2_sfu", "tables of ", bytes,
             " bytes embedded, expected 4 MiB (src/core/ex2_sfu_tables.tar.xz)");
    for (int t = 0; t < 2; ++t) {
      uint32_t b = 0x3f800000u;
      for (uint32_t w = 0; w < kWords; ++w) {
        const uint32_t into = step_sum(t, w, 1u);            // the step into entry 64w
        const uint32_t rest = step_sum(t, w, ~uint64_t{1});  // 64w + 1 .. 64w + 63
        b = t == 0 ? b + into : b - into;
        base[t][w] = b;
        b = t == 0 ? b + rest : b - rest;
      }
    }
  }
};

const Bases& bases() {
  static const std::unique_ptr<const Bases> b = std::make_unique<Bases>();
  return *b;
}

}  // namespace

float ex2_sfu_host(float x) {
  const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f32_from_bits(0x7fffffffu);  // NaN: the SFU's canonical NaN
  const bool neg = (u >> 31) != 0;
  if (a >= 0x43000000u) return f32_from_bits(neg ? 0u : 0x7f800000u);  // |x| >= 128, inf
  // X = trunc(|x| 2^23) = trunc(m 2^e) with m the 24-bit significand; subnormals count as 0.
  const int e = int(a >> 23) - 127;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t X = e >= 0 ? m << e : (e > -24 ? m >> -e : 0u);
  const uint32_t i = X >> 23, f = X & 0x7fffffu;
  const int t = neg ? 1 : 0;
  const uint32_t r = f & 63u;  // the steps of entries 64w + 1 .. 64w + r
  const uint32_t s = step_sum(t, f >> 6, r == 0 ? 0 : (~uint64_t{0} >> (64 - r)) << 1);
  const uint32_t base = bases().base[t][f >> 6];
  const uint32_t tb = neg ? base - s : base + s;
  if (!neg) return f32_from_bits(tb + (i << 23));  // T+ in [1, 2): exponent 127 + i <= 254
  return (tb >> 23) > i ? f32_from_bits(tb - (i << 23)) : 0.0f;  // below 2^-126: +0 (ftz)
}

}  // namespace lockstep::math_detail
