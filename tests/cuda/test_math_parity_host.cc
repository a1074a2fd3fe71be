// Host half of dev/math_parity.cu: the same functions compiled by g++ (-ffp-contract=off), as the
// lockstep library is. Evaluates fn on the bit patterns [start, start + n).
#include <cstdint>
#include <thread>
#include <vector>

#include "core/math.h"

void cpu_eval(int fn, uint32_t start, uint64_t n, float* out) {
  int nt = int(std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t) {
    th.emplace_back([=] {
      uint64_t i0 = n * t / nt, i1 = n * (t + 1) / nt;
      for (uint64_t i = i0; i < i1; ++i) {
        float x = lockstep::f32_from_bits(uint32_t(start + i));
        float y;
        switch (fn) {
          case 0:
            y = lockstep::ls_exp2f(x);
            break;
          case 1:
            y = lockstep::ls_expf(x);
            break;
          case 2:
            y = lockstep::ls_log2f(x);
            break;
          case 3:
            y = lockstep::ls_logf(x);
            break;
          default:
            y = lockstep::ls_ex2_sfu(x);
            break;
        }
        out[i] = y;
      }
    });
  }
  for (auto& t : th) t.join();
}
