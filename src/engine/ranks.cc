// Rank modes and the agreement check of a launched job. See ranks.h.
#include "engine/ranks.h"

#include <cstring>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

const char* rank_mode_name(RankMode m) {
  switch (m) {
    case RankMode::kSimulated:
      return "simulated";
    case RankMode::kThreads:
      return "threads";
    case RankMode::kLaunch:
      return "launch";
  }
  return "?";
}

void check_same_sha256_on_every_rank(dist::Communicator& job, const std::string& sha256,
                                     const std::string& what) {
  constexpr int64_t kHex = 64;
  LS_CHECK(int64_t(sha256.size()) == kHex, what, "expected a sha256 of 64 hex digits, got '",
           sha256, "'");
  const int n = job.size();
  std::vector<char> all(size_t(n) * size_t(kHex));
  job.all_gather(TensorView::contiguous(const_cast<char*>(sha256.data()), DType::kU8, {kHex}),
                 TensorView::contiguous(all.data(), DType::kU8, {int64_t(n), kHex}));
  std::string differ;
  for (int r = 1; r < n; ++r)
    if (std::memcmp(all.data() + size_t(r) * size_t(kHex), all.data(), size_t(kHex)) != 0)
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  LS_CHECK(differ.empty(), what,
           "the ranks of the job disagree (rank-local models must compute the same bits on "
           "every rank): ranks [",
           differ, "] differ from rank 0 (sha256 ", std::string(all.data(), size_t(kHex)), ")");
}

}  // namespace lockstep::engine
