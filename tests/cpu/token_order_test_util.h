// Helpers for the weight-gradient tests (docs/contract.md §B.1): a training step's sequences
// packed into micro-batches at shuffled row offsets with garbage padding rows between them, so
// a test can compare the gradient of one packing / split with another bit for bit.
#pragma once

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "lockstep/contract/backward.h"
#include "lockstep/tensor.h"
#include "util/test_util.h"

namespace lockstep::test {

// The step's tokens, concatenated sequence-major: sequence s holds global rows
// [offset[s], offset[s] + lens[s]).
struct Step {
  std::vector<int64_t> lens;
  std::vector<int64_t> offset;
  int64_t tokens = 0;
  explicit Step(std::vector<int64_t> l) : lens(std::move(l)) {
    for (int64_t n : lens) {
      offset.push_back(tokens);
      tokens += n;
    }
  }
};

// One micro-batch: its TokenOrder and, for every packed row, the global row it copies (-1:
// padding).
struct Packing {
  TokenOrder order;
  std::vector<int64_t> src;
};

// Packs the step's sequences `ids` (step indices) into one micro-batch. shuffle: place them in a
// random order; max_pad: up to that many padding rows before each sequence and at the end.
inline Packing pack(const Step& step, const std::vector<int64_t>& ids, std::mt19937_64& g,
                    bool shuffle, int max_pad) {
  std::vector<int64_t> place = ids;
  if (shuffle) std::shuffle(place.begin(), place.end(), g);
  std::uniform_int_distribution<int> pad(0, max_pad);
  Packing p;
  std::vector<TokenSeq> seqs;
  auto add_pad = [&] {
    for (int i = pad(g); i > 0; --i) p.src.push_back(-1);
  };
  for (int64_t s : place) {
    add_pad();
    seqs.push_back({s, int64_t(p.src.size()), step.lens[size_t(s)]});
    for (int64_t i = 0; i < step.lens[size_t(s)]; ++i) p.src.push_back(step.offset[size_t(s)] + i);
  }
  add_pad();
  p.order = TokenOrder::make("test", seqs, int64_t(p.src.size()));
  return p;
}

// Every sequence of the step in one micro-batch, in step order, no padding.
inline Packing pack_all(const Step& step) {
  std::vector<int64_t> ids(step.lens.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 g(0);
  return pack(step, ids, g, false, 0);
}

// Rows [begin, end) of the step's sequence list.
inline std::vector<int64_t> id_range(int64_t begin, int64_t end) {
  std::vector<int64_t> ids(size_t(end - begin));
  std::iota(ids.begin(), ids.end(), begin);
  return ids;
}

// A garbage bit pattern for a padding row: random bits, often NaN / inf.
inline uint16_t garbage_bf16(std::mt19937_64& g) {
  const uint16_t u = uint16_t(g());
  switch (g() % 4) {
    case 0:
      return 0x7fc1;  // NaN
    case 1:
      return 0xff80;  // -inf
    default:
      return u;
  }
}

// The packed [rows, C] tensor of a global [tokens, C] one (bf16 or f32): real rows copied,
// padding rows garbage.
inline Tensor packed_rows(const Tensor& global, const Packing& p, std::mt19937_64& g) {
  const int64_t C = global.shape()[1];
  const int64_t es = dtype_size(global.dtype());
  Tensor t(global.dtype(), {int64_t(p.src.size()), C});
  for (size_t r = 0; r < p.src.size(); ++r) {
    char* dst = static_cast<char*>(t.data()) + int64_t(r) * C * es;
    if (p.src[r] >= 0) {
      std::memcpy(dst, static_cast<const char*>(global.data()) + p.src[r] * C * es, size_t(C * es));
    } else if (global.dtype() == DType::kBF16) {
      for (int64_t c = 0; c < C; ++c) reinterpret_cast<bf16*>(dst)[c] = bf16{garbage_bf16(g)};
    } else if (global.dtype() == DType::kF32) {
      for (int64_t c = 0; c < C; ++c)
        reinterpret_cast<uint32_t*>(dst)[c] = c % 3 ? uint32_t(g()) : 0x7fc12345u;
    } else {  // index tensors: random bytes (ids far outside any range)
      for (int64_t b = 0; b < C * es; ++b) dst[b] = char(g());
    }
  }
  return t;
}

// A copy of a tensor.
inline Tensor clone(const Tensor& t) {
  Tensor c(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), size_t(t.nbytes()));
  return c;
}

}  // namespace lockstep::test
