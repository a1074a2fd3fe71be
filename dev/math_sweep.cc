// Exhaustive error sweep of src/core/math.h over all 2^32 fp32 inputs (dev tool; the test does a
// strided version). Same metric as tests/cpu/test_math.cc, plus the signed range over normal
// results. Usage: math_sweep [fn 0..4] [stride] (4: ls_ex2_sfu, the host's tables)
// Build: g++ -O3 -std=c++20 -march=native -ffp-contract=off -Iinclude -Isrc dev/math_sweep.cc \
//          build/liblockstep_core.a -lpthread
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/math.h"

using namespace lockstep;

static double ulp_error(float y, double ref) {
  constexpr double kOverflow = 0x1.ffffffp127;
  if (std::isnan(ref)) return std::isnan(y) ? 0.0 : INFINITY;
  if (std::isnan(y)) return INFINITY;
  if (std::fabs(ref) >= kOverflow) return (std::isinf(y) && (y > 0) == (ref > 0)) ? 0.0 : INFINITY;
  double yv = std::isinf(y) ? std::copysign(0x1p128, y) : double(y);
  double a = std::fabs(ref);
  int e = a == 0.0 ? -126 : std::max(std::ilogb(a), -126);
  return std::fabs(yv - ref) / std::ldexp(1.0, e - 23);
}

int main(int argc, char** argv) {
  int first = argc > 1 ? atoi(argv[1]) : 0, last = argc > 1 ? first : 4;
  uint64_t stride = argc > 2 ? strtoull(argv[2], nullptr, 0) : 1;
  const char* names[] = {"ls_exp2f", "ls_expf", "ls_log2f", "ls_logf", "ls_ex2_sfu"};
  for (int which = first; which <= last; ++which) {
    int nt = std::max(1u, std::thread::hardware_concurrency());
    std::vector<double> mx(nt, 0), mxs(nt, 0), lo(nt, 0), hi(nt, 0);
    std::vector<uint32_t> arg(nt, 0), args(nt, 0);
    std::vector<uint64_t> cr(nt, 0), cnt(nt, 0);
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
      th.emplace_back([&, t] {
        for (uint64_t i = uint64_t(t) * stride; i < (1ull << 32); i += uint64_t(nt) * stride) {
          float x = f32_from_bits(uint32_t(i));
          float y;
          double ref;
          switch (which) {
            case 0: y = ls_exp2f(x), ref = std::exp2(double(x)); break;
            case 1: y = ls_expf(x), ref = std::exp(double(x)); break;
            case 2: y = ls_log2f(x), ref = std::log2(double(x)); break;
            case 3: y = ls_logf(x), ref = std::log(double(x)); break;
            default: y = ls_ex2_sfu(x), ref = std::exp2(double(x)); break;
          }
          double e = ulp_error(y, ref);
          ++cnt[t];
          cr[t] += f32_bits(y) == f32_bits(float(ref)) || (std::isnan(y) && std::isnan(ref));
          bool sub = std::fabs(ref) < 0x1p-126;
          if (sub) {
            if (e > mxs[t]) mxs[t] = e, args[t] = uint32_t(i);
          } else {
            if (e > mx[t]) mx[t] = e, arg[t] = uint32_t(i);
            if (std::isfinite(y) && std::isfinite(ref)) {  // signed, in ulps of ref's binade
              const double se = (double(y) - ref) / std::ldexp(1.0, std::ilogb(ref) - 23);
              lo[t] = std::min(lo[t], se);
              hi[t] = std::max(hi[t], se);
            }
          }
        }
      });
    for (auto& t : th) t.join();
    int bt = int(std::max_element(mx.begin(), mx.end()) - mx.begin());
    int bs = int(std::max_element(mxs.begin(), mxs.end()) - mxs.begin());
    uint64_t n = 0, c = 0;
    double slo = 0, shi = 0;
    for (int t = 0; t < nt; ++t) {
      n += cnt[t], c += cr[t];
      slo = std::min(slo, lo[t]);
      shi = std::max(shi, hi[t]);
    }
    printf("%-9s %llu inputs: max %.4f ulp at %a (0x%08x); results < 2^-126: max %.4f ulp at %a; "
           "%.4f%% correctly rounded; signed range (normal results) %.4f .. %.4f ulp\n",
           names[which], (unsigned long long)n, mx[bt], f32_from_bits(arg[bt]), arg[bt], mxs[bs],
           f32_from_bits(args[bs]), 100.0 * double(c) / double(n), slo, shi);
  }
}
