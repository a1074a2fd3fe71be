// ContractConfig validation and printing.
#include <sstream>

#include "lockstep/contract.h"
#include "lockstep/error.h"

namespace lockstep {

const char* const kContractVersion = "0.6";

void ContractConfig::validate() const {
  auto pow2_upto8 = [](int s) { return s == 1 || s == 2 || s == 4 || s == 8; };
  LS_CHECK(pow2_upto8(gemm_segments), "ContractConfig", "gemm_segments must be 1, 2, 4 or 8, got ",
           gemm_segments);
  LS_CHECK(kv_chunk >= 64 && kv_chunk % 64 == 0, "ContractConfig",
           "kv_chunk must be a positive multiple of 64, got ", kv_chunk);
  LS_CHECK(vocab_tile >= 8 && vocab_tile % 8 == 0, "ContractConfig",
           "vocab_tile must be a positive multiple of 8, got ", vocab_tile);
  LS_CHECK(pow2_upto8(vocab_segments), "ContractConfig",
           "vocab_segments must be 1, 2, 4 or 8, got ", vocab_segments);
}

std::string ContractConfig::to_string() const {
  std::ostringstream os;
  os << "contract " << kContractVersion << ": gemm_segments=" << gemm_segments
     << " kv_chunk=" << kv_chunk << " vocab_tile=" << vocab_tile
     << " vocab_segments=" << vocab_segments;
  return os.str();
}

}  // namespace lockstep
