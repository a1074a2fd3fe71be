// CUDA elementwise ops: RMSNorm (+ fused residual), RoPE, SiLU-and-mul, embedding — the same bits
// as the lockstep::cpu ops of the same name (docs/contract.md §E). Every row is computed alone
// (one fixed in-row reduction order for RMSNorm), so nothing depends on the batch.
// Plain C++ header: device pointers live in TensorViews with device == Device::kCUDA; `stream` is
// an opaque cudaStream_t (nullptr = default stream). Arguments are checked before the launch
// (lockstep::Error naming the op and argument); launches are asynchronous and a launch error
// throws.
#pragma once

#include <vector>

#include "lockstep/ops/embedding.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda {

void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
             const TensorView& y, void* stream = nullptr);
void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& residual_out, const TensorView& y,
                      void* stream = nullptr);

// RoPE with the table already on the device: cos, sin f32 [max_positions, D/2] device views of
// RopeTable::cos / ::sin (copied once by the caller); positions i32/i64 on the device. Positions
// outside [0, max_positions) cannot be checked before the launch: the kernel writes canonical NaN
// for such a row (documented; callers validate positions on the host).
void rope(const TensorView& x, const TensorView& positions, const TensorView& cos,
          const TensorView& sin, const TensorView& y, void* stream = nullptr);

// A layer's q and k heads in place, in one launch: qk [T, heads, D] (q heads [0, nq), k heads
// [nq, heads), e.g. the q|k columns of a q|k|v buffer); each q head rmsnorm'd with q_weight, each k
// head with k_weight, then every head rotated by RoPE: the bits of rmsnorm on each part followed
// by rope (docs/contract.md §E.1, §E.2), the normalized values never stored. Needs D = 128,
// contiguous heads and 16-byte aligned rows (qk_norm_rope_supported); cos / sin as for rope.
bool qk_norm_rope_supported(const TensorView& qk);
void qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                  const TensorView& k_weight, const RmsNormConfig& cfg, const TensorView& positions,
                  const TensorView& cos, const TensorView& sin, void* stream = nullptr);

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out,
              void* stream = nullptr);
// silu_mul of the halves of gate_up [T, 2I] (out [T, I]), as cpu::silu_and_mul.
void silu_and_mul(const TensorView& gate_up, const TensorView& out, void* stream = nullptr);

// ids on the device: ids outside [0, V) cannot be checked before the launch; the kernel writes a
// canonical-NaN row for them (callers validate ids on the host).
void embedding(const TensorView& ids, const TensorView& table, const TensorView& out,
               void* stream = nullptr);
void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                              const VocabShard& shard, int64_t vocab, const TensorView& out,
                              void* stream = nullptr);
void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out,
                       void* stream = nullptr);

}  // namespace lockstep::cuda
