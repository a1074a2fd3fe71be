// The NCCL transport (src/dist/nccl) on real GPUs: one rank per visible GPU (threads, rank r on
// cuda device r, the thread transport as the bootstrap), for 1, 2, 3, 4, 8 and all ranks that fit.
// all_gather and broadcast move the senders' bytes exactly (random bf16 / f32 bit patterns with
// NaN payloads and other special values, empty to 4 MB, in place, from every root); barrier
// orders; what the legacy default stream wrote before a call is what it sends; argument errors (a
// cross-rank shape / root / op mismatch, a bad recv on one rank, a host view, host or another
// device's memory) throw on every rank at once and break the job; a rank that never calls makes
// the others time out naming the op and the rank; all-gathered row-parallel fp32 partials combined
// on every rank by the CUDA gemm_combine give the CPU's in-process combine and tp = 1 bits
// (docs/contract.md §G.5). With one visible GPU only the 1-rank cases run, and the summary line
// says that the multi-rank ones did not. Harness: cuda/gpu_harness.h (exit 1 on any failure, 2
// without a GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/gpu_harness.h"
#include "dist/nccl/nccl_transport.h"
#include "dist/thread_transport.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/gemm.h"
#include "util/rank_errors.h"

namespace lockstep {
namespace {

using dist::CommOptions;
using dist::Communicator;
using gpu_test::report;
using Bytes = std::vector<uint8_t>;

int g_gpus = 0;

CommOptions timeout_ms(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs body(comm) on n ranks, rank r a thread on cuda device r with an NCCL communicator
// bootstrapped through the thread transport; rethrows the first rank's exception.
void on_ranks(int n, const std::function<void(Communicator&)>& body,
              const CommOptions& options = {}) {
  dist::run_ranks(n, [&](Communicator& boot) {
    CK(cudaSetDevice(boot.rank()));
    std::unique_ptr<Communicator> comm = dist::make_nccl_communicator(boot, boot.rank(), options);
    body(*comm);
  });
}

// Each rank's Error message ("" for a rank that did not throw).
std::vector<std::string> rank_errors(int n, const std::function<void(Communicator&)>& body,
                                     const CommOptions& options = {}) {
  return test::rank_errors(
      [&](int k, const std::function<void(Communicator&)>& b) { on_ranks(k, b, options); }, n,
      body);
}

void expect_mentions(const std::string& what, const std::string& error, const std::string& needle) {
  const bool ok = error.find(needle) != std::string::npos;
  report(ok, what);
  if (!ok) std::printf("  message '%s' lacks '%s'\n", error.c_str(), needle.c_str());
}

void expect_all_mention(const std::string& what, const std::vector<std::string>& errors,
                        const std::string& needle) {
  for (size_t r = 0; r < errors.size(); ++r)
    expect_mentions(what + ": rank " + std::to_string(r), errors[r], needle);
}

// Random bit patterns (every class: NaNs with payloads, infinities, subnormals), the special
// values of kSpecialF32 / kSpecialBf16 first, rotated by `salt`.
Bytes random_bits(DType dt, int64_t numel, uint64_t salt) {
  static const uint32_t kSpecialF32[] = {0x7F800001u, 0xFFC12345u, 0x7FFFFFFFu, 0x80000000u,
                                         0x7F800000u, 0x00000001u, 0xFF800000u, 0x7FC00000u};
  static const uint16_t kSpecialBf16[] = {0x7F81, 0xFFFF, 0xFFC1, 0x8000, 0x0001, 0x7F80};
  const size_t es = size_t(dtype_size(dt));
  Bytes b(size_t(numel) * es);
  for (uint8_t& x : b) x = uint8_t(gpu_test::g_rng());
  for (int64_t i = 0; i < numel && i < 8; ++i) {
    if (dt == DType::kF32) {
      std::memcpy(&b[size_t(i) * 4], &kSpecialF32[(size_t(i) + salt) % 8], 4);
    } else {
      std::memcpy(&b[size_t(i) * 2], &kSpecialBf16[(size_t(i) + salt) % 6], 2);
    }
  }
  return b;
}

Bytes concat(const std::vector<Bytes>& parts) {
  Bytes all;
  for (const Bytes& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

void check_bytes(const std::string& what, const Bytes& got, const Bytes& want, DType dt) {
  if (got.size() != want.size()) {
    report(false, what + ": " + std::to_string(got.size()) + " bytes, expected " +
                      std::to_string(want.size()));
    return;
  }
  const size_t es = size_t(dtype_size(dt));
  gpu_test::bitwise(what, got.data(), want.data(), got.size() / es, es);
}

// --- cases that share one communicator per rank count ---

// A case: `run` on every rank (in its thread, writing only that rank's results), `check` on the
// main thread afterwards. One NCCL communicator per rank count runs them all, in order.
struct RankCase {
  std::function<void(Communicator&)> run;
  std::function<void()> check;
};

void add_all_gather(std::vector<RankCase>& cases, int n, DType dt, std::vector<int64_t> shape) {
  const int64_t numel = numel_of(shape);
  auto send = std::make_shared<std::vector<Bytes>>();
  auto got = std::make_shared<std::vector<Bytes>>(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) send->push_back(random_bits(dt, numel, uint64_t(r)));
  std::vector<int64_t> recv_shape = shape;
  recv_shape.insert(recv_shape.begin(), n);
  const std::string what = "all_gather n=" + std::to_string(n) + " " + dtype_name(dt) + " " +
                           std::to_string(numel) + " elements: rank ";
  cases.push_back({[=](Communicator& c) {
                     const size_t r = size_t(c.rank()), bytes = (*send)[r].size();
                     gpu_test::DevPool pool;
                     void* s = pool.upload((*send)[r].data(), bytes);
                     void* v = pool.alloc(bytes * size_t(n));  // poisoned
                     c.all_gather(gpu_test::view(s, dt, shape), gpu_test::view(v, dt, recv_shape));
                     (*got)[r] = gpu_test::download(v, bytes * size_t(n));
                   },
                   [=] {
                     const Bytes want = concat(*send);
                     for (int r = 0; r < n; ++r)
                       check_bytes(what + std::to_string(r), (*got)[size_t(r)], want, dt);
                   }});
}

// In place (send is recv[rank]), three rounds on the same buffer.
void add_all_gather_in_place(std::vector<RankCase>& cases, int n) {
  const int64_t len = 1025;
  auto rounds = std::make_shared<std::vector<Bytes>>();
  auto got = std::make_shared<std::vector<std::vector<Bytes>>>(static_cast<size_t>(n));
  for (int i = 0; i < 3; ++i) rounds->push_back(random_bits(DType::kF32, n * len, uint64_t(i)));
  cases.push_back({[=](Communicator& c) {
                     const int r = c.rank();
                     gpu_test::DevPool pool;
                     auto* buf = static_cast<char*>(pool.alloc(size_t(n * len) * 4));
                     char* slot = buf + size_t(r * len) * 4;
                     for (const Bytes& round : *rounds) {
                       CK(cudaMemcpy(slot, round.data() + size_t(r * len) * 4, size_t(len) * 4,
                                     cudaMemcpyHostToDevice));
                       c.all_gather(gpu_test::view(slot, DType::kF32, {len}),
                                    gpu_test::view(buf, DType::kF32, {n, len}));
                       (*got)[size_t(r)].push_back(gpu_test::download(buf, size_t(n * len) * 4));
                     }
                   },
                   [=] {
                     for (int r = 0; r < n; ++r)
                       for (size_t i = 0; i < rounds->size(); ++i)
                         check_bytes("all_gather in place n=" + std::to_string(n) + " round " +
                                         std::to_string(i) + ": rank " + std::to_string(r),
                                     (*got)[size_t(r)][i], (*rounds)[i], DType::kF32);
                   }});
}

void add_broadcast(std::vector<RankCase>& cases, int n, DType dt, std::vector<int64_t> shape,
                   int root) {
  auto before = std::make_shared<std::vector<Bytes>>();
  auto got = std::make_shared<std::vector<Bytes>>(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) before->push_back(random_bits(dt, numel_of(shape), uint64_t(r)));
  const std::string what = "broadcast n=" + std::to_string(n) + " " + dtype_name(dt) + " " +
                           std::to_string(numel_of(shape)) + " elements root " +
                           std::to_string(root) + ": rank ";
  cases.push_back({[=](Communicator& c) {
                     const size_t r = size_t(c.rank());
                     gpu_test::DevPool pool;
                     void* b = pool.upload((*before)[r].data(), (*before)[r].size());
                     c.broadcast(gpu_test::view(b, dt, shape), root);
                     (*got)[r] = gpu_test::download(b, (*before)[r].size());
                   },
                   [=] {
                     for (int r = 0; r < n; ++r)
                       check_bytes(what + std::to_string(r), (*got)[size_t(r)],
                                   (*before)[size_t(root)], dt);
                   }});
}

void add_barrier(std::vector<RankCase>& cases, int n) {
  const int rounds = gpu_test::g_quick ? 20 : 200;
  auto slots = std::make_shared<std::vector<std::atomic<int>>>(static_cast<size_t>(n));
  auto wrong = std::make_shared<std::atomic<int>>(0);
  for (auto& s : *slots) s = -1;
  cases.push_back({[=](Communicator& c) {
                     for (int i = 0; i < rounds; ++i) {
                       (*slots)[size_t(c.rank())] = i * n + c.rank();
                       c.barrier();
                       for (int r = 0; r < n; ++r)
                         if ((*slots)[size_t(r)] != i * n + r) wrong->fetch_add(1);
                       c.barrier();  // every rank has read round i before any writes round i + 1
                     }
                   },
                   [=] {
                     report(wrong->load() == 0,
                            "barrier n=" + std::to_string(n) + ": " + std::to_string(rounds) +
                                " rounds, every rank saw every rank's write (" +
                                std::to_string(wrong->load()) + " stale reads)");
                   }});
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// A call starts after the work issued before it on the legacy default stream: a ~20 ms spin, then
// a memset of the send buffer, both unsynchronized when all_gather is called.
void add_stream_order(std::vector<RankCase>& cases, int n) {
  const size_t bytes = size_t(8) << 20;
  auto got = std::make_shared<std::vector<Bytes>>(static_cast<size_t>(n));
  cases.push_back({[=](Communicator& c) {
                     const int r = c.rank();
                     gpu_test::DevPool pool;
                     void* s = pool.alloc(bytes);  // poisoned
                     void* v = pool.alloc(bytes * size_t(n));
                     CK(cudaDeviceSynchronize());
                     spin_kernel<<<1, 1>>>(40'000'000);
                     CK(cudaGetLastError());
                     CK(cudaMemsetAsync(s, 0x10 + r, bytes, nullptr));
                     c.all_gather(gpu_test::view(s, DType::kU8, {int64_t(bytes)}),
                                  gpu_test::view(v, DType::kU8, {n, int64_t(bytes)}));
                     (*got)[size_t(r)] = gpu_test::download(v, bytes * size_t(n));
                   },
                   [=] {
                     Bytes want;
                     for (int r = 0; r < n; ++r) want.insert(want.end(), bytes, uint8_t(0x10 + r));
                     for (int r = 0; r < n; ++r)
                       check_bytes("all_gather n=" + std::to_string(n) +
                                       " after unsynchronized legacy-stream work: rank " +
                                       std::to_string(r),
                                   (*got)[size_t(r)], want, DType::kU8);
                   }});
}

// Columns [c0, c1) of a row-major matrix view (rows keep their stride).
TensorView cols(const TensorView& m, int64_t c0, int64_t c1) {
  TensorView v = m;
  v.data = static_cast<char*>(m.data) + c0 * dtype_size(m.dtype);
  v.shape[1] = c1 - c0;
  return v;
}

Tensor random_bf16_values(int64_t rows, int64_t cols_n) {
  Tensor t(DType::kBF16, {rows, cols_n});
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < rows * cols_n; ++i) t.ptr<bf16>()[i] = f32_to_bf16(u(gpu_test::g_rng));
  return t;
}

// t ranks (a power of two <= S = 8): each rank's fp32 partial over its K range (§G.5) on its GPU,
// written into recv[rank] and all-gathered in place, combined by the CUDA gemm_tree_combine (the
// CUDA backends' gemm_combine) on every rank == the CPU's in-process combine of the same partials
// == the CPU's tp = 1 GEMM (t divides S: identical bits).
void add_combine(std::vector<RankCase>& cases, int t, int64_t M, int64_t N, int64_t K, DType out) {
  const GemmConfig cfg{8};
  auto x = std::make_shared<Tensor>(random_bf16_values(M, K));
  auto w = std::make_shared<Tensor>(random_bf16_values(N, K));
  auto tp1 = std::make_shared<Tensor>(out, std::vector<int64_t>{M, N});
  auto simulated = std::make_shared<Tensor>(out, std::vector<int64_t>{M, N});
  cpu::gemm_bf16_nt(x->view(), w->view(), cfg, tp1->view());
  std::vector<Tensor> partials;
  std::vector<TensorView> views;
  for (int r = 0; r < t; ++r) {
    const GemmKRange k = gemm_tp_k_range(cfg, K, t, r);
    partials.push_back(Tensor(DType::kF32, {M, N}));
    cpu::gemm_bf16_nt_partial(cols(x->view(), k.begin, k.end), cols(w->view(), k.begin, k.end), K,
                              t, r, cfg, partials.back().view());
    views.push_back(partials.back().view());
  }
  cpu::gemm_tree_combine(views, nullptr, simulated->view());
  const size_t es = size_t(dtype_size(out)), mn = size_t(M * N);
  auto y = std::make_shared<std::vector<Bytes>>(static_cast<size_t>(t));
  cases.push_back(
      {[=](Communicator& c) {
         const int r = c.rank();
         gpu_test::DevPool pool;
         void* dx = pool.upload(x->data(), size_t(x->nbytes()));
         void* dw = pool.upload(w->data(), size_t(w->nbytes()));
         auto* all = static_cast<float*>(pool.alloc(size_t(t) * mn * 4));
         float* mine = all + size_t(r) * mn;
         void* dy = pool.alloc(mn * es);
         const GemmKRange k = gemm_tp_k_range(cfg, K, t, r);
         cuda::gemm_bf16_nt_partial(cols(gpu_test::view(dx, DType::kBF16, {M, K}), k.begin, k.end),
                                    cols(gpu_test::view(dw, DType::kBF16, {N, K}), k.begin, k.end),
                                    K, t, r, cfg, gpu_test::view(mine, DType::kF32, {M, N}));
         c.all_gather(gpu_test::view(mine, DType::kF32, {M, N}),
                      gpu_test::view(all, DType::kF32, {t, M, N}));
         std::vector<TensorView> gathered;
         for (int q = 0; q < t; ++q)
           gathered.push_back(gpu_test::view(all + size_t(q) * mn, DType::kF32, {M, N}));
         cuda::gemm_tree_combine(gathered, nullptr, gpu_test::view(dy, out, {M, N}));
         (*y)[size_t(r)] = gpu_test::download(dy, mn * es);
       },
       [=] {
         for (int r = 0; r < t; ++r) {
           const std::string what = "combine t=" + std::to_string(t) + " M=" + std::to_string(M) +
                                    " N=" + std::to_string(N) + " K=" + std::to_string(K) + " " +
                                    dtype_name(out) + ": rank " + std::to_string(r);
           gpu_test::bitwise(what + " == CPU in-process combine", (*y)[size_t(r)].data(),
                             simulated->data(), mn, es);
           gpu_test::bitwise(what + " == CPU tp=1", (*y)[size_t(r)].data(), tp1->data(), mn, es);
         }
       }});
}

// Every case that leaves the job intact, on n ranks, over one communicator.
void shared_cases(int n) {
  std::vector<RankCase> cases;
  std::vector<std::vector<int64_t>> shapes = {{3, 17}, {1}, {0, 5}, {2, 3, 4}};
  if (!gpu_test::g_quick) shapes.push_back({989, 1111});  // 4.4 MB (f32) per rank
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (const std::vector<int64_t>& shape : shapes) add_all_gather(cases, n, dt, shape);
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5, 7}, {1}, {333, 1025}})
      for (int root = 0; root < n; ++root) add_broadcast(cases, n, dt, shape, root);
  }
  add_all_gather_in_place(cases, n);
  add_barrier(cases, n);
  add_stream_order(cases, n);
  if ((n & (n - 1)) == 0 && n <= 8)
    for (DType out : {DType::kBF16, DType::kF32}) {
      add_combine(cases, n, 5, 7, 111, out);
      add_combine(cases, n, 5, 7, 17, out);  // every rank past the second owns only padding
      add_combine(cases, n, 33, 130, 1000, out);
    }
  on_ranks(n, [&](Communicator& c) {
    for (const RankCase& k : cases) k.run(c);
  });
  for (const RankCase& k : cases) k.check();
}

// --- errors ---

// 1 rank: a host view, host memory marked as a CUDA view; then the job is broken.
void local_error_cases() {
  std::vector<std::string> errors = rank_errors(1, [](Communicator& c) {
    Tensor host(DType::kF32, {4});
    try {
      c.broadcast(host.view(), 0);
    } catch (const Error& e) {
      expect_mentions("host view", e.what(),
                      "broadcast: rank 0: buf: the nccl transport moves cuda memory only, got a "
                      "cpu view");
    }
    c.barrier();
  });
  expect_mentions("after an error every call throws", errors[0],
                  "barrier: rank 0: the job is broken by an earlier error: broadcast: rank 0: buf");
  std::vector<float> host(16);
  errors = rank_errors(1, [&](Communicator& c) {
    c.all_gather(TensorView::contiguous(host.data(), DType::kF32, {16}, Device::kCUDA),
                 TensorView::contiguous(host.data(), DType::kF32, {1, 16}, Device::kCUDA));
  });
  expect_mentions("host memory in a cuda view", errors[0],
                  "all_gather: rank 0: send: the nccl transport moves device memory only, but");
  errors = rank_errors(1, [](Communicator& c) {
    gpu_test::DevPool pool;
    void* p = pool.alloc(64);
    c.all_gather(gpu_test::view(p, DType::kF32, {2, 8}), gpu_test::view(p, DType::kF32, {1, 8}));
  });
  expect_mentions("recv of the wrong shape", errors[0],
                  "all_gather: rank 0: recv: expected f32[1, 2, 8]");
  std::string bad_device;
  try {
    dist::run_ranks(1, [](Communicator& boot) { dist::make_nccl_communicator(boot, g_gpus); });
  } catch (const Error& e) {
    bad_device = e.what();
  }
  expect_mentions("a device that does not exist", bad_device, "cuda_device: expected in [0, ");
}

// n >= 2 ranks, a fresh communicator for each (an error breaks the job).
void cross_rank_error_cases(int n) {
  const int last = n - 1;
  const CommOptions opts = timeout_ms(20'000);
  std::vector<double> call_s(static_cast<size_t>(n));
  auto gather = [&](int64_t last_cols, DType last_dtype) {
    return [&, last_cols, last_dtype](Communicator& c) {
      const bool odd = c.rank() == last;
      const int64_t w = odd ? last_cols : 4;
      const DType dt = odd ? last_dtype : DType::kF32;
      gpu_test::DevPool pool;
      void* s = pool.alloc(size_t(4 * w * dtype_size(dt)));
      void* v = pool.alloc(size_t(n * 4 * w * dtype_size(dt)));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.all_gather(gpu_test::view(s, dt, {4, w}), gpu_test::view(v, dt, {n, 4, w}));
      } catch (const Error&) {
        call_s[size_t(c.rank())] = seconds_since(t0);
        throw;
      }
    };
  };
  const std::string tag = "n=" + std::to_string(n) + " ";
  expect_all_mention(tag + "shape mismatch", rank_errors(n, gather(5, DType::kF32), opts),
                     "all_gather: ranks disagree on send: rank 0 has f32[4, 4], rank " +
                         std::to_string(last) + " has f32[4, 5]");
  for (int r = 0; r < n; ++r)
    report(call_s[size_t(r)] < 5.0, tag + "shape mismatch thrown at once (" +
                                        std::to_string(call_s[size_t(r)]) + " s, timeout 20 s)");
  expect_all_mention(tag + "dtype mismatch", rank_errors(n, gather(4, DType::kBF16), opts),
                     "rank " + std::to_string(last) + " has bf16[4, 4]");
  expect_all_mention(tag + "root mismatch",
                     rank_errors(
                         n,
                         [](Communicator& c) {
                           gpu_test::DevPool pool;
                           c.broadcast(gpu_test::view(pool.alloc(4), DType::kF32, {1}),
                                       c.rank() == 1 ? 1 : 0);
                         },
                         opts),
                     "ranks disagree on root: rank 0 has 0, rank 1 has 1");
  expect_all_mention(tag + "op mismatch",
                     rank_errors(
                         n,
                         [](Communicator& c) {
                           if (c.rank() == 1) return c.barrier();
                           gpu_test::DevPool pool;
                           c.broadcast(gpu_test::view(pool.alloc(4), DType::kF32, {1}), 0);
                         },
                         opts),
                     "rank 0 called broadcast, rank 1 called barrier");
  // After an error the job is broken: later calls throw too.
  expect_all_mention(tag + "after a mismatch every call throws",
                     rank_errors(
                         n,
                         [&](Communicator& c) {
                           try {
                             gather(5, DType::kF32)(c);
                           } catch (const Error&) {
                           }
                           c.barrier();
                         },
                         opts),
                     "the job is broken by an earlier error: all_gather: ranks disagree");
  // One rank's bad recv: it says what was expected, the others that it failed, all at once.
  std::vector<std::string> errors = rank_errors(
      n,
      [&](Communicator& c) {
        gpu_test::DevPool pool;
        const int64_t rows = c.rank() == 1 ? n + 1 : n;
        c.all_gather(gpu_test::view(pool.alloc(12), DType::kBF16, {2, 3}),
                     gpu_test::view(pool.alloc(size_t(rows) * 12), DType::kBF16, {rows, 2, 3}));
      },
      opts);
  expect_mentions(tag + "bad recv: rank 1", errors[1],
                  "all_gather: rank 1: recv: expected bf16[" + std::to_string(n) + ", 2, 3]");
  for (int r = 0; r < n; ++r)
    if (r != 1)
      expect_mentions(tag + "bad recv: rank " + std::to_string(r), errors[size_t(r)],
                      "rank 1 failed: all_gather: rank 1: recv: expected");
  // Rank 0's buffer on device 1.
  errors = rank_errors(
      n,
      [](Communicator& c) {
        gpu_test::DevPool pool;
        void* p = nullptr;
        if (c.rank() == 0) {
          CK(cudaSetDevice(1));
          p = pool.alloc(64);
          CK(cudaSetDevice(0));
        } else {
          p = pool.alloc(64);
        }
        c.broadcast(gpu_test::view(p, DType::kF32, {16}), 0);
      },
      opts);
  expect_mentions(tag + "another device's memory: rank 0", errors[0],
                  "broadcast: rank 0: buf: f32[16] is memory of cuda device 1, this rank's "
                  "communicator runs on cuda device 0");
  for (int r = 1; r < n; ++r)
    expect_mentions(tag + "another device's memory: rank " + std::to_string(r), errors[size_t(r)],
                    "rank 0 failed: broadcast: rank 0: buf:");
}

// Rank 1 never calls (it sleeps past the timeout, then returns): the others time out, naming the
// op and themselves, within the timeout plus slack, and stay broken.
void hang_case(int n) {
  const int ms = 5000;
  std::vector<double> call_s(static_cast<size_t>(n));
  std::vector<std::string> later(static_cast<size_t>(n));
  std::vector<std::string> errors = rank_errors(
      n,
      [&](Communicator& c) {
        if (c.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms + 2000));
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        try {
          c.barrier();
        } catch (const Error&) {
          call_s[size_t(c.rank())] = seconds_since(t0);
          try {
            c.barrier();
          } catch (const Error& e) {
            later[size_t(c.rank())] = e.what();
          }
          throw;
        }
      },
      timeout_ms(ms));
  const std::string tag = "n=" + std::to_string(n) + " rank 1 never calls: ";
  report(errors[1].empty(), tag + "rank 1 itself saw no error");
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    const std::string rs = "rank " + std::to_string(r);
    expect_mentions(tag + rs, errors[size_t(r)],
                    "barrier: " + rs +
                        " timed out after 5000 ms while exchanging the ranks' call "
                        "descriptors");
    const double s = call_s[size_t(r)];
    report(s >= 4.9 && s < 8.0,
           tag + rs + " threw after " + std::to_string(s) + " s (timeout 5 s)");
    expect_mentions(tag + rs + " stays broken", later[size_t(r)],
                    "the job is broken by an earlier error: barrier: " + rs + " timed out");
  }
}

std::vector<int> rank_counts() {
  std::vector<int> n;
  for (int c : {1, 2, 3, 4, 8})
    if (c <= g_gpus && (!gpu_test::g_quick || c == 1 || c == 2)) n.push_back(c);
  if (std::find(n.begin(), n.end(), g_gpus) == n.end()) n.push_back(g_gpus);
  return n;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep;
  if (!gpu_test::start("test_dist_nccl", argc, argv)) return 2;
  CK(cudaGetDeviceCount(&g_gpus));
  std::printf("test_dist_nccl: %d visible GPU(s), %s\n", g_gpus, dist::nccl_version().c_str());
  for (int n : rank_counts())
    gpu_test::section("bytes and combine n=" + std::to_string(n), [&] { shared_cases(n); });
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  report(nvls != nullptr && std::string(nvls) == "0",
         "NCCL_NVLS_ENABLE=0 after the first communicator");
  gpu_test::section("errors n=1", [] { local_error_cases(); });
  if (g_gpus >= 2) {
    gpu_test::section("errors n=" + std::to_string(g_gpus), [] { cross_rank_error_cases(g_gpus); });
    gpu_test::section("timeout n=" + std::to_string(g_gpus), [] { hang_case(g_gpus); });
  }
  std::string label = "test_dist_nccl, ranks";
  for (int n : rank_counts()) label += " " + std::to_string(n);
  if (g_gpus < 2) {
    std::printf(
        "test_dist_nccl: only %d GPU visible: the multi-rank cases (2+ ranks: every cross-rank "
        "exchange, mismatch and timeout) were NOT run\n",
        g_gpus);
    label += "; 1 GPU: multi-rank cases NOT run";
  }
  return gpu_test::finish(label.c_str());
}
