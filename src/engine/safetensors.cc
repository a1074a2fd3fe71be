// Safetensors reader/writer and sharded checkpoints. The reader checks the whole header against
// the file size before any tensor is touched: afterwards every (pointer, nbytes) it hands out lies
// inside the mapping (or inside an aligned copy), so no later access can go out of bounds.
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/thread_pool.h"
#include "engine/sha256.h"
#include "engine/text.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr uint64_t kMaxElements = uint64_t(1) << 62;
constexpr size_t kMaxShapeDims = 64;
constexpr int kMaxHeaderDepth = 16;  // a valid header is 3 deep

struct DTypeEntry {
  const char* name;
  int bits;
};
// The dtypes of the safetensors format (Rust crate 0.5 / Python package).
constexpr DTypeEntry kDTypes[] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32}, {"C64", 64},    {"F64", 64},
    {"I64", 64},    {"U64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

// Names from a damaged file can be long or odd: messages show at most 200 bytes, escaped. (Names
// are valid UTF-8: the JSON parser checked them.)
std::string shown(const std::string& name) { return printable(name, false); }

[[noreturn]] void fail(const std::string& file, const std::string& msg) {
  throw Error("safetensors " + file + ": " + msg);
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& name,
                              const std::string& msg) {
  throw Error("safetensors " + file + ": tensor '" + shown(name) + "': " + msg);
}

// Parses JSON text with a depth cap and duplicate-key detection (nlohmann keeps the last of
// duplicate keys silently; a header with two entries of one name is malformed).
json parse_json_checked(const char* begin, const char* end, const std::string& what) {
  // NOTE: nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows;
  // JSON text never holds a raw NUL, so one is an error here (as in the reference parser).
  if (const void* nul = std::memchr(begin, 0, size_t(end - begin)))
    throw Error(detail::concat(what, ": NUL byte at offset ", static_cast<const char*>(nul) - begin,
                               " of the JSON text"));
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object/array
  try {
    return json::parse(begin, end, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth > kMaxHeaderDepth)
        throw Error(detail::concat(what, ": JSON nested deeper than ", kMaxHeaderDepth));
      switch (ev) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
          keys.emplace_back();
          break;
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          if (!keys.empty()) keys.pop_back();
          break;
        case json::parse_event_t::key:
          if (!keys.empty() && parsed.is_string() &&
              !keys.back().insert(parsed.get_ref<const std::string&>()).second)
            throw Error(what + ": duplicate key '" + shown(parsed.get_ref<const std::string&>()) +
                        "'" + (keys.size() == 1 ? " (two entries with one name)" : ""));
          break;
        default:
          break;
      }
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(what + ": invalid JSON: " + printable(e.what(), true, 300));
  }
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& v,
                       uint64_t data_len) {
  if (!v.is_object())
    fail_tensor(
        file, name,
        "entry must be an object with dtype, shape and data_offsets, got " + describe(v, false));
  TensorInfo t;
  t.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end()) fail_tensor(file, name, "missing 'dtype'");
  if (!dt->is_string())
    fail_tensor(file, name, "'dtype' must be a string, got " + describe(*dt, false));
  t.dtype = dt->get<std::string>();
  int bits = safetensors_dtype_bits(t.dtype);
  if (bits == 0) fail_tensor(file, name, "unknown dtype \"" + shown(t.dtype) + "\"");

  auto sh = v.find("shape");
  if (sh == v.end()) fail_tensor(file, name, "missing 'shape'");
  if (!sh->is_array())
    fail_tensor(file, name, "'shape' must be a list, got " + describe(*sh, false));
  if (sh->size() > kMaxShapeDims)
    fail_tensor(file, name,
                detail::concat("'shape' has ", sh->size(), " dims (at most ", kMaxShapeDims, ")"));
  // The product of max(extent, 1) is capped, so no partial product of the shape can overflow.
  uint64_t numel = 1, capped = 1;
  for (const json& e : *sh) {
    auto d = as_u64(e);
    if (!d)
      fail_tensor(file, name, "'shape' extents must be integers >= 0, got " + describe(e, false));
    if (*d > kMaxElements || __builtin_mul_overflow(capped, std::max<uint64_t>(*d, 1), &capped) ||
        capped > kMaxElements)
      fail_tensor(file, name, "'shape' is too large (more than 2^62 elements)");
    numel *= *d;
    t.shape.push_back(int64_t(*d));
  }
  uint64_t nbits = 0;
  if (__builtin_mul_overflow(numel, uint64_t(bits), &nbits))
    fail_tensor(file, name, "'shape' is too large for its dtype");
  if (nbits % 8 != 0)
    fail_tensor(file, name,
                detail::concat("shape ", list_text(t.shape), " of ", t.dtype,
                               " is not a whole number of bytes"));
  const uint64_t nbytes = nbits / 8;

  auto off = v.find("data_offsets");
  if (off == v.end()) fail_tensor(file, name, "missing 'data_offsets'");
  if (!off->is_array() || off->size() != 2)
    fail_tensor(file, name, "'data_offsets' must be [begin, end], got " + describe(*off, false));
  auto b = as_u64((*off)[0]), e = as_u64((*off)[1]);
  if (!b || !e)
    fail_tensor(file, name,
                "'data_offsets' must be integers >= 0, got [" + describe((*off)[0], false) + ", " +
                    describe((*off)[1], false) + "]");
  std::string range = detail::concat("data_offsets [", *b, ", ", *e, "]");
  if (*b > *e) fail_tensor(file, name, range + ": begin is after end");
  if (*e > data_len)
    fail_tensor(file, name,
                detail::concat(range, " run past the end of the data buffer (", data_len,
                               " bytes; truncated file?)"));
  if (*e - *b != nbytes)
    fail_tensor(file, name,
                detail::concat(range, " hold ", *e - *b, " bytes, but ", t.dtype, " ",
                               list_text(t.shape), " needs ", nbytes, " bytes"));
  t.data_begin = *b;
  t.data_end = *e;
  return t;
}

// fp16 -> fp32, exact (NaN -> the canonical fp32 NaN).
float f16_to_f32(uint16_t x) {
  uint32_t sign = uint32_t(x & 0x8000u) << 16, exp = (x >> 10) & 0x1fu, man = x & 0x3ffu;
  if (exp == 0) {
    float v = float(man) * 0x1p-24f;  // zero or subnormal: man · 2^-24, exact
    return f32_from_bits(f32_bits(v) | sign);
  }
  if (exp == 31) return man ? f32_from_bits(kCanonicalNanF32) : f32_from_bits(sign | 0x7f800000u);
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

bool is_float_weight(const std::string& dtype) {
  return dtype == "BF16" || dtype == "F32" || dtype == "F16";
}

// Element i of a raw float weight as bf16: a bit copy from BF16 (NaN payload kept), else RNE.
bf16 raw_to_bf16(const std::string& dtype, const uint8_t* p, int64_t i) {
  uint16_t h;
  if (dtype == "BF16") {
    std::memcpy(&h, p + 2 * i, 2);
    return bf16{h};
  }
  if (dtype == "F16") {
    std::memcpy(&h, p + 2 * i, 2);
    return f32_to_bf16(f16_to_f32(h));
  }
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return f32_to_bf16(v);
}

}  // namespace

int safetensors_dtype_bits(const std::string& dtype) {
  for (const DTypeEntry& e : kDTypes)
    if (dtype == e.name) return e.bits;
  return 0;
}

std::optional<DType> safetensors_to_dtype(const std::string& dtype) {
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "F32") return DType::kF32;
  if (dtype == "I32") return DType::kI32;
  if (dtype == "I64") return DType::kI64;
  if (dtype == "U8") return DType::kU8;
  return std::nullopt;
}

const char* dtype_to_safetensors(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF32:
      return "F32";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  return nullptr;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const { return list_text(shape); }

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

struct SafetensorsFile::Impl {
  std::string path;
  std::vector<uint8_t> owned;  // from_bytes()
  void* map = nullptr;         // open()
  size_t map_size = 0;
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  uint64_t header_len = 0;
  const uint8_t* data = nullptr;  // the data buffer: base + 8 + header_len
  uint64_t data_len = 0;
  std::vector<TensorInfo> tensors;   // sorted by data offset
  std::vector<const uint8_t*> ptrs;  // per tensor: its bytes (mapping or copy)
  std::vector<Tensor> copies;        // aligned copies of misaligned tensors
  std::unordered_map<std::string, size_t> by_name;
  std::map<std::string, std::string> metadata;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (map) ::munmap(map, map_size);
  }

  void parse();
};

void SafetensorsFile::Impl::parse() {
  const std::string& file = path;
  if (size < 8)
    fail(file, detail::concat("file is ", size,
                              " bytes, too short for the 8-byte header length (truncated?)"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(base[i]) << (8 * i);
  if (n > kSafetensorsMaxHeader)
    fail(file, detail::concat("header length ", n, " exceeds the cap of ", kSafetensorsMaxHeader,
                              " bytes (corrupt, or not a safetensors file?)"));
  if (n > size - 8)
    fail(file, detail::concat("header length ", n, " runs past the end of the file (", size,
                              " bytes; truncated?)"));
  if (n < 2) fail(file, detail::concat("header length ", n, " is too small for a JSON object"));
  const char* h = reinterpret_cast<const char*>(base) + 8;
  if (h[0] != '{') fail(file, "header does not start with '{' (not a safetensors file?)");
  header_len = n;
  data = base + 8 + n;
  data_len = size - 8 - n;

  json j = parse_json_checked(h, h + n, "safetensors " + file + ": header");
  if (!j.is_object()) fail(file, "header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      if (!it->is_object())
        fail(file, "__metadata__ must be an object, got " + describe(*it, false));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          fail(file, "__metadata__ value of '" + shown(m.key()) + "' must be a string, got " +
                         describe(*m, false));
        metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (key.empty()) fail(file, "a tensor has an empty name");
    tensors.push_back(parse_entry(file, key, *it, data_len));
  }

  // The tensors must tile the data buffer: sorted by offset, each begins where the previous ended,
  // the last ends at the end of the file (as the reference implementation requires).
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    std::string range = detail::concat("data_offsets [", t.data_begin, ", ", t.data_end, "]");
    if (t.data_begin < pos)
      fail_tensor(file, t.name,
                  detail::concat(range, " overlap tensor '", shown(prev->name), "' [",
                                 prev->data_begin, ", ", prev->data_end, "]"));
    if (t.data_begin > pos)
      fail_tensor(
          file, t.name,
          detail::concat(range, " leave a gap of ", t.data_begin - pos, " bytes after ",
                         prev ? "tensor '" + shown(prev->name) + "'" : std::string("the header"),
                         " (tensors must tile the data buffer)"));
    pos = t.data_end;
    prev = &t;
  }
  if (pos != data_len)
    fail(file,
         detail::concat(data_len - pos, " bytes after the last tensor's data (the data buffer",
                        " is ", data_len, " bytes, the tensors cover ", pos, ")"));

  ptrs.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    if (!by_name.emplace(t.name, i).second) fail_tensor(file, t.name, "duplicate name");
    const uint8_t* p = data + t.data_begin;
    int bits = safetensors_dtype_bits(t.dtype);
    uint64_t align = bits >= 8 ? uint64_t(bits / 8) : 1;
    if (reinterpret_cast<uintptr_t>(p) % align != 0) {
      // NOTE: files written without header padding can put a tensor at an odd address; reading a
      // float there through a float* would be undefined behaviour, so it is copied once.
      Tensor c(DType::kU8, {int64_t(t.nbytes())});
      std::memcpy(c.data(), p, t.nbytes());
      p = c.ptr<uint8_t>();
      copies.push_back(std::move(c));
    }
    ptrs[i] = p;
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto im = std::make_shared<Impl>();
  im->path = path;
  FileHandle fd = open_regular_file(path, "safetensors " + path, &im->size);
  if (im->size >= 8) {
    void* m = ::mmap(nullptr, size_t(im->size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (m == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(errno));
    im->map = m;
    im->map_size = size_t(im->size);
    im->base = static_cast<const uint8_t*>(m);
  }
  im->parse();
  SafetensorsFile f;
  f.impl_ = std::move(im);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  auto im = std::make_shared<Impl>();
  im->path = name;
  im->owned = std::move(bytes);
  im->base = im->owned.data();
  im->size = im->owned.size();
  im->parse();
  SafetensorsFile f;
  f.impl_ = std::move(im);
  return f;
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
uint64_t SafetensorsFile::file_size() const { return impl_->size; }
uint64_t SafetensorsFile::header_size() const { return impl_->header_len; }
const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

const uint8_t* SafetensorsFile::raw(const TensorInfo& info) const {
  const auto& ts = impl_->tensors;
  // Accept only entries of this file (a TensorInfo copy is looked up by name).
  if (!ts.empty() && &info >= ts.data() && &info < ts.data() + ts.size())
    return impl_->ptrs[size_t(&info - ts.data())];
  const TensorInfo* own = find(info.name);
  if (!own) fail_tensor(impl_->path, info.name, "not in this file");
  return raw(*own);
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) fail(impl_->path, "missing tensor " + shown(name));
  return view(*info);
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  auto dt = safetensors_to_dtype(info.dtype);
  if (!dt)
    fail_tensor(impl_->path, info.name,
                "dtype " + info.dtype + " cannot be viewed as a lockstep tensor (BF16, F32, I32, " +
                    "I64 or U8)");
  if (info.shape.size() > size_t(kMaxDims))
    fail_tensor(
        impl_->path, info.name,
        detail::concat("has ", info.shape.size(), " dims; a TensorView holds at most ", kMaxDims));
  return TensorView::contiguous(const_cast<uint8_t*>(raw(info)), *dt, info.shape);
}

bool SafetensorsFile::verify_checksum() const {
  auto it = impl_->metadata.find(kDataSha256Key);
  if (it == impl_->metadata.end()) return false;
  std::string got = sha256_hex(impl_->data, size_t(impl_->data_len));
  if (got != it->second)
    fail(impl_->path, "data checksum mismatch: __metadata__ " + std::string(kDataSha256Key) +
                          " is " + shown(it->second) + ", the data hashes to " + got +
                          " (corrupt file)");
  return true;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

Checkpoint Checkpoint::open(const std::string& dir) {
  const std::string what = "checkpoint " + dir;
  require_directory(dir, what);
  Checkpoint c;
  c.dir_ = dir;
  c.finite_ = std::make_shared<FiniteCache>();
  fs::path d(dir);
  // Present (whatever its type: the open below refuses non-regular files), absent, or an error
  // such as a symlink loop.
  auto present = [&](const fs::path& p) { return stat_path(p.string(), what).has_value(); };
  if (!present(d / "config.json")) throw Error(what + ": config.json not found");
  c.config_ = load_qwen3_config((d / "config.json").string());

  const fs::path single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  if (present(single)) {
    c.index_ignored_ = present(index);
    c.files_.push_back(SafetensorsFile::open(single.string()));
    for (const TensorInfo& t : c.files_[0].tensors()) c.index_[t.name] = Entry{0, &t};
    return c;
  }
  if (!present(index))
    throw Error(what + ": neither model.safetensors nor model.safetensors.index.json found");

  const std::string iwhat = what + ": model.safetensors.index.json";
  std::string text = read_small_file(index.string(), kSafetensorsMaxHeader, what);
  json j = parse_json_checked(text.data(), text.data() + text.size(), iwhat);
  if (!j.is_object()) throw Error(iwhat + ": expected a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end()) throw Error(iwhat + ": missing 'weight_map'");
  if (!wm->is_object() || wm->empty())
    throw Error(iwhat + ": 'weight_map' must be a non-empty object, got " + describe(*wm, false));

  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::map<std::string, size_t> shard_ids;        // shard file name -> files_ index
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      throw Error(iwhat + ": weight_map['" + shown(it.key()) + "'] must be a file name, got " +
                  describe(*it, false));
    std::string f = it->get<std::string>();
    // Shards live in this directory: a path ("../x", "/etc/x") in an index is rejected.
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos || f.find('\0') != std::string::npos)
      throw Error(iwhat + ": weight_map['" + shown(it.key()) + "'] = '" + shown(f) +
                  "' is not a plain file name in the checkpoint directory");
    weight_map[it.key()] = f;
    shard_ids.emplace(f, 0);
  }
  for (auto& [f, id] : shard_ids) {
    fs::path p = d / f;
    if (!present(p)) {
      std::string example;
      for (const auto& [t, s] : weight_map)
        if (s == f) {
          example = t;
          break;
        }
      throw Error(what + ": shard '" + shown(f) + "' (listed in model.safetensors.index.json for " +
                  shown(example) + ") not found");
    }
    id = c.files_.size();
    c.files_.push_back(SafetensorsFile::open(p.string()));
  }
  for (const auto& [f, id] : shard_ids) {
    for (const TensorInfo& t : c.files_[id].tensors()) {
      auto prev = c.index_.find(t.name);
      if (prev != c.index_.end())
        throw Error(what + ": tensor '" + shown(t.name) + "' is in two shards: '" +
                    shown(c.files_[prev->second.file].path()) + "' and '" + shown(f) + "'");
      auto m = weight_map.find(t.name);
      if (m == weight_map.end())
        throw Error(what + ": tensor '" + shown(t.name) + "' in shard '" + shown(f) +
                    "' is not listed in weight_map");
      if (m->second != f)
        throw Error(what + ": weight_map puts '" + shown(t.name) + "' in '" + shown(m->second) +
                    "', but it is in '" + shown(f) + "'");
      c.index_[t.name] = Entry{id, &t};
    }
  }
  for (const auto& [t, f] : weight_map)
    if (!c.index_.count(t))
      throw Error(what + ": weight_map puts '" + shown(t) + "' in '" + shown(f) +
                  "', but that shard has no such tensor");
  return c;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [n, e] : index_) names.push_back(n);
  return names;
}

const Checkpoint::Entry& Checkpoint::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error("checkpoint " + dir_ + ": missing tensor " + shown(name));
  return it->second;
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return *entry(name).info; }

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  return files_[entry(name).file];
}

void Checkpoint::check_shape(const std::string& name, const TensorInfo& info,
                             const std::vector<int64_t>& shape) const {
  bool ok = info.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == info.shape[i];
  if (!ok)
    throw Error("checkpoint " + dir_ + ": tensor " + shown(name) + " has shape " +
                info.shape_string() + ", the config expects " + list_text(shape) +
                " (shape mismatch; the tensor is in " + files_[entry(name).file].path() + ")");
}

TensorView Checkpoint::get(const std::string& name, DType dtype,
                           const std::vector<int64_t>& shape) const {
  const Entry& e = entry(name);
  auto dt = safetensors_to_dtype(e.info->dtype);
  if (!dt || *dt != dtype)
    throw Error("checkpoint " + dir_ + ": tensor " + shown(name) + ": dtype " + e.info->dtype +
                " in " + files_[e.file].path() + ", expected " + dtype_to_safetensors(dtype) +
                (e.info->dtype == "BF16" || e.info->dtype == "F32" || e.info->dtype == "F16"
                     ? " (get_converted converts)"
                     : ""));
  check_shape(name, *e.info, shape);
  return files_[e.file].view(*e.info);
}

Tensor Checkpoint::get_converted(const std::string& name, DType dtype,
                                 const std::vector<int64_t>& shape) const {
  LS_CHECK(dtype == DType::kBF16 || dtype == DType::kF32, "Checkpoint::get_converted",
           "target dtype must be bf16 or f32, got ", dtype_name(dtype));
  const Entry& e = entry(name);
  const std::string& src = e.info->dtype;
  if (!is_float_weight(src))
    throw Error("checkpoint " + dir_ + ": tensor " + shown(name) + ": dtype " + src + " in " +
                files_[e.file].path() + " is not a float weight type (BF16, F32 or F16)");
  check_shape(name, *e.info, shape);
  const uint8_t* p = files_[e.file].raw(*e.info);
  const int64_t n = e.info->numel();
  Tensor out(dtype, e.info->shape);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kBF16) {
      out.ptr<bf16>()[i] = raw_to_bf16(src, p, i);  // bit copy from BF16 (NaN payload kept)
    } else if (src == "F32") {
      std::memcpy(out.ptr<float>() + i, p + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out.ptr<float>()[i] = src == "BF16" ? bf16_to_f32(bf16{h}) : f16_to_f32(h);
    }
  }
  return out;
}

struct Checkpoint::FiniteCache {
  std::mutex mu;
  std::set<std::string> done;  // tensors found finite
};

Checkpoint Checkpoint::load(const std::string& dir, const LoadOptions& opt, LoadReport* report) {
  Checkpoint c = open(dir);
  LoadReport r = c.check_qwen3(c.config(), opt);
  if (report) *report = std::move(r);
  return c;
}

namespace {

// The layer index i of a tensor named "model.layers.{i}.<rest>", or -1.
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t i = 0;
  size_t p = prefix.size();
  for (; p < name.size() && p < prefix.size() + 9 && name[p] >= '0' && name[p] <= '9'; ++p)
    i = i * 10 + (name[p] - '0');
  if (p == prefix.size() || p >= name.size() || name[p] != '.') return -1;
  return i;
}

// Up to 8 quoted names, then "(and N more)".
std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", '" : "'") + shown(names[i]) + "'";
  if (names.size() > 8) s += detail::concat(" (and ", names.size() - 8, " more)");
  return s;
}

// Index of the first element `bad` flags in p[0, n), or -1. The first pass only asks which 64K
// chunks hold a flagged element (a branch-free OR over the chunk, which the compiler vectorizes,
// chunks in parallel); the exact index is searched in the first such chunk.
template <typename T, typename Bad>
int64_t first_flagged(const T* p, int64_t n, Bad bad) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<int64_t> first{chunks};
  parallel_for(chunks, 4, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1 && c < first.load(std::memory_order_relaxed); ++c) {
      const T* q = p + c * kChunk;
      const int64_t len = std::min(kChunk, n - c * kChunk);
      unsigned any = 0;
      for (int64_t i = 0; i < len; ++i) any |= unsigned(bad(q[i]));
      if (any) {
        int64_t cur = first.load();
        while (c < cur && !first.compare_exchange_weak(cur, c)) {
        }
        return;
      }
    }
  });
  const int64_t c = first.load();
  if (c == chunks) return -1;
  for (int64_t i = c * kChunk; i < n; ++i)
    if (bad(p[i])) return i;
  return -1;
}

std::string fmt_float(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

// "[3, 17]": the multi-index of flat element i of `shape`.
std::string multi_index(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return list_text(idx);
}

}  // namespace

namespace {

// The first element of raw [n] (a float weight of safetensors dtype `dtype`) that is NaN or Inf,
// or an F32 value that rounds to Inf in bf16; -1 if none. *value describes it.
int64_t first_nonfinite(const std::string& dtype, const uint8_t* raw, int64_t n,
                        std::string* value) {
  int64_t bad = -1;
  if (dtype == "BF16") {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(raw);
    bad = first_flagged(p, n, [](uint16_t h) { return (h & 0x7f80u) == 0x7f80u; });
    if (bad >= 0)
      *value = fmt_float(bf16_to_f32(bf16{p[bad]})) +
               detail::concat(" (BF16 bits 0x", std::hex, p[bad], ")");
  } else if (dtype == "F16") {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(raw);
    bad = first_flagged(p, n, [](uint16_t h) { return (h & 0x7c00u) == 0x7c00u; });
    if (bad >= 0)
      *value =
          fmt_float(f16_to_f32(p[bad])) + detail::concat(" (F16 bits 0x", std::hex, p[bad], ")");
  } else {
    // F32: |x| >= 0x7f7f8000 (the midpoint between the largest bf16 and Inf) is Inf or NaN
    // already, or rounds to Inf when the load converts it to bf16.
    const uint32_t* p = reinterpret_cast<const uint32_t*>(raw);
    bad = first_flagged(p, n, [](uint32_t x) { return (x & 0x7fffffffu) >= 0x7f7f8000u; });
    if (bad >= 0) {
      float v;
      std::memcpy(&v, &p[bad], 4);
      *value = fmt_float(v) + detail::concat(" (F32 bits 0x", std::hex, p[bad], ")");
      if (std::isfinite(v)) *value += ", which overflows to Inf when rounded to bf16";
    }
  }
  return bad;
}

}  // namespace

void Checkpoint::check_finite(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(finite_->mu);
    if (finite_->done.count(name)) return;
  }
  const Entry& e = entry(name);
  const TensorInfo& t = *e.info;
  if (!is_float_weight(t.dtype))
    throw Error("checkpoint " + dir_ + ": tensor " + shown(name) + ": dtype " + t.dtype +
                " is not a float weight type (BF16, F32 or F16)");
  std::string value;
  const int64_t bad = first_nonfinite(t.dtype, files_[e.file].raw(t), t.numel(), &value);
  if (bad >= 0)
    throw Error(detail::concat("checkpoint ", dir_, ": tensor ", shown(name), " in ",
                               files_[e.file].path(), ": non-finite weight at index ", bad, " ",
                               multi_index(bad, t.shape), " of ", t.shape_string(), ": ", value,
                               " (the first one; a model with such a weight computes NaN)"));
  std::lock_guard<std::mutex> lock(finite_->mu);
  finite_->done.insert(name);
}

TensorView Checkpoint::get_block_bf16(const std::string& name, const std::vector<int64_t>& shape,
                                      const WeightBlock& block, bool check_finite,
                                      std::vector<Tensor>* keep) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.info;
  if (!is_float_weight(t.dtype))
    throw Error("checkpoint " + dir_ + ": tensor " + shown(name) + ": dtype " + t.dtype + " in " +
                files_[e.file].path() + " is not a float weight type (BF16, F32 or F16)");
  check_shape(name, t, shape);
  LS_CHECK(t.shape.size() == 1 || t.shape.size() == 2, "Checkpoint::get_block_bf16", "tensor ",
           shown(name), " has ", t.shape.size(), " dims: blocks are of 1-d or 2-d weights");
  // A 1-d weight is one row.
  const int64_t R = t.shape.size() == 2 ? t.shape[0] : 1, C = t.shape.back();
  const int64_t r0 = block.r0, r1 = block.r1 < 0 ? R : block.r1;
  const int64_t c0 = block.c0, c1 = block.c1 < 0 ? C : block.c1;
  LS_CHECK(0 <= r0 && r0 <= r1 && r1 <= R && 0 <= c0 && c0 <= c1 && c1 <= C,
           "Checkpoint::get_block_bf16", "tensor ", shown(name), ": block rows [", r0, ", ", r1,
           ") columns [", c0, ", ", c1, ") outside its shape ", t.shape_string());
  const uint8_t* raw = files_[e.file].raw(t);
  const size_t esize = t.dtype == "F32" ? 4 : 2;
  if (check_finite) {
    // Whole rows are one contiguous range; otherwise each row's columns are.
    const bool whole_rows = c0 == 0 && c1 == C;
    for (int64_t r = r0; r < r1; r += whole_rows ? (r1 - r0) : 1) {
      const int64_t n = whole_rows ? (r1 - r0) * C : c1 - c0;
      std::string value;
      const int64_t bad = first_nonfinite(t.dtype, raw + size_t(r * C + c0) * esize, n, &value);
      if (bad >= 0) {
        const int64_t flat = whole_rows ? r * C + bad : r * C + c0 + bad;
        throw Error(detail::concat(
            "checkpoint ", dir_, ": tensor ", shown(name), " in ", files_[e.file].path(),
            ": non-finite weight at index ", flat, " ", multi_index(flat, t.shape), " of ",
            t.shape_string(), ": ", value,
            " (the first one in this rank's shard; a model with such a weight computes NaN)"));
      }
    }
  }
  std::vector<int64_t> out_shape = {r1 - r0, c1 - c0};
  if (t.shape.size() == 1) out_shape = {c1 - c0};
  if (t.dtype == "BF16") {
    TensorView v = files_[e.file].view(t);  // zero-copy
    if (t.shape.size() == 1) {
      v.data = static_cast<char*>(v.data) + c0 * 2;
      v.shape[0] = c1 - c0;
      return v;
    }
    v = v.rows(r0, r1);
    v.data = static_cast<char*>(v.data) + c0 * 2;
    v.shape[1] = c1 - c0;
    return v;
  }
  Tensor out(DType::kBF16, out_shape);
  bf16* o = out.ptr<bf16>();
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) *o++ = raw_to_bf16(t.dtype, raw, r * C + c);
  keep->push_back(std::move(out));
  return keep->back().view();
}

LoadReport Checkpoint::check_qwen3(const Qwen3Config& cfg, const LoadOptions& opt) const {
  const std::string where = "checkpoint " + dir_ + ": ";
  const std::vector<WeightSpec> specs = qwen3_weight_specs(cfg);
  const int64_t L = cfg.num_hidden_layers;

  // Layer count first: a config with fewer layers would otherwise run the first L layers only.
  int64_t ckpt_layers = 0;  // 1 + the largest layer index of any tensor
  std::string example;      // a tensor of that layer
  for (const auto& [n, e] : index_) {
    const int64_t l = layer_of(n);
    if (l + 1 > ckpt_layers) ckpt_layers = l + 1, example = n;
  }
  if (ckpt_layers > L)
    throw Error(
        detail::concat(where, "the config has num_hidden_layers = ", L, ", but the checkpoint has ",
                       ckpt_layers, " layers (model.layers.0 .. model.layers.", ckpt_layers - 1,
                       ", e.g. '", shown(example), "'): config.json and the weights disagree"));

  std::vector<std::string> missing, other_dtype;
  std::set<std::string> used;
  const std::string want_dtype = cfg.torch_dtype == "bfloat16"  ? "BF16"
                                 : cfg.torch_dtype == "float32" ? "F32"
                                 : cfg.torch_dtype == "float16" ? "F16"
                                                                : "";
  for (const WeightSpec& w : specs) {
    auto it = index_.find(w.name);
    if (it == index_.end()) {
      missing.push_back(w.name);
      continue;
    }
    used.insert(w.name);
    const TensorInfo& t = *it->second.info;
    if (t.dtype != "BF16" && t.dtype != "F32" && t.dtype != "F16")
      throw Error(where + "tensor " + w.name + ": dtype " + t.dtype + " in " +
                  files_[it->second.file].path() + "; weights must be BF16, F32 or F16");
    check_shape(w.name, t, w.shape);
    if (!want_dtype.empty() && t.dtype != want_dtype) other_dtype.push_back(w.name);
  }
  if (!missing.empty()) {
    std::ostringstream os;
    os << where;
    const int64_t first_missing_layer = layer_of(missing[0]);
    if (ckpt_layers > 0 && ckpt_layers < L && first_missing_layer >= ckpt_layers) {
      os << "the config has num_hidden_layers = " << L << ", but the checkpoint has " << ckpt_layers
         << " layers (model.layers.0 .. model.layers." << ckpt_layers - 1 << "): it has no tensor "
         << missing[0];
    } else {
      os << "missing tensor " << missing[0];
    }
    if (missing.size() > 1) os << " (and " << missing.size() - 1 << " more)";
    os << "; the checkpoint has " << index_.size() << " tensors";
    if (!index_.empty()) os << ", e.g. '" << shown(index_.begin()->first) << "'";
    throw Error(os.str());
  }

  LoadReport report;
  for (const auto& [n, e] : index_)
    if (!used.count(n)) report.unused.push_back(n);
  auto warn = [&](const std::string& msg) {
    if (opt.strict) throw Error(msg + " (strict load: warnings are errors)");
    report.warnings.push_back(msg);
    if (opt.warn) opt.warn(msg);
  };
  if (!report.unused.empty()) {
    std::string msg =
        detail::concat(where, report.unused.size(), " tensor", report.unused.size() == 1 ? "" : "s",
                       " the config does not use (ignored): ", name_list(report.unused));
    if (cfg.tie_word_embeddings && index_.count("lm_head.weight"))
      msg +=
          "; tie_word_embeddings is true, so the head is model.embed_tokens.weight, not "
          "lm_head.weight";
    warn(msg);
  }
  if (!other_dtype.empty()) {
    const std::string& ex = other_dtype[0];
    warn(detail::concat(where, other_dtype.size(), " weight", other_dtype.size() == 1 ? "" : "s",
                        " not stored as the config's torch_dtype ", cfg.torch_dtype, " (",
                        want_dtype, "), e.g. '", ex, "' is ", index_.at(ex).info->dtype,
                        "; every weight is converted to bf16 at load"));
  }
  if (index_ignored_)
    warn(where +
         "model.safetensors and model.safetensors.index.json both exist: model.safetensors is "
         "loaded and the index (and its shards) ignored, as transformers does");
  if (opt.verify_checksums)
    for (const SafetensorsFile& f : files_) f.verify_checksum();
  if (opt.check_finite)
    for (const WeightSpec& w : specs) check_finite(w.name);
  return report;
}

std::vector<std::string> Checkpoint::check_qwen3_weights() const {
  LoadOptions opt;
  opt.check_finite = false;
  return check_qwen3(config_, opt).unused;
}

// ---------------------------------------------------------------------------------------------
// Writer

std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const char* op = "write_safetensors";
  LS_CHECK(!metadata.count(kDataSha256Key), op, "metadata key '", kDataSha256Key,
           "' is reserved (the writer sets it)");
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    LS_CHECK(!t.name.empty(), op, "a tensor has an empty name");
    LS_CHECK(t.name != "__metadata__", op, "'__metadata__' is not a tensor name");
    LS_CHECK(names.insert(t.name).second, op, "duplicate tensor name '", t.name, "'");
    LS_CHECK(t.tensor.device == Device::kCPU, op, "tensor '", t.name, "' is not on the CPU");
    LS_CHECK(t.tensor.ndim >= 0 && t.tensor.ndim <= kMaxDims, op, "tensor '", t.name,
             "' has a bad ndim ", t.tensor.ndim);
    for (int i = 0; i < t.tensor.ndim; ++i)
      LS_CHECK(t.tensor.shape[i] >= 0, op, "tensor '", t.name, "' has a negative extent");
    LS_CHECK(t.tensor.numel() == 0 || t.tensor.data != nullptr, op, "tensor '", t.name,
             "' has a null data pointer");
  }
  // Largest elements first, then by name: every tensor starts at a multiple of its element size.
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    int64_t sa = dtype_size(a->tensor.dtype), sb = dtype_size(b->tensor.dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  std::vector<uint8_t> data;
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  for (const NamedTensor* t : order) {
    const TensorView& v = t->tensor;
    const int64_t es = dtype_size(v.dtype), n = v.numel();
    uint64_t begin = data.size();
    data.resize(size_t(begin + uint64_t(n * es)));
    uint8_t* dst = data.data() + begin;
    if (v.is_contiguous()) {
      if (n) std::memcpy(dst, v.data, size_t(n * es));
    } else {
      int64_t idx[kMaxDims] = {};
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (int d = 0; d < v.ndim; ++d) off += idx[d] * v.stride[d];
        std::memcpy(dst + i * es, static_cast<const uint8_t*>(v.data) + off * es, size_t(es));
        for (int d = v.ndim - 1; d >= 0 && ++idx[d] == v.shape[d]; --d) idx[d] = 0;
      }
    }
    offsets.emplace_back(begin, data.size());
  }

  ojson header = ojson::object();
  ojson meta = ojson::object();
  std::map<std::string, std::string> all = metadata;
  all[kDataSha256Key] = sha256_hex(data.data(), data.size());
  for (const auto& [k, val] : all) meta[k] = val;
  header["__metadata__"] = std::move(meta);
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorView& v = order[i]->tensor;
    std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
    header[order[i]->name] = ojson{{"dtype", dtype_to_safetensors(v.dtype)},
                                   {"shape", shape},
                                   {"data_offsets", {offsets[i].first, offsets[i].second}}};
  }
  std::string hs;
  try {
    hs = header.dump();
  } catch (const ojson::exception& e) {
    throw Error(std::string(op) +
                ": cannot encode the header (tensor names and metadata must be "
                "UTF-8): " +
                e.what());
  }
  hs.append((8 - hs.size() % 8) % 8, ' ');

  std::vector<uint8_t> out(8 + hs.size() + data.size());
  const uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, hs.data(), hs.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + hs.size(), data.data(), data.size());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes = serialize_safetensors(tensors, metadata);
  write_file_atomic(path, bytes.data(), bytes.size());
}

}  // namespace lockstep::engine
