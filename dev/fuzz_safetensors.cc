// libFuzzer target for the model-file readers (not built by CMake). Any input must either parse or
// throw lockstep::Error; anything else (a crash, a sanitizer report, another exception, a leak) is
// a bug. Everything a parsed file hands out is read end to end so ASan sees stray pointers.
//
// Build and run (clang with libFuzzer; see docs/model-files.md "Fuzzing"):
//   mkdir -p build-fuzz/corpus
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
//     -Iinclude -Isrc dev/fuzz_safetensors.cc src/engine/safetensors.cc src/engine/config.cc \
//     src/core/tensor.cc -o build-fuzz/fuzz_safetensors
//   build-fuzz/fuzz_safetensors -dict=dev/fuzz_safetensors.dict -max_len=4096 \
//     -max_total_time=60 build-fuzz/corpus
// Add -DLOCKSTEP_FUZZ_CONFIG to fuzz the config.json parser instead.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/safetensors.h"
#include "lockstep/error.h"

namespace {

volatile uint64_t g_sink;

#ifdef LOCKSTEP_FUZZ_CONFIG
void fuzz_one(const uint8_t* data, size_t size) {
  using namespace lockstep::engine;
  Qwen3Config c =
      parse_qwen3_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  // A config that parses is valid, prints, writes, and reads back to the same values.
  Qwen3Config back = parse_qwen3_config(c.to_json(), "fuzz-roundtrip");
  if (back.to_string() != c.to_string()) __builtin_trap();
  g_sink = g_sink + uint64_t(qwen3_weight_specs(c).size());
}
#else
void fuzz_one(const uint8_t* data, size_t size) {
  using namespace lockstep;
  using namespace lockstep::engine;
  SafetensorsFile f = SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
  uint64_t sum = 0, total = 0;
  for (const TensorInfo& t : f.tensors()) {
    const uint8_t* p = f.raw(t);
    for (uint64_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    total += t.nbytes();
    if (f.find(t.name) != &t) __builtin_trap();
    if (safetensors_to_dtype(t.dtype) && t.shape.size() <= size_t(kMaxDims)) {
      TensorView v = f.view(t);
      if (uint64_t(v.numel() * dtype_size(v.dtype)) != t.nbytes()) __builtin_trap();
    }
  }
  // The tensors tile the data buffer exactly.
  if (8 + f.header_size() + total != f.file_size()) __builtin_trap();
  f.verify_checksum();
  g_sink = g_sink + sum;
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fuzz_one(data, size);
  } catch (const lockstep::Error&) {
    // The expected outcome for malformed input.
  }
  return 0;
}
