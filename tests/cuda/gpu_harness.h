// The one harness of the GPU test programs (tests/cuda): pass/fail counting (per section, for the
// per-op counts), the command line (--quick for compute-sanitizer runs, --seed N or a bare number
// to replay), the CUDA-device check (a GPU program never passes without a GPU: it exits 2 with a
// message), poisoned device buffers, and the bitwise comparison that names the first differing
// element and both values. State is process-wide (inline variables), so a program may be split
// over several translation units. Ends with "N passed, M failed (program)" (scripts/gpu_check.sh
// greps it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace lockstep::gpu_test {

inline int g_pass = 0, g_fail = 0;
inline bool g_quick = false;
inline uint64_t g_seed = 0;
inline std::string g_filter;  // --filter S: programs that support it run only what S names
inline std::mt19937_64 g_rng;
inline std::string g_section = "main";  // the per-section counts are printed by finish()
inline std::map<std::string, std::pair<int, int>> g_sections;

inline void report(bool ok, const std::string& what) {
  auto& s = g_sections[g_section];
  if (ok) {
    ++g_pass;
    ++s.first;
  } else {
    ++g_fail;
    ++s.second;
    std::printf("FAIL %s\n", what.c_str());
    std::fflush(stdout);
  }
}

// A program's own on/off flag: `name` sets *value to `set_to`.
struct Flag {
  const char* name;
  bool* value;
  bool set_to = true;
};

// Parses --quick, --seed N, a bare number (the seed), --filter S and the program's own flags,
// checks for a CUDA device (exit 2 with a message if there is none), seeds g_rng, prints
// "<program>: seed S (quick)". Returns false on an unknown argument (after printing usage); main
// then returns 2.
inline bool start(const char* program, int argc, char** argv, const std::vector<Flag>& flags = {}) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  g_seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      g_quick = true;
    } else if (a == "--seed" && i + 1 < argc) {
      g_seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--filter" && i + 1 < argc) {
      g_filter = argv[++i];
    } else if (!a.empty() && a.find_first_not_of("0123456789") == std::string::npos) {
      g_seed = std::strtoull(a.c_str(), nullptr, 10);
    } else {
      bool known = false;
      for (const Flag& f : flags) {
        if (a == f.name) {
          *f.value = f.set_to;
          known = true;
        }
      }
      if (!known) {
        std::string own;
        for (const Flag& f : flags) own += std::string(" [") + f.name + "]";
        std::printf("usage: %s [--quick] [--seed N | N] [--filter SUBSTRING]%s\n", program,
                    own.c_str());
        return false;
      }
    }
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("%s: no CUDA device (%s): this GPU test cannot run here; failing\n", program,
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    std::exit(2);
  }
  g_rng.seed(g_seed);
  std::printf("%s: seed %llu%s%s%s\n", program, (unsigned long long)g_seed,
              g_quick ? " (quick)" : "", g_filter.empty() ? "" : " filter ", g_filter.c_str());
  return true;
}

// Prints the per-section counts and "<program>: N passed, M failed"; the exit status for main.
inline int finish(const char* program) {
  for (const auto& [name, c] : g_sections)
    std::printf("  %-40s %6d passed, %d failed\n", name.c_str(), c.first, c.second);
  // NOTE: the count opens the line: scripts/gpu_check.sh greps '^[0-9]+ passed, 0 failed'.
  std::printf("%d passed, %d failed (%s)\n", g_pass, g_fail, program);
  if (g_pass + g_fail == 0) {
    std::printf("%s: nothing was checked; failing\n", program);
    return 1;
  }
  return g_fail == 0 ? 0 : 1;
}

// Runs f as one section (a thrown exception counts as one failure naming the section).
inline void section(const std::string& name, const std::function<void()>& f) {
  const std::string saved = g_section;
  g_section = name;
  try {
    f();
  } catch (const std::exception& e) {
    report(false, name + ": exception: " + e.what());
  }
  g_section = saved;
}

// Device allocations of one test, poisoned with 0xA5, freed at scope exit.
struct DevPool {
  std::vector<void*> ptrs;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    CK(cudaMemset(p, 0xA5, bytes ? bytes : 16));
    ptrs.push_back(p);
    return p;
  }
  void* upload(const void* host, size_t bytes) {
    void* p = alloc(bytes);
    CK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
  }
  DevPool() = default;
  DevPool(const DevPool&) = delete;
  DevPool& operator=(const DevPool&) = delete;
  ~DevPool() {
    for (void* p : ptrs) cudaFree(p);
  }
};

inline std::vector<uint8_t> download(const void* dev, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// A view with explicit element strides (row-major contiguous when strides is empty).
inline TensorView view(void* p, DType dt, std::vector<int64_t> shape,
                       std::vector<int64_t> strides = {}, Device dev = Device::kCUDA) {
  TensorView v = TensorView::contiguous(p, dt, shape, dev);
  for (size_t i = 0; i < strides.size(); ++i) v.stride[i] = strides[i];
  return v;
}

// memcmp of n elements of size es; on a difference names the first differing element, both bit
// patterns and how many differ. Counts one check.
inline bool bitwise(const std::string& what, const void* gpu, const void* cpu, size_t n,
                    size_t es) {
  const auto* a = static_cast<const uint8_t*>(gpu);
  const auto* b = static_cast<const uint8_t*>(cpu);
  if (n == 0 || std::memcmp(a, b, n * es) == 0) {
    report(true, what);
    return true;
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) != 0) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  uint64_t x = 0, y = 0;
  std::memcpy(&x, a + first * es, es);
  std::memcpy(&y, b + first * es, es);
  report(false, what);
  std::printf("  mismatch: %zu of %zu differ; first at %zu: gpu 0x%llx cpu 0x%llx\n", bad, n, first,
              (unsigned long long)x, (unsigned long long)y);
  return false;
}

// fn must throw lockstep::Error whose message contains needle (nullptr: any message).
inline void expect_error(const std::string& what, const std::function<void()>& fn,
                         const char* needle) {
  try {
    fn();
  } catch (const lockstep::Error& e) {
    const bool ok = needle == nullptr || std::strstr(e.what(), needle) != nullptr;
    report(ok, "error: " + what);
    if (!ok) std::printf("  message '%s' lacks '%s'\n", e.what(), needle);
    return;
  }
  report(false, "error: " + what + " (nothing thrown)");
}

}  // namespace lockstep::gpu_test
