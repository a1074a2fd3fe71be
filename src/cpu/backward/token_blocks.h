// The token blocks of a micro-batch in the canonical order of docs/contract.md §B.1 (sequences by
// ascending step index, then 16-position blocks ascending), shared by the CPU weight gradients.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "lockstep/contract/backward.h"

namespace lockstep::cpu {

// One token block: positions [16b, 16b + 16) of a sequence, at packed rows [row, row + len);
// rows past len (the sequence's end) are zero rows.
struct TokenBlock {
  int64_t row = 0;  // packed row of the block's first position
  int64_t len = 0;  // real rows, 1 .. 16
};

// Every token block of `order`, in canonical order.
inline std::vector<TokenBlock> token_blocks(const TokenOrder& order) {
  std::vector<TokenBlock> blocks;
  for (const TokenSeq& s : order.seqs())
    for (int64_t p = 0; p < s.len; p += kTokenBlock)
      blocks.push_back({s.row + p, std::min<int64_t>(kTokenBlock, s.len - p)});
  return blocks;
}

}  // namespace lockstep::cpu
