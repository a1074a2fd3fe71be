// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), host and device. Pure integer math:
// the same (counter, key) gives the same four words everywhere.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace lockstep {

struct Philox4 {
  uint32_t v[4];
};

LS_HD uint32_t philox_mulhi(uint32_t a, uint32_t b, uint32_t* lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  *lo = uint32_t(p);
  return uint32_t(p >> 32);
}

LS_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    uint32_t hi0 = philox_mulhi(kM0, ctr.v[0], &lo0);
    uint32_t hi1 = philox_mulhi(kM1, ctr.v[2], &lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    key0 += kW0;
    key1 += kW1;
  }
  return ctr;
}

// u in (0, 1) from the top 23 bits k of a word: u = (k + 0.5) * 2^-23. k + 0.5 needs 24 bits,
// so u is exact in fp32; its range is [2^-24, 1 - 2^-24], never 0 or 1.
LS_HD float philox_uniform(uint32_t word) { return (float(word >> 9) + 0.5f) * 0x1p-23f; }

}  // namespace lockstep
