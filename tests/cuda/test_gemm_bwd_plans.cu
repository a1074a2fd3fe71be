// GPU parity of the GEMM backward layouts with the CPU, bit for bit (docs/contract.md §B.3), for
// EVERY legal plan, not only the one the planner picks (which test_parity's op-case rows reach
// through cuda::gemm_bf16_dw / gemm_bf16_dx):
//   tn (dW, accumulate mode): detail::gemm_bf16_tn_accumulate with each of gemm_legal_plans (the
//     wgmma job tiles 128x256 / 128x128 / 64x128 and the 64x256 ping-pong tile) vs
//     cpu::gemm_bf16_dw. The operands are gathered on the host exactly as the op's row gather does
//     (canonical token slots, zeros past a sequence's end): token-major dy [Tc, N] and x [Tc, K],
//     rows N / K rounded up to 8 apart, or 8 more (strided); the blocked form (full token blocks
//     read in place from the packed operands, garbage rows between sequences, partial blocks from
//     a zero-padded tail buffer) with each plan. Also: the chain continued over two
//     launches (the slots split at a block boundary) == one launch, and the public
//     cuda::gemm_bf16_dw (gathered and in-place chunks). dw starts nonzero (with NaN / inf among
//     its values); dy and x hold ±0, subnormals and rare inf / NaN.
//   nn (dX, w read in place): detail::gemm_bf16_nn / _partial with each legal plan vs
//     cpu::gemm_bf16_dx / _partial, S = 1, 2, 4, 8, dx f32 and bf16, strided w rows.
//   nn accumulate (the log-prob backward's dh): detail::gemm_bf16_nn_accumulate on the gathered
//     dy transposed (K-major) with each legal plan vs cpu::gemm_bf16_dw (the same chain).
//   at scale, GPU against GPU: the ping-pong kernel (y through TMA, and by scalar loads) with many
//     jobs per warpgroup, chains over several launches, y over 2 GiB, against the 128x256 tile.
// Fresh seed each run (printed; pass a number to repeat one). --quick: small sizes.
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
#include "cuda/gemm/internal.h"  // gemm_bf16_{tn,nn}_accumulate, gemm_{tn,nn_accumulate}_problem
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

  // Host gather (canonical slots), token-major, row stride ld.
  std::vector<int64_t> slots;
  for (const TokenSeq& q : order.seqs())
    for (int64_t p = 0; p < q.len; p += kTokenBlock)
      for (int64_t i = 0; i < kTokenBlock; ++i) slots.push_back(p + i < q.len ? q.row + p + i : -1);
  const int64_t Tc = int64_t(slots.size());
  const std::string name =
      "N" + std::to_string(N) + " K" + std::to_string(K) + " slots " + std::to_string(Tc);
  auto gather = [&](const std::vector<uint16_t>& m, int64_t cols, int64_t ld) {
    std::vector<uint16_t> o(size_t(Tc * ld), 0xFFFF);  // columns past cols: NaN, never read
    for (int64_t t = 0; t < Tc; ++t)
      for (int64_t col = 0; col < cols; ++col)
        o[size_t(t * ld + col)] =
            slots[size_t(t)] < 0 ? uint16_t(0) : m[size_t(slots[size_t(t)] * cols + col)];
    return o;
  };
  auto ld8 = [](int64_t n) { return (n + 7) / 8 * 8; };
  for (int64_t pad : {int64_t(0), int64_t(8)}) {
    const int64_t lda = ld8(N) + pad, ldb = ld8(K) + pad;
    DevPool pool;
    const std::vector<uint16_t> a = gather(dy, N, lda), b = gather(x, K, ldb);
    auto* da = static_cast<uint16_t*>(pool.upload(a.data(), a.size() * 2));
    auto* db = static_cast<uint16_t*>(pool.upload(b.data(), b.size() * 2));
    auto* dw = static_cast<float*>(pool.alloc(dw0.size() * 4));
    const cuda::GemmProblem q = cuda::detail::gemm_tn_problem(da, lda, db, ldb, N, K, Tc);
    report(q.tma_ok, name + ": TMA-readable");
    const std::vector<cuda::GemmPlan> plans = cuda::gemm_legal_plans(q);
    report(plans.size() == 4u, name + ": legal TN plans");
    for (const cuda::GemmPlan& pl : plans) {
      const std::string what = name + " ld +" + std::to_string(pad) + " [" + pl.to_string() + "]";
      CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
      cuda::detail::gemm_bf16_tn_accumulate(da, lda, db, ldb, N, K, Tc, dw, K, &pl);
      CK(cudaGetLastError());
      const std::vector<uint8_t> got = download(dw, dw0.size() * 4);
      bitwise(what, got.data(), ref.data(), dw0.size(), 4);
    }
    // The nn accumulate layout (the log-prob backward's dh): a K-major — the gathered dy
    // transposed, [N, Tc] with rows ld8(Tc) + pad apart and NaN past Tc (TMA's zero fill must
    // stand in) — and b as above: the same bits, with each legal plan.
    {
      const int64_t ldt = ld8(Tc) + pad;
      std::vector<uint16_t> at(size_t(N * ldt), 0xFFFF);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < Tc; ++t) at[size_t(n * ldt + t)] = a[size_t(t * lda + n)];
      auto* dat = static_cast<uint16_t*>(pool.upload(at.data(), at.size() * 2));
      const cuda::GemmProblem qn =
          cuda::detail::gemm_nn_accumulate_problem(dat, ldt, db, ldb, N, K, Tc);
      report(qn.tma_ok, name + ": nn accumulate TMA-readable");
      const std::vector<cuda::GemmPlan> nplans = cuda::gemm_legal_plans(qn);
      report(nplans.size() == 4u, name + ": legal nn accumulate plans");
      for (const cuda::GemmPlan& pl : nplans) {
        const std::string what =
            name + " nn accumulate ld +" + std::to_string(pad) + " [" + pl.to_string() + "]";
        CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
        cuda::detail::gemm_bf16_nn_accumulate(dat, ldt, db, ldb, N, K, Tc, dw, K, &pl);
        CK(cudaGetLastError());
        const std::vector<uint8_t> got = download(dw, dw0.size() * 4);
        bitwise(what, got.data(), ref.data(), dw0.size(), 4);
      }
    }
    // The chain over two launches (slots split at a block boundary) == one, the planner's plans.
    const int64_t half = (Tc / kTokenBlock / 2) * kTokenBlock;
    if (half > 0) {
      CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
      cuda::detail::gemm_bf16_tn_accumulate(da, lda, db, ldb, N, K, half, dw, K, nullptr);
      cuda::detail::gemm_bf16_tn_accumulate(da + half * lda, lda, db + half * ldb, ldb, N, K,
                                            Tc - half, dw, K, nullptr);
      CK(cudaGetLastError());
      const std::vector<uint8_t> two = download(dw, dw0.size() * 4);
      bitwise(name + " ld +" + std::to_string(pad) + " in two launches", two.data(), ref.data(),
              dw0.size(), 4);
    }
  }
  // The blocked layout (full blocks in place, partial ones from a tail buffer), each plan: the
  // packed operands copied to rows ld8 apart (garbage rows between sequences kept: never read).
  {
    const int64_t lda = ld8(N), ldb = ld8(K);
    std::vector<uint16_t> a(size_t(rows * lda), 0xFFFF), b(size_t(rows * ldb), 0xFFFF);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&a[size_t(r * lda)], &dy[size_t(r * N)], size_t(N) * 2);
      std::memcpy(&b[size_t(r * ldb)], &x[size_t(r * K)], size_t(K) * 2);
    }
    std::vector<int32_t> table;
    std::vector<int64_t> tail;  // the tail blocks' slots
    const int64_t nblocks = Tc / kTokenBlock;
    for (int64_t j = 0; j < nblocks; ++j) {
      bool full = true;
      for (int64_t i = 0; i < kTokenBlock; ++i)
        full = full && slots[size_t(j * 16 + i)] == slots[size_t(j * 16)] + i &&
               slots[size_t(j * 16)] >= 0;
      if (full) {
        table.push_back(int32_t(slots[size_t(j * 16)]));
      } else {
        table.push_back(-int32_t(tail.size() / 16) - 1);
        for (int64_t i = 0; i < kTokenBlock; ++i) tail.push_back(slots[size_t(j * 16 + i)]);
      }
    }
    table.resize(size_t(((nblocks + 3) / 4 + 1) * 4), table.empty() ? 0 : table[0]);
    const int64_t trows = int64_t(tail.size());
    std::vector<uint16_t> at(size_t(std::max<int64_t>(trows, 1) * lda), 0xFFFF),
        bt(size_t(std::max<int64_t>(trows, 1) * ldb), 0xFFFF);
    for (int64_t t = 0; t < trows; ++t)
      for (int64_t c = 0; c < N || c < K; ++c) {
        const int64_t r = tail[size_t(t)];
        if (c < N) at[size_t(t * lda + c)] = r < 0 ? uint16_t(0) : dy[size_t(r * N + c)];
        if (c < K) bt[size_t(t * ldb + c)] = r < 0 ? uint16_t(0) : x[size_t(r * K + c)];
      }
    DevPool pool;
    auto* da = static_cast<uint16_t*>(pool.upload(a.data(), a.size() * 2));
    auto* db = static_cast<uint16_t*>(pool.upload(b.data(), b.size() * 2));
    auto* dat = static_cast<uint16_t*>(pool.upload(at.data(), at.size() * 2));
    auto* dbt = static_cast<uint16_t*>(pool.upload(bt.data(), bt.size() * 2));
    auto* dtab = static_cast<int32_t*>(pool.upload(table.data(), table.size() * 4));
    auto* dw = static_cast<float*>(pool.alloc(dw0.size() * 4));
    const cuda::GemmProblem q = cuda::detail::gemm_tn_problem(da, lda, db, ldb, N, K, Tc);
    for (const cuda::GemmPlan& pl : cuda::gemm_legal_plans(q)) {
      CK(cudaMemcpy(dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
      cuda::detail::gemm_bf16_tn_accumulate_blocked(da, lda, db, ldb, rows, dat, lda, dbt, ldb,
                                                    trows, dtab, nblocks, N, K, dw, K, &pl);
      CK(cudaGetLastError());
      const std::vector<uint8_t> got = download(dw, dw0.size() * 4);
      bitwise(name + " blocked (" + std::to_string(trows / 16) + " tails) [" + pl.to_string() + "]",
              got.data(), ref.data(), dw0.size(), 4);
    }
  }
  // The public op, and the same with the blocked form off (every run row-gathered).
  for (const bool gathered : {false, true}) {
    DevPool pool;
    void* ddy = pool.upload(dy.data(), dy.size() * 2);
    void* dx = pool.upload(x.data(), x.size() * 2);
    void* ddw = pool.upload(dw0.data(), dw0.size() * 4);
    const TensorView vdy = view(ddy, DType::kBF16, {rows, N}),
                     vx = view(dx, DType::kBF16, {rows, K});
    const TensorView vdw = view(ddw, DType::kF32, {N, K});
    if (gathered) {
      cuda::detail::gemm_bf16_dw_gathered(vdy, vx, order, vdw);
    } else {
      cuda::gemm_bf16_dw(vdy, vx, order, vdw);
    }
    CK(cudaGetLastError());
    const std::vector<uint8_t> got = download(ddw, dw0.size() * 4);
    bitwise(name + (gathered ? " cuda::gemm_bf16_dw, blocked form off" : " cuda::gemm_bf16_dw"),
            got.data(), ref.data(), dw0.size(), 4);
  }
}

// dX through the nn layout, every legal plan, vs the CPU; w's rows ldw apart (>= K).
void run_nn_case(int64_t T, int64_t N, int64_t K, int64_t ldw, int S, DType dx_dtype) {
  std::mt19937_64 g(g_rng());
  std::vector<uint16_t> dy(size_t(T * N)), w(size_t(N * ldw));
  for (auto& v : dy) v = random_bf16(g);
  for (auto& v : w) v = random_bf16(g);
  const GemmConfig cfg{S};
  const size_t esz = dx_dtype == DType::kF32 ? 4 : 2;
  std::vector<uint8_t> ref(size_t(T * K) * esz);
  TensorView wv = TensorView::contiguous(w.data(), DType::kBF16, {N, K});
  wv.stride[0] = ldw;
  cpu::gemm_bf16_dx(TensorView::contiguous(dy.data(), DType::kBF16, {T, N}), wv, cfg,
                    TensorView::contiguous(ref.data(), dx_dtype, {T, K}));
  DevPool pool;
  void* ddy = pool.upload(dy.data(), dy.size() * 2);
  void* dw = pool.upload(w.data(), w.size() * 2);
  void* ddx = pool.alloc(ref.size());
  const TensorView dyv = view(ddy, DType::kBF16, {T, N});
  TensorView wd = view(dw, DType::kBF16, {N, K});
  wd.stride[0] = ldw;
  const TensorView dxv = view(ddx, dx_dtype, {T, K});
  const std::string name = "T" + std::to_string(T) + " N" + std::to_string(N) + " K" +
                           std::to_string(K) + " ldw " + std::to_string(ldw) + " S" +
                           std::to_string(S) + (dx_dtype == DType::kF32 ? " f32" : " bf16");
  const cuda::GemmProblem q = cuda::detail::gemm_nn_problem(dyv, wd, cfg);
  // TMA-readable iff both row strides are multiples of 8 (the bases are aligned here); if not, no
  // nn plan exists and the public op takes the transposed path.
  const bool tma = N % 8 == 0 && ldw % 8 == 0;
  report(q.layout == cuda::GemmLayout::kNN && q.tma_ok == tma,
         name + ": nn problem, TMA-readable iff the row strides allow it");
  if (!tma)
    expect_error(
        name + ": no nn plan", [&] { (void)cuda::gemm_legal_plans(q); }, "TMA-readable");
  for (const cuda::GemmPlan& pl : tma ? cuda::gemm_legal_plans(q) : std::vector<cuda::GemmPlan>{}) {
    CK(cudaMemset(ddx, 0xFF, ref.size()));
    cuda::detail::gemm_bf16_nn(dyv, wd, cfg, dxv, &pl);
    CK(cudaGetLastError());
    const std::vector<uint8_t> got = download(ddx, ref.size());
    bitwise(name + " [" + pl.to_string() + "]", got.data(), ref.data(), T * K, esz);
  }
  // The public op (nn for T > 64, else the transposed w).
  CK(cudaMemset(ddx, 0xFF, ref.size()));
  cuda::gemm_bf16_dx(dyv, wd, cfg, dxv);
  CK(cudaGetLastError());
  const std::vector<uint8_t> got = download(ddx, ref.size());
  bitwise(name + " cuda::gemm_bf16_dx", got.data(), ref.data(), T * K, esz);
  // TP partials: rank r's f32 partial through nn (each legal plan) == the CPU's.
  for (int t = 2; t <= S; t *= 2) {
    for (int r = 0; r < t; ++r) {
      const GemmKRange kr = gemm_tp_k_range(cfg, N, t, r);
      const int64_t nr = kr.end - kr.begin;
      if (nr <= 0) continue;
      std::vector<float> pref(size_t(T * K));
      TensorView dys = TensorView::contiguous(dy.data() + kr.begin, DType::kBF16, {T, nr});
      dys.stride[0] = N;
      TensorView ws = TensorView::contiguous(w.data() + kr.begin * ldw, DType::kBF16, {nr, K});
      ws.stride[0] = ldw;
      cpu::gemm_bf16_dx_partial(dys, ws, N, t, r, cfg,
                                TensorView::contiguous(pref.data(), DType::kF32, {T, K}));
      TensorView dysd = view(static_cast<uint16_t*>(ddy) + kr.begin, DType::kBF16, {T, nr});
      dysd.stride[0] = N;
      TensorView wsd = view(static_cast<uint16_t*>(dw) + kr.begin * ldw, DType::kBF16, {nr, K});
      wsd.stride[0] = ldw;
      void* dp = pool.alloc(pref.size() * 4);
      const TensorView pv = view(dp, DType::kF32, {T, K});
      const cuda::GemmProblem qp = cuda::detail::gemm_nn_partial_problem(dysd, wsd, N, t, cfg);
      if (!qp.tma_ok) continue;  // a shard starting off a 16-byte boundary: the transposed path
      for (const cuda::GemmPlan& pl : cuda::gemm_legal_plans(qp)) {
        CK(cudaMemset(dp, 0xFF, pref.size() * 4));
        cuda::detail::gemm_bf16_nn_partial(dysd, wsd, N, t, cfg, pv, &pl);
        CK(cudaGetLastError());
        const std::vector<uint8_t> pg = download(dp, pref.size() * 4);
        bitwise(name + " partial t" + std::to_string(t) + " r" + std::to_string(r) + " [" +
                    pl.to_string() + "]",
                pg.data(), pref.data(), T * K, 4);
      }
    }
  }
}

// --- At scale, GPU against GPU (no CPU reference: too large for it) -------------------------
// The 64x256 ping-pong kernel reads and writes y through TMA when y is 16-byte aligned with a row
// stride that is a multiple of 4 (mainloop_sm90.cuh Sm90TmaYEpilogue: four y slots per warpgroup
// for launches of at most kTnFourYSlotsMaxK token slots, one slot above), else by scalar loads and
// staged stores; the CPU cases above reach all three (the 2,100-token ones the one-slot form), but
// give each plan at most one job per consumer warpgroup and continue chains over launches only
// with the planner's tile. These give the TMA-y kernel many jobs per warpgroup, chains continued
// over several launches (also from the one-slot form into the four-slot one), and a y larger than
// 2 GiB, each against the 128x256 job tile (same bits by the contract).

__global__ void fill_f32_kernel(float* y, int64_t ld, int64_t M, int64_t N, uint64_t seed) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < M * N;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = e / N, n = e % N;
    uint64_t h = (uint64_t(e) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    y[m * ld + n] = float(int64_t(h % 2001) - 1000) / 256.0f;
  }
}
__global__ void fill_bf16_kernel(uint16_t* a, int64_t n, uint64_t seed) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(e) + seed) * 0xD6E8FEB86659FD93ull;
    h ^= h >> 31;
    // sign, exponent 2^-3 .. 2^2, mantissa (as random_bf16's common case)
    a[e] = uint16_t(((h & 1) << 15) | ((124 + (h >> 1) % 6) << 7) | ((h >> 8) & 0x7F));
  }
}
// Words of a [M, N] (rows lda apart) that differ from b (rows ldb apart), counted on the device:
// out[0] the count, out[1] the first differing element's index m·N + c (the smallest).
__global__ void count_diff_kernel(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                                  int64_t M, int64_t N, unsigned long long* out) {
  unsigned long long n = 0, first = ~0ull;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < M * N;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = e / N, c = e % N;
    if (a[m * lda + c] != b[m * ldb + c]) {
      ++n;
      first = std::min(first, (unsigned long long)e);
    }
  }
  if (n) {
    atomicAdd(out, n);
    atomicMin(out + 1, first);
  }
}

void run_scale_case(int64_t M, int64_t N, int64_t T, const std::vector<int64_t>& cuts) {
  const std::string name =
      "scale M" + std::to_string(M) + " N" + std::to_string(N) + " T" + std::to_string(T);
  const uint64_t seed = g_rng();
  DevPool pool;
  auto* a = static_cast<uint16_t*>(pool.alloc(size_t(T * M) * 2));  // dy [T, M] token-major
  auto* b = static_cast<uint16_t*>(pool.alloc(size_t(T * N) * 2));  // x [T, N]
  fill_bf16_kernel<<<1024, 256>>>(a, T * M, seed);
  fill_bf16_kernel<<<1024, 256>>>(b, T * N, seed ^ 0x5555);
  const int64_t ld_odd = N + 1;  // not a multiple of 4: the scalar form
  auto* y_ref = static_cast<float*>(pool.alloc(size_t(M * N) * 4));
  auto* y_tma = static_cast<float*>(pool.alloc(size_t(M * N) * 4));
  auto* y_cut = static_cast<float*>(pool.alloc(size_t(M * N) * 4));
  auto* y_ldg = static_cast<float*>(pool.alloc(size_t(M * ld_odd) * 4));
  auto* y_auto = static_cast<float*>(pool.alloc(size_t(M * N) * 4));
  for (float* y : {y_ref, y_tma, y_cut, y_auto}) fill_f32_kernel<<<1024, 256>>>(y, N, M, N, seed);
  fill_f32_kernel<<<1024, 256>>>(y_ldg, ld_odd, M, N, seed);
  auto* count = static_cast<unsigned long long*>(pool.alloc(16));
  CK(cudaGetLastError());
  const cuda::GemmProblem q = cuda::detail::gemm_tn_problem(a, M, b, N, M, N, T);
  cuda::GemmPlan pp{}, big{};
  bool have_pp = false, have_big = false;
  for (const cuda::GemmPlan& pl : cuda::gemm_legal_plans(q)) {
    if (pl.ping_pong) pp = pl, have_pp = true;
    if (!pl.ping_pong && pl.tile.bm == 128 && pl.tile.bn == 256) big = pl, have_big = true;
  }
  report(have_pp && have_big, name + ": the ping-pong and 128x256 TN plans are legal");
  if (!have_pp || !have_big) return;
  // The same chain in launches over the slot ranges [cuts[i], cuts[i + 1]).
  auto run = [&](float* y, int64_t ldy, const cuda::GemmPlan* pl, const std::vector<int64_t>& c) {
    for (size_t i = 0; i + 1 < c.size(); ++i)
      cuda::detail::gemm_bf16_tn_accumulate(a + c[i] * M, M, b + c[i] * N, N, M, N, c[i + 1] - c[i],
                                            y, ldy, pl);
    CK(cudaGetLastError());
  };
  const std::vector<int64_t> one = {0, T};
  run(y_ref, N, &big, one);
  run(y_tma, N, &pp, one);
  run(y_ldg, ld_odd, &pp, one);
  run(y_cut, N, &pp, cuts);
  run(y_auto, N, nullptr, cuts);
  auto same = [&](const float* y, int64_t ldy, const std::string& what) {
    const unsigned long long init[2] = {0, ~0ull};
    CK(cudaMemcpy(count, init, 16, cudaMemcpyHostToDevice));
    count_diff_kernel<<<1024, 256>>>(reinterpret_cast<const uint32_t*>(y), ldy,
                                     reinterpret_cast<const uint32_t*>(y_ref), N, M, N, count);
    unsigned long long got[2] = {0, 0};
    CK(cudaMemcpy(got, count, 16, cudaMemcpyDeviceToHost));
    std::string where;
    if (got[0]) {  // the first difference: its place (tile, box) and both values
      const int64_t m = int64_t(got[1] / uint64_t(N)), c = int64_t(got[1] % uint64_t(N));
      float va = 0, vb = 0;
      CK(cudaMemcpy(&va, y + m * ldy + c, 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&vb, y_ref + m * N + c, 4, cudaMemcpyDeviceToHost));
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "; first at row %lld col %lld (64x256 tile %lld,%lld): %a vs %a", (long long)m,
                    (long long)c, (long long)(m / 64), (long long)(c / 256), double(va),
                    double(vb));
      where = buf;
    }
    report(got[0] == 0, name + ": " + what + " == 128x256 in one launch (" +
                            std::to_string(got[0]) + " words differ" + where + ")");
  };
  same(y_tma, N, "ping-pong, y through TMA, one launch");
  same(y_ldg, ld_odd, "ping-pong, y by scalar loads (row stride N + 1), one launch");
  same(y_cut, N, "ping-pong, y through TMA, " + std::to_string(cuts.size() - 1) + " launches");
  same(y_auto, N, "the planner's tile, " + std::to_string(cuts.size() - 1) + " launches");
}

}  // namespace

int main(int argc, char** argv) {
  if (!start("test_gemm_bwd_plans", argc, argv)) return 2;
  std::vector<Case> cases = {
      {1, 1, {1}},        {3, 17, {5, 16, 1}},       {17, 111, {40, 3, 33}},
      {64, 64, {64, 64}}, {130, 136, {100, 7, 200}}, {257, 300, {31, 17, 500, 16}},
      {130, 300, {2100}}};  // > kTnFourYSlotsMaxK slots: the one-y-slot kernel, also in --quick
  if (!g_quick) {
    cases.push_back({1024, 512, {700, 300, 1100}});
    cases.push_back({4096, 256, {1000, 24}});
  }
  for (const Case& c : cases)
    section("tn N" + std::to_string(c.N) + " K" + std::to_string(c.K), [&] { run_case(c); });
  if (!g_quick) {
    // ~4 jobs per consumer warpgroup; then 144 jobs per warpgroup and a 2.5 GB y (the log-prob
    // head's dW: V = 151,936 rows of H = 4,096), chains over 3 and 11 launches.
    section("tn scale 8192x2048", [&] { run_scale_case(8192, 2048, 1000, {0, 384, 768, 1000}); });
    // One launch of 3,000 slots (one y slot per warpgroup), then 2,608 + 392 (one slot, four; a
    // chain continues over launches cut at a 16-slot block boundary only, §B.3).
    section("tn scale 8192x2048 T3000", [&] { run_scale_case(8192, 2048, 3000, {0, 2608, 3000}); });
    std::vector<int64_t> cuts;
    for (int64_t k = 0; k < 1024; k += 96) cuts.push_back(k);
    cuts.push_back(1024);
    section("tn scale 151936x4096", [&] { run_scale_case(151936, 4096, 1024, cuts); });
  }
  struct NnCase {
    int64_t T, N, K, ldw;
  };
  std::vector<NnCase> nn = {
      {65, 64, 64, 64}, {100, 333, 136, 144}, {100, 336, 136, 144}, {200, 1000, 520, 520}};
  if (!g_quick) nn.push_back({1024, 3072, 1024, 1024});
  for (const NnCase& c : nn)
    for (int S : {1, 2, 4, 8})
      for (DType dt : {DType::kF32, DType::kBF16})
        section(
            "nn T" + std::to_string(c.T) + " N" + std::to_string(c.N) + " S" + std::to_string(S),
            [&] { run_nn_case(c.T, c.N, c.K, c.ldw, S, dt); });
  return finish("test_gemm_bwd_plans");
}
