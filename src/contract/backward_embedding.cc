// The embedding backward's argument checks (docs/contract.md §B.7), one definition for every
// backend.
#include "contract/checks.h"

namespace lockstep::contract {

int64_t check_embedding_backward(const char* op, Device dev, const TensorView& ids,
                                 const TensorView& gh, const TokenOrder& order,
                                 const TensorView& dtable) {
  const int64_t rows = order.rows();
  check_tensor_dtypes(op, "ids", ids, {DType::kI32, DType::kI64}, {rows}, dev);
  check_tensor(op, "dtable", dtable, DType::kF32, {-1, -1}, dev);
  check_inner_contiguous(op, "dtable", dtable);
  const int64_t V = dtable.shape[0], H = dtable.shape[1];
  LS_CHECK(H >= 1, op, "argument 'dtable' expected a hidden size >= 1, got ",
           dtable.shape_string());
  check_tensor(op, "gh", gh, DType::kF32, {rows, H}, dev);
  check_inner_contiguous(op, "gh", gh);
  LS_CHECK(!overlaps(dtable, gh) && !overlaps(dtable, ids), op,
           "argument 'dtable' must not overlap gh or ids");
  if (dev != Device::kCPU) return V;
  for (const TokenSeq& s : order.seqs())
    for (int64_t t = s.row; t < s.row + s.len; ++t) {
      const int64_t id = index_at(ids, t);
      LS_CHECK(id >= 0 && id < V, op, "argument 'ids' element ", t, " = ", id,
               " is outside the vocabulary [0, ", V, ")");
    }
  return V;
}

}  // namespace lockstep::contract
