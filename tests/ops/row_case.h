// Shared parts of the op-case table's per-token cases (tests/ops/cases_*.cc): layout helpers and
// RowCase, the base of every case whose output row t depends only on input row t and shared inputs
// (GEMM, RMSNorm, RoPE, SiLU, embedding, log-prob, sampling), with its generic relations.
#pragma once

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/op_case.h"

namespace lockstep::cases {

inline std::string num(int64_t v) { return std::to_string(v); }

// Copies a contiguous [R, E] tensor into a [R, E + pad] buffer (pad 0: a contiguous copy).
inline HostArg padded(const Tensor& t, int64_t pad) {
  const int64_t R = t.shape()[0], E = t.numel() / std::max<int64_t>(R, 1);
  const int64_t es = dtype_size(t.dtype());
  HostArg a = host_rows(t.dtype(), R, E, E + pad);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(static_cast<char*>(a.buf.data()) + r * (E + pad) * es,
                static_cast<const char*>(t.data()) + r * E * es, size_t(E * es));
  return a;
}

// A [T] view of a [T, 1] row input (stride `step` >= 1 puts the values in a wider buffer).
inline HostArg vector_arg(const Tensor& t, int64_t step) {
  const int64_t T = t.shape()[0];
  HostArg a = padded(t, step - 1);
  a.view.ndim = 1;
  a.view.shape[0] = T;
  a.view.stride[0] = step;
  return a;
}

// [T, heads·D] row input seen as [T, heads, D] (rows of the buffer may be wider).
inline TensorView heads_view(TensorView v, int64_t heads, int64_t D) {
  const int64_t ld = v.stride[0];
  v.ndim = 3;
  v.shape[1] = heads;
  v.shape[2] = D;
  v.stride[0] = ld;
  v.stride[1] = D;
  v.stride[2] = 1;
  return v;
}

inline Output not_by_row(Output o) {
  o.rows = 0;  // compared whole only (not a per-token buffer)
  return o;
}

// A per-token input of a row-wise case: [T, elems], dim 0 = tokens.
struct RowInput {
  DType dt = DType::kBF16;
  int64_t elems = 1;
  DataKind kind = DataKind::kNormal;
  float scale = 1.0f;
  int64_t index_lo = 0, index_hi = 0;  // index_hi > 0: integer values in [index_lo, index_hi)
  int64_t special_index = 0;           // with some probability this value (ignore_index, ...)
  bool has_special_index = false;
};

// A case whose every output row t depends only on input row t (and shared inputs): relations are
// "row alone / inside batches of 1, 3, 17, 256 at other positions with other rows' contents
// changed", "thread counts 1 and 3" and, for a strided case, "strided layout == contiguous".
class RowCase : public OpCase {
 public:
  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    build_shared(g);
    rows_.clear();
    for (const RowInput& in : inputs_) {
      Tensor t(in.dt, {T_, in.elems});
      for (int64_t r = 0; r < T_; ++r) fill_row(in, t, r, g);
      rows_.push_back(std::move(t));
    }
  }
  Outputs run(Ops& ops, Mem& mem) const override { return compute(ops, mem, rows_, T_, strided_); }
  std::vector<Relation> relations() const override;

 protected:
  int64_t T_ = 1;
  std::vector<RowInput> inputs_;
  std::vector<Tensor> rows_;
  virtual void build_shared(std::mt19937_64& g) = 0;
  bool strided_ = false;  // the case's layout: strided / fused views (false: plain contiguous)
  // The op on T rows; `strided` picks the case's layout or the plain contiguous one.
  virtual Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided) const = 0;

  static void fill_row(const RowInput& in, const Tensor& t, int64_t r, std::mt19937_64& g) {
    char* p = static_cast<char*>(t.data()) + r * in.elems * dtype_size(in.dt);
    if (in.index_hi > 0) {
      std::uniform_int_distribution<int64_t> d(in.index_lo, in.index_hi - 1);
      std::uniform_int_distribution<int> pick(0, 9);
      for (int64_t i = 0; i < in.elems; ++i) {
        const int64_t v = in.has_special_index && pick(g) == 0 ? in.special_index : d(g);
        if (in.dt == DType::kI32)
          reinterpret_cast<int32_t*>(p)[i] = int32_t(v);
        else
          reinterpret_cast<int64_t*>(p)[i] = v;
      }
    } else if (in.dt == DType::kBF16) {
      fill_bf16(reinterpret_cast<bf16*>(p), in.elems, in.kind, g, in.scale);
    } else {
      fill_f32(reinterpret_cast<float*>(p), in.elems, in.kind, g, in.scale);
    }
  }
};

}  // namespace lockstep::cases
