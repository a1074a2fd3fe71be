// Every float d in [−86, 88]: sample_expf_normal(d) has ls_expf(d)'s bits, and for d in [−23, 22]
// sample_q32(sample_expf_normal(d)) == sample_mass_q32(d) (and sample_q32_unit's for d <= 0) (the
// sampler kernels' short forms, src/core/sample_choice.h; tests/cpu/test_sampling.cc checks every
// 251st float in CI).
//   g++ -std=c++20 -O2 -ffp-contract=off -Isrc -Iinclude dev/sample_mass_sweep.cc -o /tmp/sweep
//   -pthread /tmp/sweep   # prints the floats checked and the mismatches (0 expected)
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/sample_choice.h"

using namespace lockstep;

int main() {
  std::atomic<uint64_t> checked{0}, bad{0};
  auto range = [&](uint64_t lo, uint64_t hi, int part, int parts) {
    uint64_t n = 0, b = 0;
    for (uint64_t u = lo + part; u <= hi; u += parts) {
      const float d = f32_from_bits(uint32_t(u));
      bool ok = f32_bits(sample_expf_normal(d)) == f32_bits(ls_expf(d));
      if (d >= -23.0f && d <= 22.0f)
        ok = ok && sample_q32(sample_expf_normal(d)) == sample_mass_q32(d);
      if (d >= -23.0f && d <= 0.0f)
        ok = ok && sample_q32_unit(sample_expf_normal(d)) == sample_mass_q32(d);
      if (!ok && b++ < 5) std::printf("mismatch at d = %a\n", double(d));
      ++n;
    }
    checked += n;
    bad += b;
  };
  const int parts = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (int i = 0; i < parts; ++i)
    ts.emplace_back([&, i] {
      range(0x80000000u, 0xc2ac0000u, i, parts);  // −0 .. −86
      range(0, 0x42b00000u, i, parts);            // +0 .. 88
    });
  for (auto& t : ts) t.join();
  std::printf("%llu floats checked, %llu mismatches\n", (unsigned long long)checked.load(),
              (unsigned long long)bad.load());
  return bad.load() == 0 ? 0 : 1;
}
