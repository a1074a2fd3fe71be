// GEMM speed: lockstep's bit-exact CPU GEMM (gemm_bf16_nt, MMA model, f32 output) vs OpenBLAS
// cblas_sgemm (x and w converted to fp32 beforehand, outside the timed region) on the same
// shapes, with 1 and 2 threads. Prints a table with the ratio lockstep time / OpenBLAS time.
// Run: ./build/bench_gemm --benchmark_repetitions=3 (the table keeps each shape's fastest
// repetition; --benchmark_filter=... selects shapes). Results: docs/perf.d/gemm.md.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "lockstep/ops/gemm.h"

namespace {

using lockstep::bf16;
using lockstep::DType;
using lockstep::Tensor;

struct Operands {
  Tensor x, w, y;                 // bf16 [M, K], bf16 [N, K], f32 [M, N]
  std::vector<float> xf, wf, yf;  // the same values in fp32 for sgemm
};

Operands make(int64_t M, int64_t N, int64_t K) {
  Operands o{Tensor(DType::kBF16, {M, K}),
             Tensor(DType::kBF16, {N, K}),
             Tensor(DType::kF32, {M, N}),
             {},
             {},
             {}};
  std::mt19937_64 g(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  o.xf.resize(size_t(M * K));
  o.wf.resize(size_t(N * K));
  o.yf.resize(size_t(M * N));
  for (int64_t i = 0; i < M * K; ++i) {
    o.x.ptr<bf16>()[i] = lockstep::f32_to_bf16(d(g));
    o.xf[size_t(i)] = lockstep::bf16_to_f32(o.x.ptr<bf16>()[i]);
  }
  for (int64_t i = 0; i < N * K; ++i) {
    o.w.ptr<bf16>()[i] = lockstep::f32_to_bf16(0.05f * d(g));
    o.wf[size_t(i)] = lockstep::bf16_to_f32(o.w.ptr<bf16>()[i]);
  }
  return o;
}

double flops(const benchmark::State& s) { return 2.0 * s.range(0) * s.range(1) * s.range(2); }

void set_counters(benchmark::State& s) {
  s.counters["GFLOP/s"] =
      benchmark::Counter(flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// args: M, N, K, threads, segments
void BM_lockstep(benchmark::State& s) {
  Operands o = make(s.range(0), s.range(1), s.range(2));
  lockstep::set_num_threads(int(s.range(3)));
  lockstep::GemmConfig cfg{int(s.range(4))};
  for (auto _ : s) {
    lockstep::cpu::gemm_bf16_nt(o.x.view(), o.w.view(), cfg, o.y.view());
    benchmark::DoNotOptimize(o.y.data());
  }
  set_counters(s);
}

// args: M, N, K, threads (y = x · wᵀ, both K-contiguous, as lockstep's "nt").
void BM_openblas(benchmark::State& s) {
  const int M = int(s.range(0)), N = int(s.range(1)), K = int(s.range(2));
  Operands o = make(M, N, K);
  openblas_set_num_threads(int(s.range(3)));
  for (auto _ : s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, o.xf.data(), K, o.wf.data(),
                K, 0.0f, o.yf.data(), N);
    benchmark::DoNotOptimize(o.yf.data());
  }
  set_counters(s);
}

// M = 1 through OpenBLAS's matrix-vector path (y = W·x), its fastest M = 1 code, for reference.
void BM_openblas_gemv(benchmark::State& s) {
  const int N = int(s.range(1)), K = int(s.range(2));
  Operands o = make(1, N, K);
  openblas_set_num_threads(int(s.range(3)));
  for (auto _ : s) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, o.wf.data(), K, o.xf.data(), 1, 0.0f,
                o.yf.data(), 1);
    benchmark::DoNotOptimize(o.yf.data());
  }
  set_counters(s);
}

// The scalar path (one output at a time through mma_chain_bf16), for scale.
void BM_lockstep_scalar(benchmark::State& s) {
  Operands o = make(s.range(0), s.range(1), s.range(2));
  lockstep::set_num_threads(int(s.range(3)));
  lockstep::GemmConfig cfg{int(s.range(4))};
  for (auto _ : s) {
    lockstep::cpu::gemm_bf16_nt_scalar(o.x.view(), o.w.view(), cfg, o.y.view());
    benchmark::DoNotOptimize(o.y.data());
  }
  set_counters(s);
}

// Registers every shape with the three libraries' runs next to each other (lockstep, sgemm,
// sgemv), so that load from other processes hits both sides of a ratio alike.
void register_all() {
  auto add = [](const char* name, void (*fn)(benchmark::State&), std::vector<int64_t> args) {
    benchmark::RegisterBenchmark(name, fn)->Args(args)->UseRealTime()->Unit(
        benchmark::kMillisecond);
  };
  for (int64_t threads : {1, 2})
    for (int64_t M : {1, 512})
      for (int64_t N : {256, 512, 1024, 2048})
        for (int64_t K : {256, 512, 1024, 2048}) {
          add("BM_lockstep", BM_lockstep, {M, N, K, threads, 1});
          add("BM_openblas", BM_openblas, {M, N, K, threads});
          if (M == 1) add("BM_openblas_gemv", BM_openblas_gemv, {M, N, K, threads});
        }
  // Segments barely change the speed: one check with S = 8; and the scalar path, for scale.
  add("BM_lockstep", BM_lockstep, {512, 1024, 1024, 2, 8});
  add("BM_lockstep_scalar", BM_lockstep_scalar, {64, 256, 256, 1, 1});
}

// Collects the runs so the ratio table can be printed after the usual console output.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      const std::string name = r.benchmark_name();
      const auto slash = name.find('/');
      const std::string fam = name.substr(0, slash), args = name.substr(slash + 1);
      // args: "M/N/K/threads[/segments]/real_time"; key on M/N/K/threads.
      std::vector<std::string> parts;
      size_t b = 0;
      for (size_t e; (e = args.find('/', b)) != std::string::npos; b = e + 1)
        parts.push_back(args.substr(b, e - b));
      parts.push_back(args.substr(b));
      if (parts.size() < 4) continue;
      if (fam == "BM_lockstep" && parts.size() >= 5 && parts[4] != "1") continue;
      const std::string key = parts[0] + "/" + parts[1] + "/" + parts[2] + "/" + parts[3];
      const double sec = r.GetAdjustedRealTime() / 1e3;  // the unit is ms
      const double cpu = r.GetAdjustedCPUTime() / 1e3;   // the calling thread's CPU time
      // With --benchmark_repetitions=R the table keeps the fastest repetition: on a shared
      // machine that is the best estimate of the uncontended time (for both libraries).
      auto keep_min = [&](std::map<std::string, double>& m, const std::string& k, double v) {
        auto it = m.find(k);
        if (it == m.end() || v < it->second) m[k] = v;
      };
      if (fam == "BM_lockstep") {
        keep_min(lockstep_, key, sec);
        keep_min(cpu_, "l" + key, cpu);
      }
      if (fam == "BM_openblas") {
        keep_min(openblas_, key, sec);
        keep_min(cpu_, "o" + key, cpu);
      }
      if (fam == "BM_openblas_gemv") keep_min(gemv_, key, sec);
      if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(key);
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf(
        "\n| M | N | K | threads | lockstep ms | sgemm ms | ratio (lockstep / sgemm) |"
        " lockstep GFLOP/s | sgemm GFLOP/s | sgemv ms | ratio (lockstep / sgemv) |"
        " 1 thread, by CPU time: lockstep GFLOP/s, ratio to sgemm |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& key : keys_) {
      if (!lockstep_.count(key) || !openblas_.count(key)) continue;
      long M, N, K, t;
      std::sscanf(key.c_str(), "%ld/%ld/%ld/%ld", &M, &N, &K, &t);
      const double f = 2.0 * M * N * K, a = lockstep_[key], o = openblas_[key];
      std::printf("| %ld | %ld | %ld | %ld | %.3f | %.3f | %.1f | %.2f | %.2f |", M, N, K, t,
                  a * 1e3, o * 1e3, a / o, f / a * 1e-9, f / o * 1e-9);
      if (gemv_.count(key)) {
        std::printf(" %.3f | %.1f |", gemv_[key] * 1e3, a / gemv_[key]);
      } else {
        std::printf(" | |");
      }
      if (t == 1) {
        std::printf(" %.2f, %.1f |\n", f / cpu_["l" + key] * 1e-9,
                    cpu_["l" + key] / cpu_["o" + key]);
      } else {
        std::printf(" |\n");
      }
    }
    std::ifstream load("/proc/loadavg");
    std::string line;
    std::getline(load, line);
    std::printf("\nload average at the end: %s\n", line.c_str());
  }

 private:
  std::map<std::string, double> lockstep_, openblas_, gemv_, cpu_;
  std::vector<std::string> keys_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  {
    std::ifstream load("/proc/loadavg");
    std::string line;
    std::getline(load, line);
    std::printf("load average at the start: %s\n", line.c_str());
  }
  register_all();
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
