// Shared fixture of the parity tests of the elementwise and log-prob/sampling kernels: pass/fail
// counting, device allocations poisoned with 0xA5, strided views, the bitwise comparison that names
// the first differing element, and the expected-error check. Each test is one translation unit, so
// the fixture's state lives in an unnamed namespace.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace {

using lockstep::Device;
using lockstep::DType;
using lockstep::TensorView;

int g_pass = 0, g_fail = 0;
bool g_quick = false;
std::mt19937_64 g_rng;

void report(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    std::printf("FAIL %s\n", what.c_str());
  }
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
  ~DevPool() {
    for (void* p : ptrs) cudaFree(p);
  }
};

std::vector<uint8_t> download(const void* dev, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// A view with explicit element strides (row-major contiguous when strides is empty).
TensorView view(void* p, DType dt, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
                Device dev = Device::kCUDA) {
  TensorView v = TensorView::contiguous(p, dt, shape, dev);
  for (size_t i = 0; i < strides.size(); ++i) v.stride[i] = strides[i];
  return v;
}
// memcmp of n elements of size es; names the first differing element and both patterns.
bool bitwise(const std::string& what, const void* gpu, const void* cpu, size_t n, size_t es) {
  const auto* a = static_cast<const uint8_t*>(gpu);
  const auto* b = static_cast<const uint8_t*>(cpu);
  if (std::memcmp(a, b, n * es) == 0) {
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
  std::printf("  %zu of %zu differ; first at %zu: gpu 0x%llx cpu 0x%llx\n", bad, n, first,
              (unsigned long long)x, (unsigned long long)y);
  return false;
}

void expect_error(const std::string& what, const std::function<void()>& fn, const char* needle) {
  try {
    fn();
  } catch (const lockstep::Error& e) {
    const bool ok = std::strstr(e.what(), needle) != nullptr;
    report(ok, "error: " + what);
    if (!ok) std::printf("  message '%s' lacks '%s'\n", e.what(), needle);
    return;
  }
  report(false, "error: " + what + " (nothing thrown)");
}

}  // namespace
