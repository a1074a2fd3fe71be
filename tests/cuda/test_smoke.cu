// GPU smoke test: device bf16 rounding equals the host's, bit for bit, on random fp32 inputs
// (every pattern class: random bits). Harness: cuda/gpu_harness.h (device check, counts).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/gpu_harness.h"
#include "lockstep/dtype.h"

namespace lockstep::cuda {
void bf16_round(const float* in, bf16* out, int n, cudaStream_t stream);
}

int main(int argc, char** argv) {
  using namespace lockstep;
  if (!gpu_test::start("test_smoke", argc, argv)) return 2;
  const int n = 1 << 20;
  std::mt19937 g(12345);
  std::vector<float> in(n);
  for (int i = 0; i < n; ++i) {
    uint32_t u = g();
    std::memcpy(&in[i], &u, 4);
  }
  float* din;
  bf16* dout;
  CK(cudaMalloc(&din, n * 4));
  CK(cudaMalloc(&dout, n * 2));
  CK(cudaMemcpy(din, in.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xA5, n * 2));
  cuda::bf16_round(din, dout, n, 0);
  CK(cudaDeviceSynchronize());
  std::vector<bf16> out(n);
  CK(cudaMemcpy(out.data(), dout, n * 2, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i)
    if (out[i].bits != f32_to_bf16(in[i]).bits && bad++ < 5)
      std::printf("mismatch at %d: in 0x%08x gpu 0x%04x cpu 0x%04x\n", i, f32_bits(in[i]),
                  out[i].bits, f32_to_bf16(in[i]).bits);
  CK(cudaFree(din));
  CK(cudaFree(dout));
  std::printf("test_smoke: %d mismatches of %d\n", bad, n);
  gpu_test::report(bad == 0, "bf16 rounding: device == host on 2^20 random fp32 patterns");
  return gpu_test::finish("test_smoke");
}
