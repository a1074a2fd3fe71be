// Quick ns/call loop for src/core/math.h (dev tool; numbers go into docs/perf.md, not tests).
//   g++ -O3 -std=c++20 -march=native -ffp-contract=off -Iinclude -Isrc dev/math_bench.cc \
//     build/liblockstep_core.a -lpthread -o /tmp/math_bench
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "core/math.h"
using namespace lockstep;
template <class F>
static void bench(const char* name, const std::vector<float>& x, F f) {
  std::vector<float> y(x.size());
  double best = 1e9;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / x.size());
  }
  float s = 0; for (float v : y) s += v;
  printf("%-28s %.2f ns/call (checksum %g)\n", name, best, s);
}
int main() {
  std::mt19937 g(1);
  size_t n = 1 << 20;
  std::vector<float> neg(n), any(n), pos(n);
  std::uniform_real_distribution<float> dn(-30.f, 0.f), da(-80.f, 80.f), dp(1e-6f, 1e6f);
  for (size_t i = 0; i < n; ++i) { neg[i] = dn(g); any[i] = da(g); pos[i] = dp(g); }
  bench("ls_exp2f  x in [-30,0]", neg, [](float v) { return ls_exp2f(v); });
  bench("std exp2f x in [-30,0]", neg, [](float v) { return exp2f(v); });
  bench("ls_ex2_sfu x in [-30,0]", neg, [](float v) { return ls_ex2_sfu(v); });
  bench("ls_expf   x in [-80,80]", any, [](float v) { return ls_expf(v); });
  bench("std expf  x in [-80,80]", any, [](float v) { return expf(v); });
  bench("ls_log2f  x in [1e-6,1e6]", pos, [](float v) { return ls_log2f(v); });
  bench("std log2f", pos, [](float v) { return log2f(v); });
  bench("ls_logf   x in [1e-6,1e6]", pos, [](float v) { return ls_logf(v); });
  bench("std logf", pos, [](float v) { return logf(v); });
}
