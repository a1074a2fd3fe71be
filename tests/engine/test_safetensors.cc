// Safetensors: writer/reader round trips (bf16/f32/ints, empty and 0-d tensors, strided input),
// one hand-built file per malformed case with the error it must give, a randomized mutation test
// (only lockstep::Error, never a crash), checkpoints (single, sharded) and their errors.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "engine/backend.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

namespace fs = std::filesystem;

// A file from a header string and `data_len` bytes of data (0, 1, 2, ...).
std::vector<uint8_t> st_bytes(const std::string& header, size_t data_len = 0) {
  std::vector<uint8_t> b(8 + header.size() + data_len);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(uint64_t(header.size()) >> (8 * i));
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_len; ++i) b[8 + header.size() + i] = uint8_t(i);
  return b;
}

// Expects from_bytes to throw an Error that names the file and contains every needle.
void expect_st_error(const std::vector<uint8_t>& bytes,
                     std::initializer_list<const char*> needles) {
  try {
    SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "bad.safetensors");
    ADD_FAILURE() << "expected an error; parsed " << f.tensors().size() << " tensors";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("safetensors bad.safetensors: ", 0), 0u) << msg;
    for (const char* n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}
void expect_header_error(const std::string& header, size_t data_len,
                         std::initializer_list<const char*> needles) {
  SCOPED_TRACE(header);
  expect_st_error(st_bytes(header, data_len), needles);
}

// A unique scratch directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::path(::testing::TempDir()) /
           (std::string("lockstep_st_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

template <typename Fn>
void expect_error_containing(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

// ---------------------------------------------------------------------------------------------

TEST(Safetensors, DTypeTables) {
  EXPECT_EQ(safetensors_dtype_bits("BF16"), 16);
  EXPECT_EQ(safetensors_dtype_bits("F32"), 32);
  EXPECT_EQ(safetensors_dtype_bits("F8_E4M3"), 8);
  EXPECT_EQ(safetensors_dtype_bits("F4"), 4);
  EXPECT_EQ(safetensors_dtype_bits("bf16"), 0);  // names are case-sensitive
  EXPECT_EQ(safetensors_to_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(safetensors_to_dtype("F16"), std::nullopt);
  for (DType d : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64, DType::kU8})
    EXPECT_EQ(safetensors_to_dtype(dtype_to_safetensors(d)), d);
}

TEST(Safetensors, RoundTripManyShapes) {
  auto g = test::rng(1);
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {3}, {17, 5}, {2, 3, 4}, {1, 1, 1, 1, 1, 1}, {0, 7}, {111}, {4, 0, 3}, {989}};
  std::vector<Tensor> owned;
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (DType d : {DType::kBF16, DType::kF32, DType::kI32, DType::kI64, DType::kU8}) {
      Tensor t(d, shapes[i]);
      auto* p = t.ptr<uint8_t>();
      for (int64_t b = 0; b < t.nbytes(); ++b) p[b] = uint8_t(g());
      named.push_back({std::string("t") + std::to_string(i) + "." + dtype_name(d), t.view()});
      owned.push_back(std::move(t));
    }
  }
  std::vector<uint8_t> bytes = serialize_safetensors(named, {{"format", "pt"}, {"note", "x"}});
  EXPECT_EQ(serialize_safetensors(named, {{"format", "pt"}, {"note", "x"}}),
            bytes);  // deterministic

  TempDir dir;
  write_safetensors(dir / "rt.safetensors", named, {{"format", "pt"}, {"note", "x"}});
  for (int mode = 0; mode < 2; ++mode) {
    SafetensorsFile f = mode == 0 ? SafetensorsFile::from_bytes(bytes, "mem")
                                  : SafetensorsFile::open(dir / "rt.safetensors");
    EXPECT_EQ(f.file_size(), bytes.size());
    EXPECT_EQ((8 + f.header_size()) % 8, 0u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "x");
    EXPECT_TRUE(f.verify_checksum());
    ASSERT_EQ(f.tensors().size(), named.size());
    for (const NamedTensor& n : named) {
      const TensorInfo* info = f.find(n.name);
      ASSERT_NE(info, nullptr) << n.name;
      TensorView v = f.view(n.name);
      EXPECT_EQ(v.dtype, n.tensor.dtype) << n.name;
      EXPECT_EQ(v.shape_string(), n.tensor.shape_string()) << n.name;
      EXPECT_TRUE(v.is_contiguous());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % uintptr_t(dtype_size(v.dtype)), 0u);
      EXPECT_EQ(int64_t(info->nbytes()), n.tensor.numel() * dtype_size(n.tensor.dtype));
      if (v.numel() > 0) {
        EXPECT_BITWISE_EQ(v.data, n.tensor.data, v.numel(), v.dtype);
      }
    }
  }
}

TEST(Safetensors, WriterGathersStridedViews) {
  auto g = test::rng(2);
  Tensor base = test::random_f32({6, 5}, g);
  TensorView every_other = base.view();
  every_other.shape[0] = 3;
  every_other.stride[0] = 10;  // rows 0, 2, 4
  TensorView column = base.view();
  column.ndim = 1;
  column.shape[0] = 6;
  column.stride[0] = 5;  // column 0
  SafetensorsFile f = SafetensorsFile::from_bytes(
      serialize_safetensors({{"rows", every_other}, {"col", column}}), "mem");
  TensorView r = f.view("rows"), c = f.view("col");
  for (int i = 0; i < 3; ++i)
    EXPECT_BITWISE_EQ(r.ptr<float>() + 5 * i, base.ptr<float>() + 10 * i, 5, DType::kF32);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.ptr<float>()[i], base.ptr<float>()[5 * i]);
}

TEST(Safetensors, WriterRejectsBadInput) {
  Tensor t(DType::kF32, {2});
  t.ptr<float>()[0] = t.ptr<float>()[1] = 1.0f;
  expect_error_containing(
      [&] {
        serialize_safetensors({{"a", t.view()}, {"a", t.view()}});
      },
      {"duplicate tensor name 'a'"});
  expect_error_containing([&] { serialize_safetensors({{"", t.view()}}); }, {"empty name"});
  expect_error_containing(
      [&] {
        serialize_safetensors({{"__metadata__", t.view()}});
      },
      {"'__metadata__' is not a tensor name"});
  expect_error_containing(
      [&] {
        serialize_safetensors({{"a", t.view()}}, {{kDataSha256Key, "0"}});
      },
      {"reserved"});
  TensorView gpu = t.view();
  gpu.device = Device::kCUDA;
  expect_error_containing([&] { serialize_safetensors({{"a", gpu}}); }, {"not on the CPU"});
  TensorView null = t.view();
  null.data = nullptr;
  expect_error_containing([&] { serialize_safetensors({{"a", null}}); }, {"null data pointer"});
  expect_error_containing([&] { serialize_safetensors({{"bad\xff name", t.view()}}); }, {"UTF-8"});
  // The writer never leaves a partial file: a failed write leaves nothing behind.
  expect_error_containing([&] { write_safetensors("/nonexistent-dir/x.safetensors", {}); },
                          {"write /nonexistent-dir/x.safetensors", "cannot create"});
}

TEST(Safetensors, AtomicWriteReplacesAndLeavesNoTemporaries) {
  TempDir dir;
  write_file_atomic(dir / "f", "old", 3);
  write_file_atomic(dir / "f", "new contents", 12);
  std::ifstream in(dir / "f");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "new contents");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

// A file as the Python package writes it (F16 and I8 tensors are listed but not viewable).
TEST(Safetensors, ReadsForeignDtypesAndMetadata) {
  std::string h =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("q":{"dtype":"I8","shape":[3],"data_offsets":[8,11]},)"
      R"("s":{"dtype":"F8_E4M3","shape":[],"data_offsets":[11,12]},)"
      R"("p":{"dtype":"F4","shape":[4],"data_offsets":[12,14]}})";
  SafetensorsFile f = SafetensorsFile::from_bytes(st_bytes(h, 14), "foreign.safetensors");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "w");  // sorted by offset
  EXPECT_EQ(f.find("w")->dtype, "F16");
  EXPECT_EQ(f.find("s")->shape.size(), 0u);
  EXPECT_EQ(f.find("p")->nbytes(), 2u);
  EXPECT_FALSE(f.verify_checksum());  // no checksum in the metadata
  EXPECT_EQ(f.raw(*f.find("q"))[0], 8);
  expect_error_containing(
      [&] { f.view("w"); },
      {"safetensors foreign.safetensors: tensor 'w': dtype F16 cannot be viewed"});
  expect_error_containing([&] { f.view("nope"); }, {"missing tensor nope"});
}

// A header whose length is not a multiple of 8 puts tensors at odd addresses: they are copied
// into aligned storage, contents intact.
TEST(Safetensors, MisalignedDataIsCopied) {
  for (int pad = 0; pad < 8; ++pad) {
    std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                    R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[12,14]},)"
                    R"("c":{"dtype":"I64","shape":[1],"data_offsets":[14,22]}})" +
                    std::string(size_t(pad), ' ');
    std::vector<uint8_t> bytes = st_bytes(h, 22);
    SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "odd");
    const uint8_t* data = bytes.data() + 8 + h.size();
    for (const char* name : {"a", "b", "c"}) {
      const TensorInfo& info = *f.find(name);
      TensorView v = f.view(name);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % uintptr_t(dtype_size(v.dtype)), 0u) << name;
      EXPECT_EQ(std::memcmp(v.data, data + info.data_begin, info.nbytes()), 0) << name;
    }
  }
}

TEST(Safetensors, ViewLimits) {
  std::string h = R"({"seven":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})";
  SafetensorsFile f = SafetensorsFile::from_bytes(st_bytes(h, 4), "7d");
  EXPECT_EQ(f.find("seven")->shape.size(), 7u);  // listed
  expect_error_containing([&] { f.view("seven"); }, {"has 7 dims", "at most 6"});
}

TEST(Safetensors, ChecksumCatchesFlippedData) {
  Tensor t(DType::kF32, {4});
  for (int i = 0; i < 4; ++i) t.ptr<float>()[i] = float(i) + 0.5f;
  std::vector<uint8_t> bytes = serialize_safetensors({{"a", t.view()}});
  EXPECT_TRUE(SafetensorsFile::from_bytes(bytes, "ok").verify_checksum());
  bytes.back() ^= 1;  // still a structurally valid file
  SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "flipped");
  expect_error_containing([&] { f.verify_checksum(); }, {"flipped", "data checksum mismatch"});
}

TEST(Safetensors, MalformedFiles) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // Size and header length.
  expect_st_error({}, {"file is 0 bytes, too short", "truncated"});
  expect_st_error({1, 0, 0, 0, 0}, {"file is 5 bytes"});
  {
    std::vector<uint8_t> b = st_bytes(ok, 8);
    b[4] = 1;  // 2^32 + length
    expect_st_error(b, {"header length 4294967", "exceeds the cap of 100000000"});
    b = st_bytes(ok, 8);
    b[0] = uint8_t(b[0] + 100);
    expect_st_error(b, {"runs past the end of the file", "truncated"});
    std::vector<uint8_t> pk = {'P', 'K', 3, 4, 20, 0, 0, 0, 0, 0};  // a zip (torch .bin)
    expect_st_error(pk, {"header length", "not a safetensors file"});
  }
  expect_header_error("", 0, {"header length 0 is too small"});
  expect_header_error("{", 0, {"header length 1 is too small"});
  expect_header_error("[1,2]", 0, {"does not start with '{'"});
  expect_header_error(" {}", 0, {"does not start with '{'"});
  // JSON.
  expect_header_error("{\"a\":", 0, {"invalid JSON"});
  expect_header_error("{} x", 0, {"invalid JSON"});
  expect_header_error("{\"a\xff\":1}", 0, {"invalid JSON"});  // not UTF-8
  // A NUL ends nlohmann's input early; the reader must not ignore what follows it.
  expect_header_error(ok + std::string("\0garbage", 8), 8, {"NUL byte at offset 54"});
  // File bytes quoted in a message are escaped: no control or non-ASCII bytes reach a terminal.
  for (const std::string& h :
       {std::string("{\"\x1b[31m\xff\xfe\":1}"), std::string("{\x01\x80}")}) {
    try {
      SafetensorsFile::from_bytes(st_bytes(h), "esc");
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      for (const char* p = e.what(); *p; ++p)
        EXPECT_TRUE(*p >= 0x20 && *p < 0x7f)
            << "raw byte " << int(uint8_t(*p)) << " in " << e.what();
    }
  }
  expect_header_error("{\"x\":" + std::string(40, '[') + std::string(40, ']') + "}", 0,
                      {"nested deeper than 16"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8, {"duplicate key 'a'", "two entries with one name"});
  expect_header_error(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4,
                      {"duplicate key 'dtype'"});
  // Entries.
  expect_header_error(R"({"a":5})", 0, {"tensor 'a'", "entry must be an object", "got 5"});
  expect_header_error(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0,
                      {"empty name"});
  expect_header_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8,
                      {"tensor 'a'", "missing 'dtype'"});
  expect_header_error(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, {"missing 'shape'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"missing 'data_offsets'"});
  expect_header_error(R"({"a":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8,
                      {"'dtype' must be a string"});
  expect_header_error(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8,
                      {"unknown dtype \"F33\""});
  expect_header_error(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8,
                      {"'shape' must be a list"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
                      {"extents must be integers >= 0", "got -2"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
                      {"extents must be integers >= 0", "non-integer"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
                      {"extents must be integers"});
  {
    std::string dims = "[1";
    for (int i = 0; i < 64; ++i) dims += ",1";
    expect_header_error(R"({"a":{"dtype":"F32","shape":)" + dims + R"(],"data_offsets":[0,4]}})", 4,
                        {"'shape' has 65 dims"});
  }
  expect_header_error(
      R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8,
      {"too large"});
  expect_header_error(
      R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0,
      {"too large"});
  expect_header_error(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                      8, {"too large for its dtype"});
  expect_header_error(
      R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})", 8,
      {"extents must be integers >= 0"});
  expect_header_error(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2,
                      {"shape [3] of F4 is not a whole number of bytes"});
  // Offsets.
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":8}})", 8,
                      {"'data_offsets' must be [begin, end]"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8,
                      {"'data_offsets' must be [begin, end]"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8,
                      {"'data_offsets' must be integers >= 0", "[-8, 0]"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})", 8,
                      {"'data_offsets' must be integers >= 0"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
                      {"data_offsets [8, 0]: begin is after end"});
  expect_header_error(ok, 4,
                      {"tensor 'a'",
                       "data_offsets [0, 8] run past the end of the data "
                       "buffer (4 bytes; truncated file?)"});
  expect_header_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", 8,
      {"run past the end"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
                      {"data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8 bytes"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12, {"tensor 'b'", "overlap tensor 'a' [0, 8]"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                      12, {"tensor 'b'", "leave a gap of 4 bytes after tensor 'a'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
                      {"gap of 4 bytes after the header"});
  expect_header_error(ok, 9, {"1 bytes after the last tensor's data"});
  // Metadata.
  expect_header_error(R"({"__metadata__":["pt"]})", 0, {"__metadata__ must be an object"});
  expect_header_error(R"({"__metadata__":{"format":1}})", 0,
                      {"__metadata__ value of 'format' must be a string"});
  // Long names are shortened in messages.
  std::string long_name(5000, 'n');
  expect_header_error(
      R"({")" + long_name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 8,
      {"tensor 'nnnn", "...'"});
}

TEST(Safetensors, EveryTruncationIsAnError) {
  Tensor a(DType::kBF16, {3, 5}), b(DType::kF32, {7});
  std::memset(a.data(), 0x3f, size_t(a.nbytes()));
  std::memset(b.data(), 0x40, size_t(b.nbytes()));
  std::vector<uint8_t> bytes = serialize_safetensors({{"a", a.view()}, {"b", b.view()}});
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    EXPECT_THROW(SafetensorsFile::from_bytes(cut, "cut"), Error) << n;
  }
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(bytes, "whole"));
}

TEST(Safetensors, OpenErrors) {
  TempDir dir;
  expect_error_containing([&] { SafetensorsFile::open(dir / "absent.safetensors"); },
                          {"safetensors " + (dir / "absent.safetensors") + ": cannot open"});
  expect_error_containing([&] { SafetensorsFile::open(dir.path.string()); },
                          {"not a regular file"});
  write_text(dir / "empty.safetensors", "");
  expect_error_containing([&] { SafetensorsFile::open(dir / "empty.safetensors"); },
                          {"empty.safetensors: file is 0 bytes"});
  write_text(dir / "short.safetensors", std::string("\x10\0\0\0\0\0\0\0{}", 10));
  expect_error_containing([&] { SafetensorsFile::open(dir / "short.safetensors"); },
                          {"short.safetensors: header length 16 runs past the end"});
}

// Random damage to a valid file: flips, overwrites, inserts, deletes, truncations, header-length
// edits and number swaps inside the header. The reader must accept or throw lockstep::Error;
// whatever it accepts must be readable end to end (ASan/UBSan builds catch stray accesses).
TEST(Safetensors, MutationOnlyThrowsError) {
  auto g = test::rng(3);
  Tensor bf(DType::kBF16, {3, 5}), f32(DType::kF32, {4}), scalar(DType::kF32, {}),
      empty(DType::kBF16, {0, 3}), ids(DType::kI64, {2}), bytes_t(DType::kU8, {5});
  for (Tensor* t : {&bf, &f32, &scalar, &ids, &bytes_t})
    for (int64_t i = 0; i < t->nbytes(); ++i) t->ptr<uint8_t>()[i] = uint8_t(g());
  const std::vector<uint8_t> base = serialize_safetensors({{"model.layers.0.w", bf.view()},
                                                           {"f", f32.view()},
                                                           {"s", scalar.view()},
                                                           {"e", empty.view()},
                                                           {"ids", ids.view()},
                                                           {"u8", bytes_t.view()}},
                                                          {{"format", "pt"}});
  const size_t header_end = 8 + (size_t(base[0]) | size_t(base[1]) << 8);
  const char* specials = "{}[]\":,0123456789-. \\ \xff\x80\x00";
  const uint64_t numbers[] = {0,
                              1,
                              7,
                              8,
                              255,
                              65535,
                              uint64_t(1) << 31,
                              uint64_t(1) << 32,
                              uint64_t(1) << 62,
                              uint64_t(1) << 63,
                              ~uint64_t(0)};

  const auto t0 = std::chrono::steady_clock::now();
  int accepted = 0, rejected = 0, iters = 0;
  for (; iters < 60000; ++iters) {
    std::vector<uint8_t> b = base;
    const int edits = 1 + int(g() % 3);
    for (int k = 0; k < edits; ++k) {
      // Aim most edits at the header, where structure lives.
      size_t limit = (g() % 4 != 0 && header_end < b.size()) ? header_end : b.size();
      size_t pos = limit ? g() % limit : 0;
      switch (g() % 8) {
        case 0:
          if (pos < b.size()) b[pos] ^= uint8_t(1u << (g() % 8));
          break;
        case 1:
          if (pos < b.size()) b[pos] = uint8_t(specials[g() % 22]);
          break;
        case 2:
          b.insert(b.begin() + long(std::min(pos, b.size())), uint8_t(specials[g() % 22]));
          break;
        case 3:
          if (pos < b.size())
            b.erase(b.begin() + long(pos),
                    b.begin() + long(std::min(b.size(), pos + 1 + g() % 16)));
          break;
        case 4:
          b.resize(g() % (b.size() + 1));
          break;
        case 5:  // header length field
          if (b.size() >= 8) {
            uint64_t n = 0;
            for (int i = 0; i < 8; ++i) n |= uint64_t(b[size_t(i)]) << (8 * i);
            n = g() % 2 ? n + (g() % 17) - 8 : numbers[g() % 11];
            for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
          }
          break;
        case 6:  // replace a number in the header with another
        case 7: {
          size_t start = 8 + g() % std::max<size_t>(1, header_end - 8);
          while (start < std::min(b.size(), header_end) && !(b[start] >= '0' && b[start] <= '9'))
            ++start;
          size_t end = start;
          while (end < b.size() && b[end] >= '0' && b[end] <= '9') ++end;
          if (end > start) {
            std::string num = std::to_string(numbers[g() % 11] + (g() % 3));
            if (g() % 4 == 0) num = "-" + num;
            b.erase(b.begin() + long(start), b.begin() + long(end));
            b.insert(b.begin() + long(start), num.begin(), num.end());
          }
          break;
        }
      }
    }
    try {
      SafetensorsFile f = SafetensorsFile::from_bytes(b, "mutant");
      uint64_t sum = 0;
      for (const TensorInfo& t : f.tensors()) {
        const uint8_t* p = f.raw(t);
        for (uint64_t i = 0; i < t.nbytes(); ++i) sum += p[i];
        if (safetensors_to_dtype(t.dtype) && t.shape.size() <= size_t(kMaxDims)) {
          TensorView v = f.view(t);
          EXPECT_EQ(uint64_t(v.numel() * dtype_size(v.dtype)), t.nbytes());
        }
      }
      f.verify_checksum();  // may throw Error on flipped data
      ::testing::Test::RecordProperty("sum", int(sum & 1));
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iters << ": non-lockstep exception: " << e.what();
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[lockstep] %d mutants in %.2f s: %d accepted, %d rejected with lockstep::Error\n",
              iters, secs, accepted, rejected);
  EXPECT_GT(rejected, iters / 2);
  EXPECT_GT(accepted, 0);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

Qwen3Config tiny_config(bool tied) {
  Qwen3Config c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.torch_dtype = "bfloat16";
  c.eos_token_ids = {2};
  return c;
}

std::vector<NamedTensor> named(const Weights& w) {
  std::vector<NamedTensor> out;
  for (const auto& [n, t] : w) out.push_back({n, t.view()});
  return out;
}

// Writes config.json + model.safetensors (or shards + index when `shards` > 1).
void write_checkpoint(const TempDir& dir, const Qwen3Config& cfg, const std::vector<NamedTensor>& w,
                      int shards = 1) {
  write_text(dir / "config.json", cfg.to_json());
  if (shards == 1) {
    write_safetensors(dir / "model.safetensors", w, {{"format", "pt"}});
    return;
  }
  std::string index = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
  for (int s = 0; s < shards; ++s) {
    std::vector<NamedTensor> part;
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, shards);
    for (size_t i = size_t(s); i < w.size(); i += size_t(shards)) {
      part.push_back(w[i]);
      index +=
          std::string(index.back() == '{' ? "" : ", ") + "\"" + w[i].name + "\": \"" + file + "\"";
    }
    write_safetensors(dir / file, part, {{"format", "pt"}});
  }
  write_text(dir / "model.safetensors.index.json", index + "}}");
}

TEST(Checkpoint, SingleFileLoadsEveryWeight) {
  for (bool tied : {true, false}) {
    TempDir dir;
    Qwen3Config cfg = tiny_config(tied);
    Weights w = random_qwen3_weights(cfg, 11);
    write_checkpoint(dir, cfg, named(w));
    Checkpoint ck = Checkpoint::open(dir.path.string());
    EXPECT_EQ(ck.config().to_string(), cfg.to_string());
    EXPECT_EQ(ck.files().size(), 1u);
    EXPECT_TRUE(ck.check_qwen3_weights().empty());
    EXPECT_EQ(ck.has("lm_head.weight"), !tied);
    for (const auto& [name, t] : w) {
      TensorView v = ck.get(name, DType::kBF16, t.shape());
      EXPECT_BITWISE_EQ(v.data, t.data(), t.numel(), DType::kBF16);
    }
    // -1 matches any extent.
    EXPECT_NO_THROW(ck.get("model.embed_tokens.weight", DType::kBF16, {-1, 32}));
  }
}

TEST(Checkpoint, GetNamesTheProblem) {
  TempDir dir;
  Qwen3Config cfg = tiny_config(true);
  write_checkpoint(dir, cfg, named(random_qwen3_weights(cfg, 12)));
  Checkpoint ck = Checkpoint::open(dir.path.string());
  const std::string where = "checkpoint " + dir.path.string() + ": ";
  expect_error_containing(
      [&] {
        ck.get("model.layers.3.mlp.up_proj.weight", DType::kBF16, {48, 32});
      },
      {where + "missing tensor model.layers.3.mlp.up_proj.weight"});
  expect_error_containing(
      [&] {
        ck.get("model.layers.1.mlp.up_proj.weight", DType::kBF16, {48, 64});
      },
      {where +
       "tensor model.layers.1.mlp.up_proj.weight has shape [48, 32], the config expects "
       "[48, 64] (shape mismatch; the tensor is in " +
       (dir / "model.safetensors") + ")"});
  expect_error_containing(
      [&] {
        ck.get("model.norm.weight", DType::kBF16, {32, 1});
      },
      {"has shape [32], the config expects [32, 1]"});
  expect_error_containing(
      [&] { ck.get("model.norm.weight", DType::kF32, {32}); },
      {"tensor model.norm.weight: dtype BF16", "expected F32", "(get_converted converts)"});
  expect_error_containing([&] { ck.info("nope"); }, {"missing tensor nope"});
}

TEST(Checkpoint, ConvertsFloatDtypes) {
  TempDir dir;
  Qwen3Config cfg = tiny_config(true);
  Weights w = random_qwen3_weights(cfg, 13);
  // Store the final norm as F32 (with values that need rounding) and one layernorm as F16.
  Tensor norm32(DType::kF32, {32});
  for (int i = 0; i < 32; ++i) norm32.ptr<float>()[i] = 1.0f + float(i) * 0x1p-12f;
  norm32.ptr<float>()[31] = std::nanf("");
  Tensor ln16(DType::kU8, {64});  // F16 bytes, written through a custom header below
  std::vector<NamedTensor> nt;
  for (const auto& [n, t] : w)
    if (n == "model.norm.weight")
      nt.push_back({n, norm32.view()});
    else if (n != "model.layers.0.input_layernorm.weight")
      nt.push_back({n, t.view()});
  write_checkpoint(dir, cfg, nt);
  {
    Checkpoint ck = Checkpoint::open(dir.path.string());
    Tensor a = ck.get_converted("model.norm.weight", DType::kBF16, {32});
    Tensor b = ck.get_converted("model.norm.weight", DType::kF32, {32});
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(a.ptr<bf16>()[i].bits, f32_to_bf16(norm32.ptr<float>()[i]).bits) << i;
      EXPECT_EQ(f32_bits(b.ptr<float>()[i]), f32_bits(norm32.ptr<float>()[i])) << i;
    }
    EXPECT_EQ(a.ptr<bf16>()[31].bits, kCanonicalNanBf16);
    Tensor c = ck.get_converted("model.layers.1.mlp.up_proj.weight", DType::kF32, {48, 32});
    TensorView src = ck.get("model.layers.1.mlp.up_proj.weight", DType::kBF16, {48, 32});
    for (int64_t i = 0; i < 48 * 32; ++i)
      ASSERT_EQ(f32_bits(c.ptr<float>()[i]), uint32_t(src.ptr<bf16>()[i].bits) << 16);
    // Missing layer-0 input norm: check_qwen3_weights reports it up front.
    expect_error_containing([&] { ck.check_qwen3_weights(); },
                            {"missing tensor model.layers.0.input_layernorm.weight"});
    expect_error_containing([&] { ck.get_converted("model.norm.weight", DType::kI32, {32}); },
                            {"target dtype must be bf16 or f32"});
  }
  // F16 values, including subnormal, inf and NaN: widened exactly.
  const uint16_t halves[8] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x7c00, 0xfc00, 0x7e01};
  const float expect[8] = {1.0f,     -2.0f,    0x1p-24f,  1023 * 0x1p-24f,
                           65504.0f, INFINITY, -INFINITY, NAN};
  std::string h =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}})";
  std::vector<uint8_t> bytes = st_bytes(h, 16);
  std::memcpy(bytes.data() + 8 + h.size(), halves, 16);
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
  Checkpoint ck = Checkpoint::open(dir.path.string());
  Tensor f = ck.get_converted("x", DType::kF32, {8});
  for (int i = 0; i < 7; ++i) EXPECT_EQ(f.ptr<float>()[i], expect[i]) << i;
  EXPECT_EQ(f32_bits(f.ptr<float>()[7]), kCanonicalNanF32);
  expect_error_containing([&] { ck.get("x", DType::kBF16, {8}); }, {"dtype F16", "expected BF16"});
}

TEST(Checkpoint, CheckQwen3WeightsReportsProblems) {
  Qwen3Config cfg = tiny_config(false);
  Weights w = random_qwen3_weights(cfg, 14);
  {  // extra tensors are returned, not an error
    TempDir dir;
    Tensor extra(DType::kF32, {4});
    std::memset(extra.data(), 0, 16);
    std::vector<NamedTensor> nt = named(w);
    nt.push_back({"model.rotary_emb.inv_freq", extra.view()});
    write_checkpoint(dir, cfg, nt);
    EXPECT_EQ(Checkpoint::open(dir.path.string()).check_qwen3_weights(),
              std::vector<std::string>{"model.rotary_emb.inv_freq"});
  }
  {  // names without the "model." prefix (a Qwen3Model, not Qwen3ForCausalLM)
    TempDir dir;
    std::vector<NamedTensor> nt = named(w);
    for (NamedTensor& t : nt)
      if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
    write_checkpoint(dir, cfg, nt);
    expect_error_containing([&] { Checkpoint::open(dir.path.string()).check_qwen3_weights(); },
                            {"missing tensor model.embed_tokens.weight", "(and 34 more)",
                             "the checkpoint has 36 tensors", "e.g. 'embed_tokens.weight'"});
  }
  {  // config and weights disagree
    TempDir dir;
    write_checkpoint(dir, cfg, named(w));
    Qwen3Config wider = cfg;
    wider.intermediate_size = 64;
    write_text(dir / "config.json", wider.to_json());
    expect_error_containing([&] { Checkpoint::open(dir.path.string()).check_qwen3_weights(); },
                            {"tensor model.layers.0.mlp.gate_proj.weight has shape [48, 32], "
                             "the config expects [64, 32]"});
  }
  {  // integer weights
    TempDir dir;
    std::vector<NamedTensor> nt = named(w);
    Tensor ints(DType::kI32, {32});
    std::memset(ints.data(), 0, 128);
    for (NamedTensor& t : nt)
      if (t.name == "model.norm.weight") t.tensor = ints.view();
    write_checkpoint(dir, cfg, nt);
    expect_error_containing([&] { Checkpoint::open(dir.path.string()).check_qwen3_weights(); },
                            {"tensor model.norm.weight: dtype I32", "must be BF16, F32 or F16"});
  }
}

TEST(Checkpoint, ShardedMatchesSingle) {
  Qwen3Config cfg = tiny_config(false);
  Weights w = random_qwen3_weights(cfg, 15);
  TempDir dir;
  write_checkpoint(dir, cfg, named(w), 3);
  Checkpoint ck = Checkpoint::open(dir.path.string());
  EXPECT_EQ(ck.files().size(), 3u);
  EXPECT_TRUE(ck.check_qwen3_weights().empty());
  EXPECT_EQ(ck.tensor_names().size(), w.size());
  for (const auto& [name, t] : w) {
    TensorView v = ck.get(name, DType::kBF16, t.shape());
    EXPECT_BITWISE_EQ(v.data, t.data(), t.numel(), DType::kBF16);
  }
  EXPECT_NE(ck.file_of("model.layers.0.input_layernorm.weight").path(),
            ck.file_of("model.embed_tokens.weight").path());
  // model.safetensors, when present too, wins (as in transformers).
  Tensor one(DType::kF32, {1});
  one.ptr<float>()[0] = 1;
  write_safetensors(dir / "model.safetensors", {{"only", one.view()}});
  EXPECT_EQ(Checkpoint::open(dir.path.string()).tensor_names(), std::vector<std::string>{"only"});
}

TEST(Checkpoint, ShardErrors) {
  Qwen3Config cfg = tiny_config(true);
  Weights w = random_qwen3_weights(cfg, 16);
  std::vector<NamedTensor> nt = named(w);
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  auto setup = [&](const TempDir& dir, const std::vector<NamedTensor>& a,
                   const std::vector<NamedTensor>& b, const std::string& index) {
    write_text(dir / "config.json", cfg.to_json());
    write_safetensors(dir / s1, a);
    write_safetensors(dir / s2, b);
    write_text(dir / "model.safetensors.index.json", index);
  };
  std::vector<NamedTensor> first(nt.begin(), nt.begin() + 10), second(nt.begin() + 10, nt.end());
  auto map_of = [&](const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b,
                    const std::string& extra) {
    std::string m = "{\"weight_map\": {";
    for (const NamedTensor& t : a) m += "\"" + t.name + "\": \"" + s1 + "\", ";
    for (const NamedTensor& t : b) m += "\"" + t.name + "\": \"" + s2 + "\", ";
    m += extra;
    if (m.size() >= 2 && m.substr(m.size() - 2) == ", ") m.resize(m.size() - 2);
    return m + "}}";
  };
  auto expect_open_error = [](const TempDir& dir, std::initializer_list<std::string> needles) {
    expect_error_containing([&] { Checkpoint::open(dir.path.string()); }, needles);
  };
  {
    TempDir dir;
    setup(dir, first, second, map_of(first, second, ""));
    EXPECT_NO_THROW(Checkpoint::open(dir.path.string()).check_qwen3_weights());
    fs::remove(dir / s2);
    expect_open_error(dir, {"shard '" + s2 + "'", "not found"});
  }
  {  // a tensor stored in both shards
    TempDir dir;
    std::vector<NamedTensor> b2 = second;
    b2.push_back(first[0]);
    setup(dir, first, b2, map_of(first, second, ""));
    expect_open_error(dir, {"tensor '" + first[0].name + "' is in two shards"});
  }
  {  // weight_map names a tensor its shard lacks
    TempDir dir;
    setup(dir, first, second, map_of(first, second, "\"model.ghost.weight\": \"" + s2 + "\""));
    expect_open_error(dir, {"weight_map puts 'model.ghost.weight' in '" + s2 +
                            "', but that shard has no such tensor"});
  }
  {  // a shard tensor missing from weight_map
    TempDir dir;
    std::vector<NamedTensor> a2(first.begin() + 1, first.end());
    setup(dir, first, second, map_of(a2, second, ""));
    expect_open_error(
        dir, {"tensor '" + first[0].name + "' in shard '" + s1 + "' is not listed in weight_map"});
  }
  {  // weight_map points at the wrong shard
    TempDir dir;
    std::vector<NamedTensor> a2(first.begin() + 1, first.end()), b2 = second;
    b2.insert(b2.begin(), first[0]);
    setup(dir, first, second, map_of(a2, b2, ""));
    expect_open_error(dir, {"weight_map puts '" + first[0].name + "' in '" + s2 +
                            "', but it is in '" + s1 + "'"});
  }
  for (const std::string& bad : {std::string("../escape.safetensors"), std::string("/etc/passwd"),
                                 std::string(".."), std::string("")}) {
    TempDir dir;
    setup(dir, first, second, map_of(first, second, "\"x\": \"" + bad + "\""));
    expect_open_error(dir, {"weight_map['x'] = '" + bad + "' is not a plain file name"});
  }
  const std::pair<std::string, std::string> bad_index[] = {
      {"not json", "invalid JSON"},
      {"[]", "expected a JSON object"},
      {"{\"metadata\": {}}", "missing 'weight_map'"},
      {"{\"weight_map\": {}}", "'weight_map' must be a non-empty object"},
      {"{\"weight_map\": []}", "'weight_map' must be a non-empty object"},
      {"{\"weight_map\": {\"a\": 3}}", "weight_map['a'] must be a file name, got 3"},
      {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "duplicate key 'a'"},
  };
  for (const auto& [text, needle] : bad_index) {
    TempDir dir;
    setup(dir, first, second, text);
    expect_open_error(dir, {"model.safetensors.index.json", needle});
  }
}

TEST(Checkpoint, DirectoryErrors) {
  TempDir dir;
  expect_error_containing([&] { Checkpoint::open(dir / "absent"); },
                          {"absent does not exist (not a directory)"});
  expect_error_containing([&] { Checkpoint::open(dir.path.string()); }, {"config.json not found"});
  Qwen3Config cfg = tiny_config(true);
  write_text(dir / "config.json", cfg.to_json());
  expect_error_containing([&] { Checkpoint::open(dir.path.string()); },
                          {"neither model.safetensors nor model.safetensors.index.json"});
  write_text(dir / "model.safetensors", "garbage!garbage!");
  expect_error_containing([&] { Checkpoint::open(dir.path.string()); },
                          {"safetensors " + (dir / "model.safetensors") + ": header length"});
  write_text(dir / "config.json", "{\"model_type\": \"llama\"}");
  expect_error_containing([&] { Checkpoint::open(dir.path.string()); },
                          {"config " + (dir / "config.json"), "llama"});
}

// ---------------------------------------------------------------------------------------------
// Loading refuses what is silently wrong (issue 10 item 7)

TEST(Checkpoint, LayerCountMismatchNamesBothCounts) {
  Qwen3Config cfg = tiny_config(true);  // 3 layers
  Weights w = random_qwen3_weights(cfg, 17);
  TempDir dir;
  write_checkpoint(dir, cfg, named(w));
  EXPECT_NO_THROW(Checkpoint::load(dir.path.string()));
  // Fewer layers in config.json than in the weights: today's silent "run the first 2 layers".
  Qwen3Config fewer = cfg;
  fewer.num_hidden_layers = 2;
  write_text(dir / "config.json", fewer.to_json());
  for (bool finite : {true, false}) {
    LoadOptions opt;
    opt.check_finite = finite;
    expect_error_containing([&] { Checkpoint::load(dir.path.string(), opt); },
                            {"checkpoint " + dir.path.string(), "num_hidden_layers = 2",
                             "the checkpoint has 3 layers", "model.layers.2."});
  }
  expect_error_containing([&] { Checkpoint::open(dir.path.string()).check_qwen3_weights(); },
                          {"num_hidden_layers = 2", "has 3 layers"});
  // More layers in config.json than in the weights.
  Qwen3Config more = cfg;
  more.num_hidden_layers = 5;
  write_text(dir / "config.json", more.to_json());
  expect_error_containing([&] { Checkpoint::load(dir.path.string()); },
                          {"num_hidden_layers = 5", "the checkpoint has 3 layers",
                           "has no tensor model.layers.3.input_layernorm.weight", "(and 21 more)"});
  // One tensor of a middle layer missing: named, as a missing tensor (the layer count agrees).
  write_text(dir / "config.json", cfg.to_json());
  std::vector<NamedTensor> nt;
  for (const NamedTensor& t : named(w))
    if (t.name != "model.layers.1.self_attn.k_norm.weight") nt.push_back(t);
  write_safetensors(dir / "model.safetensors", nt, {{"format", "pt"}});
  expect_error_containing([&] { Checkpoint::load(dir.path.string()); },
                          {"missing tensor model.layers.1.self_attn.k_norm.weight"});
}

TEST(Checkpoint, UnusedTensorsWarnOrFailWhenStrict) {
  Qwen3Config cfg = tiny_config(true);
  Weights w = random_qwen3_weights(cfg, 18);
  TempDir dir;
  Tensor extra(DType::kF32, {4});
  std::memset(extra.data(), 0, 16);
  std::vector<NamedTensor> nt = named(w);
  nt.push_back({"model.rotary_emb.inv_freq", extra.view()});
  nt.push_back({"lm_head.weight", w[0].second.view()});  // tied: not used
  write_checkpoint(dir, cfg, nt);

  std::vector<std::string> seen;
  LoadOptions opt;
  opt.warn = [&](const std::string& m) { seen.push_back(m); };
  LoadReport report;
  Checkpoint ck = Checkpoint::load(dir.path.string(), opt, &report);
  EXPECT_EQ(report.unused,
            (std::vector<std::string>{"lm_head.weight", "model.rotary_emb.inv_freq"}));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(report.warnings, seen);
  for (const char* needle : {"2 tensors the config does not use (ignored)", "'lm_head.weight'",
                             "'model.rotary_emb.inv_freq'", "tie_word_embeddings is true"})
    EXPECT_NE(seen[0].find(needle), std::string::npos) << needle << " not in: " << seen[0];
  // No sink: the warning is still in the report (the library prints nothing).
  EXPECT_EQ(ck.check_qwen3(ck.config()).warnings, seen);
  // strict: the same finding is an error.
  opt.strict = true;
  expect_error_containing([&] { Checkpoint::load(dir.path.string(), opt); },
                          {"does not use", "'model.rotary_emb.inv_freq'", "strict"});
  // A shard index next to model.safetensors is ignored: said so.
  write_text(dir / "model.safetensors.index.json", "{}");
  opt.strict = false;
  seen.clear();
  Checkpoint::load(dir.path.string(), opt, &report);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[1].find("model.safetensors and model.safetensors.index.json both exist"),
            std::string::npos)
      << seen[1];
  opt.strict = true;
  // A clean checkpoint passes strict with no warning.
  TempDir clean;
  write_checkpoint(clean, cfg, named(w));
  seen.clear();
  EXPECT_TRUE(Checkpoint::load(clean.path.string(), opt, &report).check_qwen3_weights().empty());
  EXPECT_TRUE(seen.empty());
  EXPECT_TRUE(report.warnings.empty() && report.unused.empty());
}

TEST(Checkpoint, DtypeOtherThanConfigIsAWarning) {
  Qwen3Config cfg = tiny_config(true);  // torch_dtype bfloat16
  Weights w = random_qwen3_weights(cfg, 19);
  Tensor norm32(DType::kF32, {32});
  for (int i = 0; i < 32; ++i) norm32.ptr<float>()[i] = 1.0f;
  std::vector<NamedTensor> nt = named(w);
  for (NamedTensor& t : nt)
    if (t.name == "model.norm.weight") t.tensor = norm32.view();
  TempDir dir;
  write_checkpoint(dir, cfg, nt);
  LoadReport report;
  Checkpoint::load(dir.path.string(), {}, &report);
  ASSERT_EQ(report.warnings.size(), 1u);
  for (const char* needle : {"1 weight not stored as the config's torch_dtype bfloat16 (BF16)",
                             "'model.norm.weight' is F32", "converted to bf16"})
    EXPECT_NE(report.warnings[0].find(needle), std::string::npos) << report.warnings[0];
  LoadOptions strict;
  strict.strict = true;
  expect_error_containing([&] { Checkpoint::load(dir.path.string(), strict); },
                          {"model.norm.weight' is F32", "strict"});
  // torch_dtype float32 with bf16 weights: every weight but the norm differs.
  Qwen3Config f32cfg = cfg;
  f32cfg.torch_dtype = "float32";
  write_text(dir / "config.json", f32cfg.to_json());
  Checkpoint::load(dir.path.string(), {}, &report);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("weights not stored as the config's torch_dtype float32"),
            std::string::npos)
      << report.warnings[0];
}

// A checkpoint of `cfg` whose tensor `name` is replaced by `t`.
void write_with(const TempDir& dir, const Qwen3Config& cfg, const Weights& w,
                const std::string& name, const TensorView& t) {
  std::vector<NamedTensor> nt = named(w);
  for (NamedTensor& x : nt)
    if (x.name == name) x.tensor = t;
  write_checkpoint(dir, cfg, nt);
}

TEST(Checkpoint, NonFiniteWeightsAreRefusedAtLoad) {
  Qwen3Config cfg = tiny_config(false);
  cfg.vocab_size = 4096;  // embed [4096, 32]: 2 chunks of the scan
  Weights w = random_qwen3_weights(cfg, 20);
  const std::string up = "model.layers.1.mlp.up_proj.weight";  // [48, 32]
  auto at = [&](const std::string& name) -> Tensor {
    for (auto& [n, t] : w)
      if (n == name) return t;
    throw Error("no " + name);
  };
  struct Case {
    std::string name;
    int64_t index;
    uint16_t bits;
    std::vector<std::string> needles;
  };
  const Case cases[] = {
      {up, 0, 0x7fc0, {"index 0 [0, 0] of [48, 32]", "NaN (BF16 bits 0x7fc0)"}},
      {up, 48 * 32 - 1, 0xff80, {"index 1535 [47, 31]", "-Inf (BF16 bits 0xff80)"}},
      {up, 33, 0x7f81, {"index 33 [1, 1]", "NaN (BF16 bits 0x7f81)"}},  // a signalling NaN
      {"model.embed_tokens.weight", 100000, 0x7f80, {"index 100000 [3125, 0]", "+Inf"}},
      {"model.norm.weight", 5, 0xffff, {"index 5 [5]", "NaN"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " " + std::to_string(c.index));
    const Tensor src = at(c.name);
    Tensor bad(DType::kBF16, src.shape());
    std::memcpy(bad.data(), src.data(), size_t(src.numel()) * 2);
    bad.ptr<uint16_t>()[c.index] = c.bits;
    if (c.name == "model.embed_tokens.weight") bad.ptr<uint16_t>()[120000] = 0x7fc0;  // later one
    TempDir dir;
    write_with(dir, cfg, w, c.name, bad.view());
    std::vector<std::string> needles = c.needles;
    needles.push_back("checkpoint " + dir.path.string() + ": tensor " + c.name + " in " +
                      (dir / "model.safetensors") + ": non-finite weight at ");
    expect_error_containing([&] { Checkpoint::load(dir.path.string()); },
                            {needles.begin()[0], needles.back()});
    for (const std::string& n : needles)
      expect_error_containing([&] { Checkpoint::load(dir.path.string()); }, {n});
    // The model refuses it too (no silent NaN log-probs), and the scan can be turned off.
    ModelOptions mo;
    expect_error_containing(
        [&] { Model m(cfg, Checkpoint::open(dir.path.string()), mo, make_invariant_backend()); },
        {"non-finite weight", c.name});
    LoadOptions off;
    off.check_finite = false;
    EXPECT_NO_THROW(Checkpoint::load(dir.path.string(), off));
  }
  {  // A flipped byte in a file that records its sha256: verify_checksums names the file.
    TempDir dir;
    write_checkpoint(dir, cfg, named(w));
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x11');
    f.close();
    EXPECT_NO_THROW(Checkpoint::load(dir.path.string()));
    LoadOptions verify;
    verify.verify_checksums = true;
    expect_error_containing([&] { Checkpoint::load(dir.path.string(), verify); },
                            {dir / "model.safetensors", "data checksum mismatch"});
  }
  // F32: Inf, and a finite value that overflows bf16 (> the midpoint of bf16 max and Inf); the
  // largest value that rounds to bf16 max is accepted.
  const std::pair<uint32_t, std::string> f32_cases[] = {
      {0x7f800000u, "+Inf (F32 bits 0x7f800000)"},
      {0xff7f8000u, "overflows to Inf when rounded to bf16"},
      {0x7f7fffffu, "overflows to Inf"}};
  for (const auto& [bits, needle] : f32_cases) {
    Tensor norm32(DType::kF32, {32});
    for (int i = 0; i < 32; ++i) norm32.ptr<float>()[i] = 1.0f;
    std::memcpy(norm32.ptr<float>() + 7, &bits, 4);
    TempDir dir;
    write_with(dir, cfg, w, "model.norm.weight", norm32.view());
    expect_error_containing([&] { Checkpoint::load(dir.path.string()); },
                            {"tensor model.norm.weight", "index 7 [7]", needle});
  }
  // F16 (no lockstep dtype: the norm goes into a hand-built second shard).
  for (const uint16_t bits : {uint16_t(0x3c00), uint16_t(0x7c00), uint16_t(0xfe00)}) {
    TempDir dir;
    std::vector<NamedTensor> rest;
    std::string index = "{\"weight_map\": {\"model.norm.weight\": \"b.safetensors\"";
    for (const NamedTensor& t : named(w))
      if (t.name != "model.norm.weight") {
        rest.push_back(t);
        index += ", \"" + t.name + "\": \"a.safetensors\"";
      }
    write_text(dir / "config.json", cfg.to_json());
    write_safetensors(dir / "a.safetensors", rest);
    write_text(dir / "model.safetensors.index.json", index + "}}");
    const std::string h =
        R"({"model.norm.weight":{"dtype":"F16","shape":[32],"data_offsets":[0,64]}})";
    std::vector<uint8_t> bytes = st_bytes(h, 64);
    for (int i = 0; i < 32; ++i) {
      const uint16_t v = i == 9 ? bits : uint16_t(0x3c00);
      std::memcpy(bytes.data() + 8 + h.size() + 2 * i, &v, 2);
    }
    std::ofstream(dir / "b.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
    if (bits == 0x3c00) {
      EXPECT_NO_THROW(Checkpoint::load(dir.path.string()));
    } else {
      expect_error_containing(
          [&] { Checkpoint::load(dir.path.string()); },
          {"tensor model.norm.weight in " + (dir / "b.safetensors"), "index 9 [9]",
           bits == 0x7c00 ? "+Inf (F16 bits 0x7c00)" : "NaN (F16 bits 0xfe00)"});
    }
  }
  Tensor edge(DType::kF32, {32});
  for (int i = 0; i < 32; ++i) edge.ptr<float>()[i] = 1.0f;
  const uint32_t below = 0x7f7f7fffu;  // rounds down to bf16 max
  std::memcpy(edge.ptr<float>() + 3, &below, 4);
  TempDir dir;
  write_with(dir, cfg, w, "model.norm.weight", edge.view());
  EXPECT_NO_THROW(Checkpoint::load(dir.path.string()));
}

// Files that are not regular files are refused before anything reads them: a FIFO would block
// (these tests would hang), a device would read forever.
TEST(Checkpoint, NonRegularFilesAreRefusedBeforeReading) {
  Qwen3Config cfg = tiny_config(true);
  Weights w = random_qwen3_weights(cfg, 21);
  auto fresh = [&](const TempDir& dir) {
    fs::remove_all(dir.path);
    fs::create_directories(dir.path);
    write_checkpoint(dir, cfg, named(w));
  };
  TempDir dir;
  const std::string ck = dir.path.string();
  for (const std::string file : {"config.json", "model.safetensors"}) {
    SCOPED_TRACE(file);
    fresh(dir);
    fs::remove(dir / file);
    ASSERT_EQ(::mkfifo((dir / file).c_str(), 0644), 0);
    expect_error_containing([&] { Checkpoint::open(ck); },
                            {dir / file + " is a FIFO, not a regular file"});
    fs::remove(dir / file);
    fs::create_directory(dir / file);
    expect_error_containing([&] { Checkpoint::open(ck); },
                            {dir / file + " is a directory, not a regular file"});
    fs::remove(dir / file);
    fs::create_symlink("/dev/zero", dir / file);
    expect_error_containing([&] { Checkpoint::open(ck); },
                            {dir / file + " is a character device, not a regular file"});
    fs::remove(dir / file);
    fs::create_symlink(dir / (file + ".b"), dir / (file + ".a"));
    fs::create_symlink(dir / (file + ".a"), dir / file);
    fs::create_symlink(dir / file, dir / (file + ".b"));
    expect_error_containing([&] { Checkpoint::open(ck); }, {dir / file + ": symlink loop"});
  }
  // The shard index and a shard.
  fresh(dir);
  fs::remove(dir / "model.safetensors");
  write_text(dir / "model.safetensors.index.json",
             "{\"weight_map\": {\"model.norm.weight\": \"shard.safetensors\"}}");
  ASSERT_EQ(::mkfifo((dir / "shard.safetensors").c_str(), 0644), 0);
  expect_error_containing([&] { Checkpoint::open(ck); },
                          {dir / "shard.safetensors" + " is a FIFO, not a regular file"});
  fs::remove(dir / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((dir / "model.safetensors.index.json").c_str(), 0644), 0);
  expect_error_containing([&] { Checkpoint::open(ck); },
                          {"model.safetensors.index.json is a FIFO, not a regular file"});
  // The directory itself: a symlink loop is named as such, a file is "not a directory", other
  // errno values by strerror.
  fs::create_symlink(dir / "loop2", dir / "loop1");
  fs::create_symlink(dir / "loop1", dir / "loop2");
  expect_error_containing([&] { Checkpoint::open(dir / "loop1"); },
                          {"checkpoint " + (dir / "loop1"), "symlink loop"});
  write_text(dir / "plain", "x");
  expect_error_containing([&] { Checkpoint::open(dir / "plain"); },
                          {"is a regular file, not a directory"});
  expect_error_containing([&] { Checkpoint::open(dir / "plain/sub"); }, {"Not a directory"});
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  expect_error_containing([&] { SafetensorsFile::open(dir / "fifo"); },
                          {"safetensors " + (dir / "fifo"), "is a FIFO, not a regular file"});
  expect_error_containing([&] { load_qwen3_config(dir / "fifo"); },
                          {"config " + (dir / "fifo"), "is a FIFO, not a regular file"});
  expect_error_containing([&] { SafetensorsFile::open("/dev/null"); },
                          {"/dev/null is a character device"});
}

// Runs `fn` with the file-size limit set to `bytes` (SIGXFSZ ignored, so write() fails with
// EFBIG): a write error that even root cannot bypass.
template <typename Fn>
void with_file_size_limit(rlim_t bytes, Fn&& fn) {
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = bytes;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  try {
    fn();
  } catch (...) {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    throw;
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
}

std::vector<std::string> dir_entries(const fs::path& p) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(p)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Safetensors, WriteErrorsAreReportedAndLeaveNoPartialFile) {
  TempDir dir;
  write_file_atomic(dir / "f", "old", 3);
  const std::string big(100000, 'x');
  with_file_size_limit(4096, [&] {
    expect_error_containing([&] { write_file_atomic(dir / "f", big.data(), big.size()); },
                            {"write " + (dir / "f"), "write failed", "File too large"});
  });
  EXPECT_EQ(dir_entries(dir.path), std::vector<std::string>{"f"});  // no temporary left
  std::ifstream in(dir / "f");
  std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(have, "old");
  // Never renamed over something that is not a regular file.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  expect_error_containing([&] { write_file_atomic(dir / "fifo", "x", 1); },
                          {"it exists and is a FIFO, not a regular file"});
  expect_error_containing([&] { write_file_atomic("/dev/full", "x", 1); },
                          {"write /dev/full: it exists and is a character device"});
  fs::create_directory(dir / "sub");
  expect_error_containing([&] { write_file_atomic(dir / "sub", "x", 1); }, {"is a directory"});
  // A symlink is replaced by the new file (its target is left alone).
  write_file_atomic(dir / "target", "t", 1);
  fs::create_symlink(dir / "target", dir / "link");
  write_file_atomic(dir / "link", "new", 3);
  EXPECT_FALSE(fs::is_symlink(dir / "link"));
  EXPECT_EQ(fs::file_size(dir / "target"), 1u);
}

TEST(Safetensors, OpenErrorsNameErrno) {
  TempDir dir;
  expect_error_containing([&] { SafetensorsFile::open(dir / "absent"); },
                          {"cannot open " + (dir / "absent") + ": No such file or directory"});
  expect_error_containing([&] { read_small_file(dir / "absent", 10, "index"); },
                          {"index: cannot open", "No such file"});
  write_text(dir / "big", std::string(11, 'x'));
  expect_error_containing([&] { read_small_file(dir / "big", 10, "index"); },
                          {"index: " + (dir / "big") + " is 11 bytes (cap 10)"});
  EXPECT_EQ(read_small_file(dir / "big", 11, "index"), std::string(11, 'x'));
}

}  // namespace
}  // namespace lockstep::engine
