// SHA-256 speed: MB/s of the portable and the SHA-NI compression function over one buffer in the
// same run (and their ratio), then weights_sha256 (16 MiB pieces hashed in parallel, the digest
// every GRPO step records) over 8 tensors of 64 MiB and over Qwen3-0.6B's tensor shapes, at 1 and
// N threads. Fastest of 3 runs each.
//   ./build/bench_sha256 [MiB, default 256] [threads, default all]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/grpo.h"
#include "engine/sha256.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// Seconds of the fastest of `reps` calls.
double best_seconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void fill(uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = uint8_t((i * 2654435761u) >> 13);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? size_t(std::atoll(argv[1])) : 256;
  if (argc > 2) set_num_threads(std::atoi(argv[2]));
  const int threads = num_threads();
  constexpr int kReps = 3;
  std::printf("bench_sha256: %zu MiB, sha256_hex runs %s, %d threads\n", mib,
              sha256_impl_name(sha256_impl()), threads);

  std::vector<uint8_t> buf(mib << 20);
  fill(buf.data(), buf.size());
  std::printf("%-10s %10s %10s  %s\n", "impl", "seconds", "MB/s", "digest");
  double portable_mbs = 0;
  for (Sha256Impl impl : {Sha256Impl::kPortable, Sha256Impl::kShaNi}) {
    if (!sha256_impl_available(impl)) {
      std::printf("%-10s (not available on this CPU)\n", sha256_impl_name(impl));
      continue;
    }
    std::string digest;
    const double s =
        best_seconds(kReps, [&] { digest = sha256_hex(buf.data(), buf.size(), impl); });
    const double mbs = double(buf.size()) / s / 1e6;
    std::printf("%-10s %10.3f %10.1f  %.16s...\n", sha256_impl_name(impl), s, mbs, digest.c_str());
    if (impl == Sha256Impl::kPortable)
      portable_mbs = mbs;
    else
      std::printf("%-10s %10s %9.1fx\n", "ratio", "", mbs / portable_mbs);
  }
  buf = {};

  // weights_sha256 on 8 x 64 MiB (32 pieces of 16 MiB), then on Qwen3-0.6B's tensor shapes (1.2 GB:
  // the embedding's 19 pieces, then 28 layers of 0.25 to 6 MiB tensors and tiny norms).
  Weights even;
  for (int i = 0; i < 8; ++i)
    even.emplace_back(std::to_string(i), Tensor(DType::kBF16, {32 << 20}));
  Weights qwen;
  for (const WeightSpec& s : qwen3_weight_specs(qwen3_shape_config("qwen3-0.6b")))
    qwen.emplace_back(s.name, Tensor(DType::kBF16, s.shape));
  for (Weights* w : {&even, &qwen}) {
    double bytes = 0;
    for (auto& [name, t] : *w) {
      fill(static_cast<uint8_t*>(t.data()), t.nbytes());
      bytes += double(t.nbytes());
    }
    std::printf("weights_sha256, %s (%.0f MiB, %zu tensors):\n%-10s %10s %10s\n",
                w == &even ? "8 x 64 MiB" : "qwen3-0.6b shapes", bytes / (1 << 20), w->size(),
                "threads", "seconds", "MB/s");
    for (int t : {1, threads}) {
      set_num_threads(t);
      const double s = best_seconds(kReps, [&] { weights_sha256(*w); });
      std::printf("%-10d %10.3f %10.1f\n", t, s, bytes / s / 1e6);
      if (threads == 1) break;
    }
  }
  return 0;
}
