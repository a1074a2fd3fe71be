// GPU parity of the GEMM's TN layout in accumulate mode (dW, docs/cuda-gemm.md "Backward") with
// the CPU weight gradient lockstep::cpu::gemm_bf16_dw, bit for bit (docs/contract.md §B.3), for
// EVERY legal TN plan (detail::gemm_bf16_tn_accumulate with each of gemm_legal_plans: the wgmma
// job tiles 128x256 / 128x128 / 64x128 and both mma.sync tiles), not only the one the planner
// picks (which test_parity's op-case rows reach through cuda::gemm_bf16_dw). The operands are
// gathered on the host exactly as the op's gather-transpose does (canonical token slots, zeros past
// a sequence's end): K-major dyᵀ [N, Tc] and xᵀ [K, Tc]; row strides Tc (TMA-readable) or Tc + 1
// (only the mma.sync plans are legal: the test checks that). Also: the chain continued over two
// launches (the slots split at a block boundary) == one launch, and the public cuda::gemm_bf16_dw.
// dw starts nonzero (with NaN / inf among its values); dy and x hold ±0, subnormals and rare
// inf / NaN. Fresh seed each run (printed; pass a number to repeat one). --quick: small sizes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "cuda/gemm/internal.h"  // gemm_bf16_tn_accumulate, gemm_tn_problem
#include "cuda/gemm/plan.h"      // gemm_legal_plans
#include "cuda/gpu_harness.h"
#include "lockstep/contract/backward.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/ops/backward.h"

using namespace lockstep;
using namespace lockstep::gpu_test;

namespace {

uint16_t random_bf16(std::mt19937_64& g) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double r = u(g);
  if (r < 0.02) return 0x0000;
  if (r < 0.04) return 0x8000;
  if (r < 0.05) return uint16_t(1 + g() % 127);  // subnormal
  if (r < 0.0502) return 0x7F80;                 // inf (rare: most chains stay finite)
  if (r < 0.0503) return 0x7FC1;                 // NaN
  // N(0, 1)-like: random sign, exponent 2^-3 .. 2^2, random mantissa
  return uint16_t(((g() & 1) << 15) | ((124 + g() % 6) << 7) | (g() & 0x7F));
}

struct Case {
  int64_t N, K;
  std::vector<int64_t> lens;
};

void run_case(const Case& c) {
  std::mt19937_64 g(g_rng());
  const int64_t N = c.N, K = c.K;
  // Packed rows: sequences in reverse step order with a garbage row before each.
  std::vector<TokenSeq> seqs;
  int64_t rows = 0;
  for (size_t i = c.lens.size(); i-- > 0;) {
    rows += 1;
    seqs.push_back(TokenSeq{int64_t(i), rows, c.lens[i]});
    rows += c.lens[i];
  }
  std::vector<uint16_t> dy(size_t(rows * N)), x(size_t(rows * K));
  for (auto& v : dy) v = random_bf16(g);
  for (auto& v : x) v = random_bf16(g);
  std::vector<float> dw0(size_t(N * K));
  for (auto& v : dw0) v = float(int64_t(g() % 2001) - 1000) / 256.0f;
  dw0[0] = std::numeric_limits<float>::quiet_NaN();
  if (dw0.size() > 3) dw0[3] = -std::numeric_limits<float>::infinity();
  const TokenOrder order = TokenOrder::make("test_gemm_bwd_plans", seqs, rows);

  // CPU reference.
  std::vector<float> ref = dw0;
  cpu::gemm_bf16_dw(TensorView::contiguous(dy.data(), DType::kBF16, {rows, N}),
                    TensorView::contiguous(x.data(), DType::kBF16, {rows, K}), order,
                    TensorView::contiguous(ref.data(), DType::kF32, {N, K}));

  // Host gather (canonical slots), K-major over the tokens, row stride ld.
  std::vector<int64_t> slots;
  for (const TokenSeq& q : order.seqs())
    for (int64_t p = 0; p < q.len; p += kTokenBlock)
      for (int64_t i = 0; i < kTokenBlock; ++i) slots.push_back(p + i < q.len ? q.row + p + i : -1);
  const int64_t Tc = int64_t(slots.size());
  const std::string name =
      "N" + std::to_string(N) + " K" + std::to_string(K) + " slots " + std::to_string(Tc);
  auto gather = [&](const std::vector<uint16_t>& m, int64_t cols, int64_t ld) {
    std::vector<uint16_t> o(size_t(cols * ld), 0xFFFF);  // columns past Tc: NaN, never read
    for (int64_t col = 0; col < cols; ++col)
      for (int64_t t = 0; t < Tc; ++t)
        o[size_t(col * ld + t)] =
            slots[size_t(t)] < 0 ? uint16_t(0) : m[size_t(slots[size_t(t)] * cols + col)];
    return o;
  };
  for (int64_t pad : {int64_t(0), int64_t(1)}) {
    const int64_t ld = Tc + pad;
    DevPool pool;
    const std::vector<uint16_t> a = gather(dy, N, ld), b = gather(x, K, ld);
    auto* da = static_cast<uint16_t*>(pool.upload(a.data(), a.size() * 2));
    auto* db = static_cast<uint16_t*>(pool.upload(b.data(), b.size() * 2));
    auto* dw = static_cast<float*>(pool.alloc(dw0.size() * 4));
    const cuda::GemmProblem q = cuda::detail::gemm_tn_problem(da, ld, db, ld, N, K, Tc);
    // (One-row operands need no row stride.)
    report(q.tma_ok == (pad == 0 || (N <= 1 && K <= 1)),
           name + ": TMA-readable iff the row stride is Tc");
    const std::vector<cuda::GemmPlan> plans = cuda::gemm_legal_plans(q);
    report(plans.size() == (q.tma_ok ? 5u : 2u), name + ": legal TN plans");
    for (const cuda::GemmPlan& pl : plans) {
      const std::string what = name + " ld " + std::to_string(ld) + " [" + pl.to_string() + "]";
      CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
      cuda::detail::gemm_bf16_tn_accumulate(da, ld, db, ld, N, K, Tc, dw, K, &pl);
      CK(cudaGetLastError());
      const std::vector<uint8_t> got = download(dw, dw0.size() * 4);
      bitwise(what, got.data(), ref.data(), dw0.size(), 4);
    }
    // The chain over two launches (slots split at a block boundary) == one, the planner's plans.
    const int64_t half = (Tc / kTokenBlock / 2) * kTokenBlock;
    if (half > 0 && pad == 0) {
      // The second launch reads columns [half, Tc): operands starting there (16-byte aligned).
      CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
      cuda::detail::gemm_bf16_tn_accumulate(da, ld, db, ld, N, K, half, dw, K, nullptr);
      cuda::detail::gemm_bf16_tn_accumulate(da + half, ld, db + half, ld, N, K, Tc - half, dw, K,
                                            nullptr);
      CK(cudaGetLastError());
      const std::vector<uint8_t> two = download(dw, dw0.size() * 4);
      bitwise(name + " in two launches", two.data(), ref.data(), dw0.size(), 4);
    }
  }
  // The public op.
  {
    DevPool pool;
    void* ddy = pool.upload(dy.data(), dy.size() * 2);
    void* dx = pool.upload(x.data(), x.size() * 2);
    void* ddw = pool.upload(dw0.data(), dw0.size() * 4);
    cuda::gemm_bf16_dw(view(ddy, DType::kBF16, {rows, N}), view(dx, DType::kBF16, {rows, K}), order,
                       view(ddw, DType::kF32, {N, K}));
    CK(cudaGetLastError());
    const std::vector<uint8_t> got = download(ddw, dw0.size() * 4);
    bitwise(name + " cuda::gemm_bf16_dw", got.data(), ref.data(), dw0.size(), 4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!start("test_gemm_bwd_plans", argc, argv)) return 2;
  std::vector<Case> cases = {
      {1, 1, {1}},        {3, 17, {5, 16, 1}},       {17, 111, {40, 3, 33}},
      {64, 64, {64, 64}}, {130, 136, {100, 7, 200}}, {257, 300, {31, 17, 500, 16}}};
  if (!g_quick) {
    cases.push_back({1024, 512, {700, 300, 1100}});
    cases.push_back({4096, 256, {1000, 24}});
  }
  for (const Case& c : cases)
    section("tn N" + std::to_string(c.N) + " K" + std::to_string(c.K), [&] { run_case(c); });
  return finish("test_gemm_bwd_plans");
}
