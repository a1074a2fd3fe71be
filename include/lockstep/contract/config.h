// The contract's version and its model-level settings. Every setting that can change bits lives
// here, is chosen by the deployment (never by batch size, thread count or SM count), and prints.
// The normative text is docs/contract.md.
#pragma once

#include <string>

namespace lockstep {

// The contract's version (docs/contract.md "Versions"), defined in src/contract/config.cc so that
// a bump rebuilds one file.
extern const char* const kContractVersion;

struct ContractConfig {
  // GEMM: K of a row-parallel layer (o_proj, down_proj) is cut into `gemm_segments` equal
  // segments (1, 2, 4 or 8: the deployment's maximum tensor-parallel degree); segment partials
  // combine in a balanced binary tree. Column-parallel layers (q|k|v, gate|up) and the lm_head
  // reduce K in one segment (0.3; GemmConfig::for_layer). The column-parallel dX of the backward
  // uses gemm_segments over N (B.2).
  int gemm_segments = 1;
  // Attention: keys per canonical KV chunk (a multiple of the 64-key block).
  int kv_chunk = 1024;
  // Linear log-prob: vocab entries per tile, and the number of vocab segments (tree-combined).
  int vocab_tile = 256;
  int vocab_segments = 1;

  void validate() const;          // throws lockstep::Error on a bad setting
  std::string to_string() const;  // one line, e.g. "contract 0.3: gemm_segments=1 ..."
};

}  // namespace lockstep
