// Rotary position embedding, Qwen3/HF "rotate_half" layout (pairs (i, i + D/2)). cos/sin come from
// a table built once on the host in double and rounded to fp32 (never device math); the rotation
// is fp32 with separate mul and add (no fma) and one rounding to bf16. Each (token, head) row is
// computed alone: bits depend only on the row, its position and the table. Normative text:
// docs/contract.md §E "RoPE".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep {

struct RopeConfig {
  int64_t head_dim = 128;         // D: even, >= 2; the whole head is rotated
  double theta = 1e6;             // rope_theta from the model config (Qwen3: 1e6)
  int64_t max_positions = 40960;  // table rows: positions 0 .. max_positions-1

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "rope: head_dim=128 theta=1000000 max_positions=40960"
};

// cos/sin table, [max_positions, D/2] fp32 each, row-major:
//   inv_freq_i = 1.0 / pow(theta, (2i) / D)          (double; (2i)/D a double division)
//   angle      = double(pos) * inv_freq_i           (double)
//   cos[pos,i] = float(cos(angle)), sin[pos,i] = float(sin(angle))   (double libm, RNE to fp32)
// Built on the host; a GPU backend uploads these exact bits. to_string() includes a hash of the
// table bits so two processes (rollout, training) can confirm they hold the same table.
struct RopeTable {
  RopeConfig config;
  std::vector<float> cos;  // [max_positions, D/2]
  std::vector<float> sin;  // [max_positions, D/2]

  static RopeTable build(const RopeConfig& config);
  int64_t half_dim() const { return config.head_dim / 2; }
  uint64_t hash() const;          // FNV-1a 64 over the cos bits, then the sin bits
  std::string to_string() const;  // config + " table_fnv1a=0x..."
  TensorView cos_view() const;    // f32 [max_positions, D/2]
  TensorView sin_view() const;
};

}  // namespace lockstep
