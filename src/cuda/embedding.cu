// Launchers of cuda::embedding / embedding_vocab_parallel / embedding_combine (kernels:
// embedding.cuh). Arguments are checked before the launch (the contract's checks, docs/contract.md
// §E.4, on device views; device ids are not read here); launches are asynchronous, errors throw.
#include <cuda_runtime.h>

#include <string>

#include "contract/checks.h"
#include "cuda/embedding.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {
namespace {

using detail::check_device_view;

void launch_gather(const char* op, const TensorView& ids, const TensorView& table, int64_t v0,
                   int64_t v1, int64_t vocab, const TensorView& out, void* stream) {
  detail::EmbeddingParams p{};
  p.ids = detail::index_ref(ids);
  p.table = static_cast<const uint16_t*>(table.data);
  p.out = static_cast<uint16_t*>(out.data);
  p.lt = table.stride[0];
  p.lo = out.stride[0];
  p.T = out.shape[0];
  p.H = out.shape[1];
  p.v0 = v0;
  p.v1 = v1;
  p.vocab = vocab;
  if (p.T == 0) return;
  constexpr int kThreads = 256;
  detail::embedding_kernel<<<detail::grid_for(p.T * p.H, kThreads), kThreads, 0,
                             static_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch(op);
}

}  // namespace

void embedding(const TensorView& ids, const TensorView& table, const TensorView& out,
               void* stream) {
  const char* op = "cuda::embedding";
  check_device_view(op, "table", table, DType::kBF16, {-1, -1});
  const int64_t V = table.shape[0];
  contract::check_gather(op, Device::kCUDA, ids, table, V, V, out);
  launch_gather(op, ids, table, 0, V, V, out, stream);
}

void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                              const VocabShard& shard, int64_t vocab, const TensorView& out,
                              void* stream) {
  const char* op = "cuda::embedding_vocab_parallel";
  LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
           "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
           ")");
  contract::check_gather(op, Device::kCUDA, ids, table, shard.size(), vocab, out);
  launch_gather(op, ids, table, shard.begin, shard.end, vocab, out, stream);
}

void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out,
                       void* stream) {
  const char* op = "cuda::embedding_combine";
  contract::check_embedding_combine(op, Device::kCUDA, partials, out);
  LS_CHECK(partials.size() <= size_t(detail::kMaxCombinePartials), op,
           "argument 'partials': at most ", detail::kMaxCombinePartials, " views, got ",
           partials.size());
  const int64_t T = out.shape[0], H = out.shape[1];
  detail::EmbedCombineParams p{};
  for (size_t r = 0; r < partials.size(); ++r) {
    p.part[r] = static_cast<const uint16_t*>(partials[r].data);
    p.ld[r] = partials[r].stride[0];
  }
  if (T == 0) return;
  p.n = int(partials.size());
  p.out = static_cast<uint16_t*>(out.data);
  p.lo = out.stride[0];
  p.T = T;
  p.H = H;
  constexpr int kThreads = 256;
  detail::embedding_combine_kernel<<<detail::grid_for(T * H, kThreads), kThreads, 0,
                                     static_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch(op);
}

}  // namespace lockstep::cuda
