// The communicator (src/dist) on both transports: every case runs on n threads (run_ranks) and
// on n processes (run_rank_processes). all_gather / broadcast move the senders' bytes exactly (NaN
// payloads too) for 1..8 ranks and payloads larger than a process slot, barrier orders writes, a
// rank that fails, returns or hangs ends every rank's wait with a clear Error (well before the
// timeout where it can), argument mismatches throw on every rank, and all-gathered row-parallel
// partials combined on each rank give the simulated-TP bits (docs/contract.md §G.5). What ranks
// write for the test lives in shared memory (tests/util/dist_test_util.h). Process-only cases (a
// rank killed or exiting, joining, the environment): test_dist_process.cc.
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "util/dist_test_util.h"

namespace lockstep {
namespace {

using dist::CommOptions;
using dist::Communicator;
using test::expect_error_mentioning;
using test::require_bitwise_equal;
using test::seconds_since;
using test::shared_poisoned;
using test::timeout_ms;
using test::Transport;

class Dist : public testing::TestWithParam<Transport> {
 protected:
  bool threads() const { return GetParam() == Transport::kThreads; }
  void run(int n, const std::function<void(Communicator&)>& body, const CommOptions& o = {}) {
    test::run_on(GetParam(), n, body, o);
  }
  // Runs body on n ranks; returns each rank's Error message ("" for a rank that did not throw).
  std::vector<std::string> rank_errors(int n, const std::function<void(Communicator&)>& body,
                                       const CommOptions& options = {}) {
    test::SharedStrings errors(n);
    run(
        n,
        [&](Communicator& c) {
          try {
            body(c);
          } catch (const Error& e) {
            errors.set(c.rank(), e.what());
          }
        },
        options);
    return errors.all();
  }
  // A failure must end the other ranks' waits within prompt_s(), well inside prompt_timeout().
  // Processes get more room: starting them (ASan, a loaded CI machine) is not free.
  CommOptions prompt_timeout() const { return timeout_ms(threads() ? 2000 : 60000); }
  double prompt_s() const { return threads() ? 1.0 : 20.0; }
};

INSTANTIATE_TEST_SUITE_P(Transports, Dist,
                         testing::Values(Transport::kThreads, Transport::kProcesses),
                         [](const auto& info) { return test::transport_name(info.param); });

void expect_all_mention(const std::vector<std::string>& errors, const std::string& needle) {
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find(needle), std::string::npos) << "rank " << r << ": " << errors[r];
}

TEST_P(Dist, AllGatherStacksEverySendersBytesInRankOrder) {
  auto g = test::rng(1);
  const std::vector<std::vector<int64_t>> shapes = {{3, 17}, {1}, {0, 5}, {2, 3, 4}};
  for (int n : {1, 2, 3, 4, 8}) {
    struct Case {
      DType dt;
      std::vector<Tensor> send, recv;  // [rank]
    };
    std::vector<Case> cases;
    for (DType dt : {DType::kBF16, DType::kF32})
      for (const std::vector<int64_t>& shape : shapes) {
        Case c{dt, {}, {}};
        std::vector<int64_t> recv_shape = shape;
        recv_shape.insert(recv_shape.begin(), n);
        for (int r = 0; r < n; ++r) {
          c.send.push_back(dt == DType::kBF16 ? test::random_bf16(shape, g)
                                              : test::random_f32(shape, g));
          c.recv.push_back(shared_poisoned(dt, recv_shape));
        }
        cases.push_back(std::move(c));
      }
    run(n, [&](Communicator& c) {
      if (c.size() != n) throw Error("size() is " + std::to_string(c.size()));
      for (const Case& k : cases)
        c.all_gather(k.send[size_t(c.rank())].view(), k.recv[size_t(c.rank())].view());
    });
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& k = cases[i];
      SCOPED_TRACE(testing::Message() << "n=" << n << " " << dtype_name(k.dt) << " shape "
                                      << shapes[i % shapes.size()].size() << "-d");
      std::vector<char> expected;
      for (const Tensor& s : k.send) {
        const char* p = static_cast<const char*>(s.data());
        expected.insert(expected.end(), p, p + s.nbytes());
      }
      for (int r = 0; r < n; ++r)
        EXPECT_BITWISE_EQ(k.recv[size_t(r)].data(), expected.data(), k.recv[size_t(r)].numel(),
                          k.dt)
            << "rank " << r;
    }
  }
}

TEST_P(Dist, AllGatherInPlaceAndRepeated) {
  const int n = 4, len = 9;
  auto g = test::rng(2);
  std::vector<Tensor> expected;
  for (int round = 0; round < 3; ++round) expected.push_back(test::random_f32({n, len}, g));
  run(n, [&](Communicator& c) {
    Tensor mine(DType::kF32, {n, len});
    test::poison(mine.data(), mine.nbytes());
    for (size_t round = 0; round < expected.size(); ++round) {
      const Tensor& e = expected[round];
      float* slot = mine.ptr<float>() + c.rank() * len;
      std::memcpy(slot, e.ptr<float>() + c.rank() * len, len * sizeof(float));
      c.all_gather(TensorView::contiguous(slot, DType::kF32, {len}), mine.view());
      require_bitwise_equal(mine.data(), e.data(), e.numel(), DType::kF32,
                            "rank " + std::to_string(c.rank()) + " round " + std::to_string(round));
    }
  });
}

// More bytes than one slot of the process transport (1 MiB; a broadcast's chunk is every rank's
// slot): the chunks arrive in order and whole.
TEST_P(Dist, CollectivesLargerThanAProcessSlot) {
  const int n = 3;
  const int64_t gather_len = (int64_t(1) << 18) + 4099;       // f32: 1 MiB + 16 KiB
  const int64_t bcast_len = 3 * (int64_t(1) << 20) / 2 + 77;  // bf16: 3 MiB + 154 bytes
  auto g = test::rng(5);
  std::vector<Tensor> send, recv, bcast;
  for (int r = 0; r < n; ++r) {
    send.push_back(test::random_f32({gather_len}, g));
    recv.push_back(shared_poisoned(DType::kF32, {n, gather_len}));
    bcast.push_back(shared_poisoned(DType::kBF16, {bcast_len}));
  }
  const Tensor root_buf = test::random_bf16({bcast_len}, g);
  std::memcpy(bcast[2].data(), root_buf.data(), size_t(root_buf.nbytes()));
  run(n, [&](Communicator& c) {
    c.all_gather(send[size_t(c.rank())].view(), recv[size_t(c.rank())].view());
    c.broadcast(bcast[size_t(c.rank())].view(), 2);
  });
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s)
      EXPECT_BITWISE_EQ(recv[size_t(r)].view().rows(s, s + 1).data, send[size_t(s)].data(),
                        gather_len, DType::kF32)
          << "rank " << r << " from " << s;
    EXPECT_BITWISE_EQ(bcast[size_t(r)].data(), root_buf.data(), bcast_len, DType::kBF16)
        << "rank " << r;
  }
}

TEST_P(Dist, CollectivesKeepNaNPayloadsAndSpecialValuesBitExact) {
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
    f_recv.push_back(shared_poisoned(DType::kF32, {n, int64_t(f32_bits.size())}));
    b_recv.push_back(shared_poisoned(DType::kBF16, {n, int64_t(bf16_bits.size())}));
    f_bcast.push_back(shared_poisoned(DType::kF32, {int64_t(f32_bits.size())}));
  }
  std::memcpy(f_bcast[1].data(), f_send[1].data(), size_t(f_send[1].nbytes()));
  run(n, [&](Communicator& c) {
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

TEST_P(Dist, BroadcastFromEveryRoot) {
  auto g = test::rng(3);
  for (int n : {1, 3, 4}) {
    for (int root = 0; root < n; ++root) {
      std::vector<Tensor> bufs, original;
      for (int r = 0; r < n; ++r) {
        const Tensor v = test::random_bf16({5, 7}, g);
        bufs.push_back(test::shared_tensor(DType::kBF16, {5, 7}));
        original.push_back(v);
        std::memcpy(bufs.back().data(), v.data(), size_t(v.nbytes()));
      }
      run(n, [&](Communicator& c) { c.broadcast(bufs[size_t(c.rank())].view(), root); });
      for (int r = 0; r < n; ++r)
        EXPECT_BITWISE_EQ(bufs[size_t(r)].data(), original[size_t(root)].data(), 35, DType::kBF16)
            << "n=" << n << " root=" << root << " rank " << r;
    }
  }
}

TEST_P(Dist, BarrierOrdersWritesBeforeReads) {
  const int n = 4, rounds = 200;
  // Plain ints every rank sees: only the barrier orders them.
  const Tensor slots = test::shared_tensor(DType::kI32, {n});
  test::SharedCounter wrong;
  run(n, [&](Communicator& c) {
    int32_t* s = slots.ptr<int32_t>();
    for (int i = 0; i < rounds; ++i) {
      s[c.rank()] = i * n + c.rank();
      c.barrier();
      for (int r = 0; r < n; ++r)
        if (s[r] != i * n + r) wrong.add();
      c.barrier();  // every rank has read round i before any writes round i + 1
    }
  });
  EXPECT_EQ(wrong.get(), 0);
}

TEST_P(Dist, ThrowingRankFailsTheOthersPromptlyAndIsRethrown) {
  const int n = 4;
  test::SharedStrings seen(n);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run(
        n,
        [&](Communicator& c) {
          if (c.rank() == 2) throw Error("rank two's own failure");
          std::vector<float> send(4, float(c.rank())), recv(4 * n);
          try {
            c.all_gather(TensorView::contiguous(send.data(), DType::kF32, {4}),
                         TensorView::contiguous(recv.data(), DType::kF32, {n, 4}));
          } catch (const Error& e) {
            seen.set(c.rank(), e.what());
            throw;
          }
        },
        prompt_timeout());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    // Threads rethrow the rank's own exception; processes say which rank it was.
    const std::string what = e.what();
    if (threads())
      EXPECT_EQ(what, "rank two's own failure");
    else
      EXPECT_TRUE(what.starts_with("rank 2 (pid ") &&
                  what.ends_with(") failed: rank two's own failure"))
          << what;
  }
  EXPECT_LT(seconds_since(t0), prompt_s());
  const std::vector<std::string> errors = seen.all();
  for (int r : {0, 1, 3})
    EXPECT_NE(errors[size_t(r)].find("rank 2 failed: rank two's own failure"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}

// Rank 1 hangs until the `others` ranks that call barrier() have timed out (never on a clock, so
// every rank that waits sees it missing).
std::function<void(Communicator&)> rank_1_hangs(test::SharedCounter& timed_out, int others) {
  return [&timed_out, others](Communicator& c) {
    if (c.rank() == 1) return timed_out.wait_for(others);
    try {
      c.barrier();
    } catch (const Error&) {
      timed_out.add();
      throw;
    }
  };
}

TEST_P(Dist, HangingRankTimesOutNamingTheMissingRank) {
  test::SharedCounter three;
  const std::vector<std::string> errors = rank_errors(3, rank_1_hangs(three, 2), timeout_ms(1000));
  EXPECT_EQ(errors[1], "");
  // The first to time out fails the job; the other may time out itself or report that.
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("timed out after 1000 ms"), std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("waiting for ranks [1"), std::string::npos)
        << errors[size_t(r)];
  }
  // run_ranks / run_rank_processes rethrow the timeout.
  test::SharedCounter two;
  expect_error_mentioning([&] { run(2, rank_1_hangs(two, 1), timeout_ms(100)); },
                          "barrier: rank 0 timed out after 100 ms waiting for ranks [1] "
                          "(arrived: [0])");
}

TEST_P(Dist, ReturnedRankEndsTheWaitBeforeTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors = rank_errors(
      3,
      [](Communicator& c) {
        if (c.rank() == 2) return;
        std::vector<float> buf(3);
        c.broadcast(TensorView::contiguous(buf.data(), DType::kF32, {3}), 0);
      },
      prompt_timeout());
  EXPECT_LT(seconds_since(t0), prompt_s());
  // The first rank to notice fails the job; the other reports that failure.
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("rank 2 returned without calling broadcast"),
              std::string::npos)
        << errors[size_t(r)];
}

TEST_P(Dist, MismatchesBetweenRanksThrowOnEveryRank) {
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

TEST_P(Dist, BadLocalArgumentsThrowOnEveryRank) {
  const int n = 3;
  // One rank's recv has the wrong shape: it says what was expected; the others that it failed.
  std::vector<std::string> errors = rank_errors(
      n,
      [](Communicator& c) {
        Tensor send(DType::kBF16, {2, 3}), recv(DType::kBF16, {c.rank() == 1 ? 2 : 3, 2, 3});
        c.all_gather(send.view(), recv.view());
      },
      prompt_timeout());
  EXPECT_NE(errors[1].find("all_gather: rank 1: recv: expected bf16[3, 2, 3]"), std::string::npos)
      << errors[1];
  for (int r : {0, 2})
    EXPECT_NE(errors[size_t(r)].find("rank 1 failed: all_gather: rank 1: recv: expected"),
              std::string::npos)
        << errors[size_t(r)];

  auto alone = [&](const std::function<void(Communicator&)>& body, const std::string& needle) {
    expect_error_mentioning([&] { run(2, body, prompt_timeout()); }, needle);
  };
  float host[16] = {};
  alone(
      [&](Communicator& c) {
        TensorView v = TensorView::contiguous(host, DType::kF32, {4}, Device::kCUDA);
        c.broadcast(v, 0);
      },
      std::string("the ") + (threads() ? "thread" : "process") +
          " transport moves host memory only, got a cuda view");
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
  expect_error_mentioning([&] { run(0, [](Communicator&) {}); }, "expected >= 1 ranks");
  expect_error_mentioning(
      [&] {
        run(
            2, [](Communicator&) {}, timeout_ms(0));
      },
      "timeout: expected > 0 ms");
  EXPECT_EQ(CommOptions{}.to_string(), "comm: timeout=60000ms");
}

// Row-parallel GEMM over real ranks: each rank's fp32 partial (its K range, §G.5), all-gathered,
// combined by gemm_combine for every rank == the in-process combine of the same partials == the
// tp = 1 GEMM (t <= S gives identical bits). The partials are computed and the combines run in the
// test process (the CPU backend's thread pool does not survive a fork); the ranks move the bytes.
TEST_P(Dist, AllGatheredPartialsCombineToTheSimulatedTpBits) {
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
        // In-process (what src/engine/model.cc does today).
        std::vector<Tensor> partials;
        std::vector<TensorView> views;
        for (int r = 0; r < t; ++r) {
          partials.push_back(Tensor(DType::kF32, {M, N}));
          const GemmKRange k = gemm_tp_k_range(cfg, K, t, r);
          op.gemm_partial(cols(x.view(), k.begin, k.end), cols(w.view(), k.begin, k.end), K, t, r,
                          cfg, partials.back().view());
          views.push_back(partials.back().view());
        }
        Tensor simulated(out, {M, N});
        op.gemm_combine(views, simulated.view());
        // Over ranks.
        std::vector<Tensor> all;
        for (int r = 0; r < t; ++r) all.push_back(shared_poisoned(DType::kF32, {t, M, N}));
        run(t, [&](Communicator& c) {
          c.all_gather(partials[size_t(c.rank())].view(), all[size_t(c.rank())].view());
        });
        for (int r = 0; r < t; ++r) {
          std::vector<TensorView> gathered;
          for (int s = 0; s < t; ++s)
            gathered.push_back(TensorView::contiguous(all[size_t(r)].ptr<float>() + s * M * N,
                                                      DType::kF32, {M, N}));
          Tensor y(out, {M, N});
          op.gemm_combine(gathered, y.view());
          EXPECT_BITWISE_EQ(y.data(), simulated.data(), M * N, out) << "rank " << r;
          EXPECT_BITWISE_EQ(y.data(), tp1.data(), M * N, out) << "rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lockstep
