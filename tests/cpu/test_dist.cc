// The communicator's thread transport (src/dist): all_gather / broadcast move the senders' bytes
// exactly (NaN payloads too) for 1..8 ranks, barrier orders writes, a rank that fails, returns or
// hangs ends every rank's wait with a clear Error (well before the timeout where it can), argument
// mismatches throw on every rank, and all-gathered row-parallel partials combined on each rank
// give the simulated-TP bits (docs/contract.md §G.5).
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/thread_transport.h"
#include "engine/backend.h"
#include "util/rank_errors.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using dist::CommOptions;
using dist::Communicator;
using dist::run_ranks;
using test::expect_error_mentioning;

CommOptions short_timeout(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs body on n ranks; returns each rank's Error message ("" for a rank that did not throw).
std::vector<std::string> rank_errors(int n, const std::function<void(Communicator&)>& body,
                                     const CommOptions& options = {}) {
  return test::rank_errors(
      [&](int k, const std::function<void(Communicator&)>& b) { run_ranks(k, b, options); }, n,
      body);
}

void expect_all_mention(const std::vector<std::string>& errors, const std::string& needle) {
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find(needle), std::string::npos) << "rank " << r << ": " << errors[r];
}

TEST(Dist, AllGatherStacksEverySendersBytesInRankOrder) {
  auto g = test::rng(1);
  for (int n : {1, 2, 3, 4, 8}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 17}, {1}, {0, 5}, {2, 3, 4}}) {
        SCOPED_TRACE(testing::Message()
                     << "n=" << n << " " << dtype_name(dt) << " shape " << shape.size() << "-d");
        std::vector<Tensor> send, recv;
        std::vector<int64_t> recv_shape = shape;
        recv_shape.insert(recv_shape.begin(), n);
        for (int r = 0; r < n; ++r) {
          send.push_back(dt == DType::kBF16 ? test::random_bf16(shape, g)
                                            : test::random_f32(shape, g));
          recv.push_back(test::poisoned(dt, recv_shape));
        }
        run_ranks(n, [&](Communicator& c) {
          EXPECT_EQ(c.size(), n);
          c.all_gather(send[size_t(c.rank())].view(), recv[size_t(c.rank())].view());
        });
        std::vector<char> expected;
        for (const Tensor& s : send) {
          const char* p = static_cast<const char*>(s.data());
          expected.insert(expected.end(), p, p + s.nbytes());
        }
        for (int r = 0; r < n; ++r)
          EXPECT_BITWISE_EQ(recv[size_t(r)].data(), expected.data(), recv[size_t(r)].numel(), dt)
              << "rank " << r;
      }
    }
  }
}

TEST(Dist, AllGatherInPlaceAndRepeated) {
  const int n = 4, len = 9;
  auto g = test::rng(2);
  std::vector<Tensor> bufs, expected;
  for (int r = 0; r < n; ++r) bufs.push_back(test::poisoned(DType::kF32, {n, len}));
  for (int round = 0; round < 3; ++round) expected.push_back(test::random_f32({n, len}, g));
  run_ranks(n, [&](Communicator& c) {
    const Tensor& mine = bufs[size_t(c.rank())];
    for (const Tensor& e : expected) {
      float* slot = mine.ptr<float>() + c.rank() * len;
      std::memcpy(slot, e.ptr<float>() + c.rank() * len, len * sizeof(float));
      c.all_gather(TensorView::contiguous(slot, DType::kF32, {len}), mine.view());
      EXPECT_BITWISE_EQ(mine.data(), e.data(), e.numel(), DType::kF32) << "rank " << c.rank();
    }
  });
}

TEST(Dist, CollectivesKeepNaNPayloadsAndSpecialValuesBitExact) {
  const std::vector<uint32_t> f32_bits = {0x7F800001u, 0xFFC12345u, 0x7FFFFFFFu, 0x80000000u,
                                          0x7F800000u, 0x00000001u, 0xFF800000u, 0x7FC00000u};
  const std::vector<uint16_t> bf16_bits = {0x7F81, 0xFFFF, 0xFFC1, 0x8000, 0x0001, 0x7F80};
  const int n = 3;
  std::vector<Tensor> f_send, b_send, f_recv, b_recv, f_bcast;
  for (int r = 0; r < n; ++r) {
    f_send.push_back(Tensor(DType::kF32, {int64_t(f32_bits.size())}));
    b_send.push_back(Tensor(DType::kBF16, {int64_t(bf16_bits.size())}));
    for (size_t i = 0; i < f32_bits.size(); ++i)
      f_send.back().ptr<uint32_t>()[i] = f32_bits[(i + size_t(r)) % f32_bits.size()];
    for (size_t i = 0; i < bf16_bits.size(); ++i)
      b_send.back().ptr<uint16_t>()[i] = bf16_bits[(i + size_t(r)) % bf16_bits.size()];
    f_recv.push_back(test::poisoned(DType::kF32, {n, int64_t(f32_bits.size())}));
    b_recv.push_back(test::poisoned(DType::kBF16, {n, int64_t(bf16_bits.size())}));
    f_bcast.push_back(test::poisoned(DType::kF32, {int64_t(f32_bits.size())}));
  }
  std::memcpy(f_bcast[1].data(), f_send[1].data(), size_t(f_send[1].nbytes()));
  run_ranks(n, [&](Communicator& c) {
    const size_t r = size_t(c.rank());
    c.all_gather(f_send[r].view(), f_recv[r].view());
    c.all_gather(b_send[r].view(), b_recv[r].view());
    c.broadcast(f_bcast[r].view(), 1);
  });
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      EXPECT_BITWISE_EQ(f_recv[size_t(r)].view().rows(s, s + 1).data, f_send[size_t(s)].data(),
                        f_send[size_t(s)].numel(), DType::kF32);
      EXPECT_BITWISE_EQ(b_recv[size_t(r)].view().rows(s, s + 1).data, b_send[size_t(s)].data(),
                        b_send[size_t(s)].numel(), DType::kBF16);
    }
    EXPECT_BITWISE_EQ(f_bcast[size_t(r)].data(), f_send[1].data(), f_send[1].numel(), DType::kF32);
  }
}

TEST(Dist, BroadcastFromEveryRoot) {
  auto g = test::rng(3);
  for (int n : {1, 3, 4}) {
    for (int root = 0; root < n; ++root) {
      std::vector<Tensor> bufs, original;
      for (int r = 0; r < n; ++r) {
        bufs.push_back(test::random_bf16({5, 7}, g));
        original.push_back(Tensor(DType::kBF16, {5, 7}));
        std::memcpy(original.back().data(), bufs.back().data(), size_t(bufs.back().nbytes()));
      }
      run_ranks(n, [&](Communicator& c) { c.broadcast(bufs[size_t(c.rank())].view(), root); });
      for (int r = 0; r < n; ++r)
        EXPECT_BITWISE_EQ(bufs[size_t(r)].data(), original[size_t(root)].data(), 35, DType::kBF16)
            << "n=" << n << " root=" << root << " rank " << r;
    }
  }
}

TEST(Dist, BarrierOrdersWritesBeforeReads) {
  const int n = 4, rounds = 200;
  std::vector<int> slots(size_t(n), -1);  // plain ints: only the barrier orders them
  std::atomic<int> wrong{0};
  run_ranks(n, [&](Communicator& c) {
    for (int i = 0; i < rounds; ++i) {
      slots[size_t(c.rank())] = i * n + c.rank();
      c.barrier();
      for (int r = 0; r < n; ++r)
        if (slots[size_t(r)] != i * n + r) wrong.fetch_add(1);
      c.barrier();  // every rank has read round i before any writes round i + 1
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Dist, ThrowingRankFailsTheOthersPromptlyAndIsRethrown) {
  const int n = 4;
  std::vector<std::string> seen(static_cast<size_t>(n));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_ranks(
        n,
        [&](Communicator& c) {
          if (c.rank() == 2) throw Error("rank two's own failure");
          std::vector<float> send(4, float(c.rank())), recv(4 * n);
          try {
            c.all_gather(TensorView::contiguous(send.data(), DType::kF32, {4}),
                         TensorView::contiguous(recv.data(), DType::kF32, {n, 4}));
          } catch (const Error& e) {
            seen[size_t(c.rank())] = e.what();
            throw;
          }
        },
        short_timeout(2000));
    ADD_FAILURE() << "run_ranks did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank two's own failure");
  }
  EXPECT_LT(seconds_since(t0), 1.0);
  for (int r : {0, 1, 3})
    EXPECT_NE(seen[size_t(r)].find("rank 2 failed: rank two's own failure"), std::string::npos)
        << "rank " << r << ": " << seen[size_t(r)];
}

TEST(Dist, HangingRankTimesOutNamingTheMissingRank) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors = rank_errors(
      3,
      [](Communicator& c) {
        if (c.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past the timeout
          return;
        }
        c.barrier();
      },
      short_timeout(250));
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_EQ(errors[1], "");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("timed out after 250 ms"), std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("waiting for ranks [1]"), std::string::npos)
        << errors[size_t(r)];
  }
  // run_ranks itself rethrows the timeout.
  expect_error_mentioning(
      [] {
        run_ranks(
            2,
            [](Communicator& c) {
              if (c.rank() == 0)
                c.barrier();
              else
                std::this_thread::sleep_for(std::chrono::milliseconds(400));
            },
            short_timeout(100));
      },
      "barrier: rank 0 timed out after 100 ms waiting for ranks [1] (arrived: [0])");
}

TEST(Dist, ReturnedRankEndsTheWaitBeforeTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors = rank_errors(
      3,
      [](Communicator& c) {
        if (c.rank() == 2) return;
        std::vector<float> buf(3);
        c.broadcast(TensorView::contiguous(buf.data(), DType::kF32, {3}), 0);
      },
      short_timeout(2000));
  EXPECT_LT(seconds_since(t0), 1.0);
  // The first rank to notice fails the job; the other reports that failure.
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("rank 2 returned without calling broadcast"),
              std::string::npos)
        << errors[size_t(r)];
}

TEST(Dist, MismatchesBetweenRanksThrowOnEveryRank) {
  const int n = 3;
  auto gather = [](int64_t cols, DType dt) {
    return [=](Communicator& c) {
      const int64_t w = c.rank() == 2 ? cols : 4;
      const DType t = c.rank() == 2 ? dt : DType::kF32;
      Tensor send(t, {4, w}), recv(t, {c.size(), 4, w});
      c.all_gather(send.view(), recv.view());
    };
  };
  expect_all_mention(rank_errors(n, gather(5, DType::kF32)),
                     "all_gather: ranks disagree on send: rank 0 has f32[4, 4], rank 2 has "
                     "f32[4, 5]");
  expect_all_mention(rank_errors(n, gather(4, DType::kBF16)), "rank 2 has bf16[4, 4]");
  expect_all_mention(rank_errors(n,
                                 [](Communicator& c) {
                                   float v = 0;
                                   c.broadcast(TensorView::contiguous(&v, DType::kF32, {1}),
                                               c.rank() == 1 ? 1 : 0);
                                 }),
                     "ranks disagree on root: rank 0 has 0, rank 1 has 1");
  expect_all_mention(rank_errors(n,
                                 [](Communicator& c) {
                                   if (c.rank() == 1) return c.barrier();
                                   float v = 0;
                                   c.broadcast(TensorView::contiguous(&v, DType::kF32, {1}), 0);
                                 }),
                     "rank 0 called broadcast, rank 1 called barrier");
  // After an error the job is broken: later calls throw too.
  expect_all_mention(rank_errors(n,
                                 [&](Communicator& c) {
                                   try {
                                     gather(5, DType::kF32)(c);
                                   } catch (const Error&) {
                                   }
                                   c.barrier();
                                 }),
                     "barrier: rank ");
}

TEST(Dist, BadLocalArgumentsThrowOnEveryRank) {
  const int n = 3;
  // One rank's recv has the wrong shape: it says what was expected; the others that it failed.
  std::vector<std::string> errors = rank_errors(
      n,
      [](Communicator& c) {
        Tensor send(DType::kBF16, {2, 3}), recv(DType::kBF16, {c.rank() == 1 ? 2 : 3, 2, 3});
        c.all_gather(send.view(), recv.view());
      },
      short_timeout(2000));
  EXPECT_NE(errors[1].find("all_gather: rank 1: recv: expected bf16[3, 2, 3]"), std::string::npos)
      << errors[1];
  for (int r : {0, 2})
    EXPECT_NE(errors[size_t(r)].find("rank 1 failed: all_gather: rank 1: recv: expected"),
              std::string::npos)
        << errors[size_t(r)];

  auto alone = [](const std::function<void(Communicator&)>& body, const std::string& needle) {
    expect_error_mentioning([&] { run_ranks(2, body, short_timeout(2000)); }, needle);
  };
  float host[16] = {};
  alone(
      [&](Communicator& c) {
        TensorView v = TensorView::contiguous(host, DType::kF32, {4}, Device::kCUDA);
        c.broadcast(v, 0);
      },
      "the thread transport moves host memory only, got a cuda view");
  alone(
      [&](Communicator& c) {
        TensorView strided = TensorView::contiguous(host, DType::kF32, {2, 2});
        strided.stride[0] = 4;
        Tensor recv(DType::kF32, {2, 2, 2});
        c.all_gather(strided, recv.view());
      },
      "send: expected a contiguous view");
  alone(
      [&](Communicator& c) {
        c.all_gather(TensorView::contiguous(host + 2, DType::kF32, {4}),
                     TensorView::contiguous(host, DType::kF32, {2, 4}));
      },
      "send overlaps recv without being exactly recv[");
  alone([&](Communicator& c) { c.broadcast(TensorView::contiguous(host, DType::kF32, {4}), 2); },
        "root: expected in [0, 2), got 2");
  expect_error_mentioning([] { run_ranks(0, [](Communicator&) {}); }, "expected >= 1 ranks");
  expect_error_mentioning(
      [] {
        run_ranks(
            2, [](Communicator&) {}, short_timeout(0));
      },
      "timeout: expected > 0 ms");
  EXPECT_EQ(CommOptions{}.to_string(), "comm: timeout=60000ms");
}

// Row-parallel GEMM over real ranks: each rank's fp32 partial (its K range, §G.5), all-gathered,
// combined by gemm_combine on every rank == the in-process combine of the same partials == the
// tp = 1 GEMM (t <= S gives identical bits).
TEST(Dist, AllGatheredPartialsCombineToTheSimulatedTpBits) {
  const auto backend = engine::make_invariant_backend();
  const engine::OpsBackend& op = *backend;
  const GemmConfig cfg{4};
  auto g = test::rng(4);
  auto cols = [](const TensorView& m, int64_t c0, int64_t c1) {
    TensorView v = m;
    v.data = static_cast<char*>(m.data) + c0 * dtype_size(m.dtype);
    v.shape[1] = c1 - c0;
    return v;
  };
  for (int64_t K : {111, 17}) {  // K = 17: ranks 2 and 3 of 4 own only padding
    const int64_t M = 5, N = 7;
    Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
    for (DType out : {DType::kBF16, DType::kF32}) {
      Tensor tp1(out, {M, N});
      op.gemm(x.view(), w.view(), cfg, tp1.view());
      for (int t : {1, 2, 4}) {
        SCOPED_TRACE(testing::Message() << "K=" << K << " t=" << t << " " << dtype_name(out));
        auto partial = [&](int r, const TensorView& y) {
          const GemmKRange k = gemm_tp_k_range(cfg, K, t, r);
          op.gemm_partial(cols(x.view(), k.begin, k.end), cols(w.view(), k.begin, k.end), K, t, r,
                          cfg, y);
        };
        // In-process (what src/engine/model.cc does today).
        std::vector<Tensor> partials;
        std::vector<TensorView> views;
        for (int r = 0; r < t; ++r) {
          partials.push_back(Tensor(DType::kF32, {M, N}));
          partial(r, partials.back().view());
          views.push_back(partials.back().view());
        }
        Tensor simulated(out, {M, N});
        op.gemm_combine(views, simulated.view());
        // Over ranks.
        std::vector<Tensor> y;
        for (int r = 0; r < t; ++r) y.push_back(test::poisoned(out, {M, N}));
        run_ranks(t, [&](Communicator& c) {
          Tensor mine(DType::kF32, {M, N}), all(DType::kF32, {t, M, N});
          partial(c.rank(), mine.view());
          c.all_gather(mine.view(), all.view());
          std::vector<TensorView> gathered;
          for (int r = 0; r < t; ++r)
            gathered.push_back(
                TensorView::contiguous(all.ptr<float>() + r * M * N, DType::kF32, {M, N}));
          op.gemm_combine(gathered, y[size_t(c.rank())].view());
        });
        for (int r = 0; r < t; ++r) {
          EXPECT_BITWISE_EQ(y[size_t(r)].data(), simulated.data(), M * N, out) << "rank " << r;
          EXPECT_BITWISE_EQ(y[size_t(r)].data(), tp1.data(), M * N, out) << "rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lockstep
