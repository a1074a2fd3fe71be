// Embedding backward on the CPU (docs/contract.md §B.7): dtable[id][k] += gh[t][k] for every
// token in canonical order (sequences by step index, positions ascending; the block structure
// plays no role), one sequential fp32 chain per (id, k). Threads split the columns k, so every
// chain stays in one task, in order: bits never depend on packing, micro-batch split (consecutive
// runs of the canonical order) or thread count.
#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {

void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                        const TensorView& dtable) {
  contract::check_embedding_backward("embedding_backward", Device::kCPU, ids, gh, order, dtable);
  const int64_t H = dtable.shape[1];
  struct Token {
    int64_t id, row;
  };
  std::vector<Token> tokens;  // canonical order
  for (const TokenSeq& s : order.seqs())
    for (int64_t t = s.row; t < s.row + s.len; ++t)
      tokens.push_back({contract::index_at(ids, t), t});
  if (tokens.empty()) return;
  float* table = dtable.ptr<float>();
  const float* g = gh.ptr<const float>();
  parallel_for(H, 64, [&](int64_t k0, int64_t k1) {
    for (const Token& tk : tokens) {
      float* d = table + tk.id * dtable.stride[0];
      const float* x = g + tk.row * gh.stride[0];
      for (int64_t k = k0; k < k1; ++k) d[k] = canonical_f32(d[k] + x[k]);  // §4: canonical NaN
    }
  });
}

}  // namespace lockstep::cpu
