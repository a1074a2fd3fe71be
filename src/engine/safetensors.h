// Safetensors files (single and sharded checkpoints): a bounds-checked reader that exposes tensors
// as zero-copy TensorViews into a read-only mapping, and an atomic writer. Every malformed input
// (truncation, bad header length, bad JSON, wrong types, overflowing shapes, offsets out of range,
// overlapping or leaving gaps, duplicate names, ...) is a lockstep::Error naming the file, the
// tensor and the problem; never a crash. Formats and messages: docs/model-files.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/file_io.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

// Largest accepted JSON header (the reference implementation's cap).
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
// Metadata key the writer adds: sha256 (hex) of the data buffer that follows the header.
constexpr const char* kDataSha256Key = "lockstep_data_sha256";

// Bits per element of a safetensors dtype ("BF16" -> 16, "F4" -> 4), 0 if the name is unknown.
int safetensors_dtype_bits(const std::string& dtype);
// The lockstep dtype a safetensors dtype maps to (BF16, F32, I32, I64, U8), if any.
std::optional<DType> safetensors_to_dtype(const std::string& dtype);
// The safetensors name of a lockstep dtype ("BF16", "F32", "I32", "I64", "U8").
const char* dtype_to_safetensors(DType dtype);

// One tensor entry of a header.
struct TensorInfo {
  std::string name;
  std::string dtype;           // as written: "BF16", "F32", "F16", "I64", ...
  std::vector<int64_t> shape;  // may be empty (a 0-d scalar) or contain zeros
  uint64_t data_begin = 0;     // byte range [data_begin, data_end) of the data buffer
  uint64_t data_end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return data_end - data_begin; }
  std::string shape_string() const;  // "[384, 128]"
};

// One .safetensors file. Cheap to copy (shared state, immutable after open, so safe to read from
// several threads); views and raw pointers stay valid while any copy lives. The file is mapped
// read-only: never write through a view. NOTE: a file truncated by another process while mapped can
// still fault (SIGBUS); every check here is against the size seen at open.
class SafetensorsFile {
 public:
  // Maps `path` and validates the whole header against the file size.
  static SafetensorsFile open(const std::string& path);
  // Same checks on bytes in memory (tests, fuzzing); `name` stands for the path in messages.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, const std::string& name);

  const std::string& path() const;
  uint64_t file_size() const;
  uint64_t header_size() const;                           // N, the JSON header length
  const std::vector<TensorInfo>& tensors() const;         // sorted by data offset
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const;

  // Zero-copy, contiguous view of a tensor whose dtype maps to a lockstep DType (else Error naming
  // the dtype). A tensor whose offset is misaligned for its dtype was copied at open into an
  // aligned buffer owned by this object, and the view points there.
  TensorView view(const std::string& name) const;
  TensorView view(const TensorInfo& info) const;
  // The tensor's bytes (any dtype), nbytes() long; aligned copies as for view().
  const uint8_t* raw(const TensorInfo& info) const;

  // If the metadata holds kDataSha256Key, recomputes the data buffer's sha256 and throws Error on
  // mismatch; returns false when there is no checksum to verify.
  bool verify_checksum() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// How a checkpoint is checked against a config (Checkpoint::load, Checkpoint::check_qwen3).
struct LoadOptions {
  // Every warning is an Error (the CLI's --strict).
  bool strict = false;
  // Scan every weight the config uses for NaN/Inf (and f32 values that overflow bf16): one pass
  // over the data, parallel, vectorized. Done once per tensor per Checkpoint (and its copies).
  bool check_finite = true;
  // Recompute the sha256 of every file that records one (kDataSha256Key; lockstep's writer adds
  // it) and refuse a mismatch. A full hash of the data (~0.5 GB/s): off by default.
  bool verify_checksums = false;
  // Receives each warning as one line (no trailing newline); nullptr: warnings are only returned
  // in the LoadReport. The library never prints by itself.
  std::function<void(const std::string&)> warn;
};

// What a check found that is not an error.
struct LoadReport {
  std::vector<std::string> unused;    // checkpoint tensors the config does not use, sorted
  std::vector<std::string> warnings;  // every warning, as given to LoadOptions::warn
};

// Rows [r0, r1) and columns [c0, c1) of a weight (r1, c1 = -1: to the end); a 1-d weight is one
// row of columns.
struct WeightBlock {
  int64_t r0 = 0, r1 = -1, c0 = 0, c1 = -1;
};

// A model directory: config.json plus model.safetensors, or model.safetensors.index.json and the
// shards its weight_map names (model.safetensors wins if both exist, as in transformers).
class Checkpoint {
 public:
  // Opens the directory's files and parses config.json; checks only the files themselves (any
  // tensor set is accepted: see check_qwen3 / load for the model checks). Every file is opened
  // with open_regular_file (FIFOs, devices and directories refused before reading).
  static Checkpoint open(const std::string& dir);
  // open() + check_qwen3(config(), opt): what a model load should use. `report` (optional)
  // receives what the check found.
  static Checkpoint load(const std::string& dir, const LoadOptions& opt = {},
                         LoadReport* report = nullptr);

  const Qwen3Config& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws "checkpoint <dir>: missing tensor <name>".
  const TensorInfo& info(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;

  // Zero-copy view, checked: present, dtype == `dtype` and shape == `shape` (-1 matches any
  // extent), else Error ("missing tensor ...", "tensor X: dtype F32, expected bf16 ...",
  // "tensor X: shape mismatch: expected [...] (from config.json), got [...]").
  TensorView get(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  // Same checks, except the file may hold BF16, F32 or F16, converted into a new tensor of
  // `dtype` (kBF16 or kF32): exact widening, or round-to-nearest-even to bf16 (NaN -> 0x7FC0).
  Tensor get_converted(const std::string& name, DType dtype,
                       const std::vector<int64_t>& shape) const;

  // A block of a 1-d or 2-d float weight as bf16, reading only the block's bytes (a rank-local
  // model loads its shard this way): the same checks as get(), then, with check_finite, the
  // block's elements scanned as check_qwen3 scans whole tensors (Error naming the tensor and the
  // first bad element's index), then a zero-copy view of a BF16 tensor (rows strided), or the
  // block converted (F32 / F16, RNE) into a new tensor appended to *keep.
  TensorView get_block_bf16(const std::string& name, const std::vector<int64_t>& shape,
                            const WeightBlock& block, bool check_finite,
                            std::vector<Tensor>* keep) const;

  // Checks the checkpoint against `cfg` before any weight is used. Errors (lockstep::Error):
  //   - the layer count: tensors model.layers.{i}.* with i >= num_hidden_layers, or a config with
  //     more layers than the checkpoint holds (both counts named);
  //   - every tensor of qwen3_weight_specs(cfg): present, the expected shape, a float dtype (BF16,
  //     F32 or F16);
  //   - with opt.check_finite: a NaN or Inf in a used weight, or an F32 value that rounds to Inf
  //     in bf16 (the tensor, the first bad index and its value named);
  //   - with opt.strict: any warning.
  // Warnings (to opt.warn and the report): tensors the config does not use (e.g. lm_head.weight
  // in a tied checkpoint, rotary_emb.inv_freq), weights stored in a float dtype other than the
  // config's torch_dtype, and a model.safetensors.index.json ignored because model.safetensors
  // exists too. With opt.verify_checksums, a checksum mismatch is an error.
  LoadReport check_qwen3(const Qwen3Config& cfg, const LoadOptions& opt = {}) const;
  // check_qwen3(config(), no finite scan, not strict): the names of unused tensors, sorted.
  std::vector<std::string> check_qwen3_weights() const;

 private:
  struct Entry {
    size_t file = 0;
    const TensorInfo* info = nullptr;
  };
  Checkpoint() = default;
  const Entry& entry(const std::string& name) const;
  void check_shape(const std::string& name, const TensorInfo& info,
                   const std::vector<int64_t>& shape) const;

  void check_finite(const std::string& name) const;

  std::string dir_;
  Qwen3Config config_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry> index_;
  bool index_ignored_ = false;  // model.safetensors.index.json exists but model.safetensors won
  // Names of the tensors already scanned for non-finite values, shared by copies.
  struct FiniteCache;
  std::shared_ptr<FiniteCache> finite_;
};

// Writer. Tensors (CPU views of any dtype with a safetensors name; any strides) are written
// contiguously, ordered by element size (largest first) then name, so every tensor is naturally
// aligned; the header is compact JSON with "__metadata__" first (user metadata plus
// kDataSha256Key), padded with spaces to a multiple of 8. Same input -> same bytes.
struct NamedTensor {
  std::string name;
  TensorView tensor;
};
std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
// serialize_safetensors + write_file_atomic (engine/file_io.h).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace lockstep::engine
