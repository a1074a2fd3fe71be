// The CPU MMA model (src/core/mma_model.cc) against tensor-core outputs recorded on an H200:
// every output in tests/golden/*.bin (written by tools/probes/probe_mma.cu; format in
// tests/golden/README.md) must be reproduced bit for bit. Plus unit tests of the model's
// properties (exact cases, symmetries, truncation, subnormals, overflow, inf/NaN).
// LOCKSTEP_MMA_GOLDEN_DIR=<dir> checks another directory holding the same file names (e.g. the
// unpacked output of a fresh scripts/probe_mma.sh run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

// ---------------------------------------------------------------------------------------------
// Golden files: a sequence of sections; each section = 64-byte header + tiles.

struct Section {
  uint32_t instr = 0, M = 0, N = 0, K = 0, ntiles = 0;
  std::string category;
  std::vector<bf16> A;      // [tiles, M, K]
  std::vector<bf16> Bt;     // [tiles, N, K]
  std::vector<uint32_t> C;  // [tiles, M, N] fp32 bits
  std::vector<uint32_t> D;  // [tiles, M, N] fp32 bits recorded on the GPU
};

// Reads every section of a golden file. Returns "" on success, else what is wrong.
std::string read_golden(const std::string& path, std::vector<Section>& out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "cannot open golden file " + path + " (run scripts/probe_mma.sh on an H200?)";
  std::string err;
  for (int index = 0;; ++index) {
    char magic[8];
    size_t got = std::fread(magic, 1, 8, f);
    if (got == 0 && std::feof(f)) break;
    const std::string where = path + " section " + std::to_string(index) + ": ";
    uint32_t h[6];
    char name[33] = {};
    if (got != 8 || std::memcmp(magic, "LSMMAGD1", 8) != 0) {
      err = where + "bad magic (expected LSMMAGD1)";
      break;
    }
    if (std::fread(h, 4, 6, f) != 6 || std::fread(name, 1, 32, f) != 32) {
      err = where + "truncated header";
      break;
    }
    Section s;
    s.instr = h[0];
    s.M = h[1];
    s.N = h[2];
    s.K = h[3];
    s.ntiles = h[4];
    s.category = name;
    if (s.instr < 1 || s.instr > 5 || (s.M != 16 && s.M != 64) || (s.N != 8 && s.N != 64) ||
        s.K == 0 || s.K % kMmaK != 0 || s.K > 4096 || s.ntiles == 0 || s.ntiles > 100000 ||
        h[5] != 0 || s.category.empty()) {
      err = where + "implausible header (instr " + std::to_string(s.instr) + ", M " +
            std::to_string(s.M) + ", N " + std::to_string(s.N) + ", K " + std::to_string(s.K) +
            ", tiles " + std::to_string(s.ntiles) + ")";
      break;
    }
    const size_t mk = size_t(s.M) * s.K, nk = size_t(s.N) * s.K, mn = size_t(s.M) * s.N;
    s.A.resize(mk * s.ntiles);
    s.Bt.resize(nk * s.ntiles);
    s.C.resize(mn * s.ntiles);
    s.D.resize(mn * s.ntiles);
    bool ok = true;
    for (uint32_t t = 0; t < s.ntiles && ok; ++t) {
      ok = std::fread(&s.A[t * mk], 2, mk, f) == mk && std::fread(&s.Bt[t * nk], 2, nk, f) == nk &&
           std::fread(&s.C[t * mn], 4, mn, f) == mn && std::fread(&s.D[t * mn], 4, mn, f) == mn;
    }
    if (!ok) {
      err = where + "truncated tile data";
      break;
    }
    out.push_back(std::move(s));
  }
  std::fclose(f);
  if (err.empty() && out.empty()) err = path + ": no sections";
  return err;
}

std::string golden_dir() {
  const char* env = std::getenv("LOCKSTEP_MMA_GOLDEN_DIR");
  return env ? std::string(env) : std::string(LOCKSTEP_SOURCE_DIR) + "/tests/golden";
}

std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}
std::string hex16(uint16_t u) {
  char b[8];
  std::snprintf(b, sizeof b, "%04x", u);
  return b;
}

// Checks one section bitwise; on mismatch names the first differing output with its inputs.
::testing::AssertionResult check_section(const Section& s) {
  const size_t mk = size_t(s.M) * s.K, nk = size_t(s.N) * s.K, mn = size_t(s.M) * s.N;
  std::vector<uint32_t> model(s.D.size());
  for (uint32_t t = 0; t < s.ntiles; ++t)
    for (uint32_t m = 0; m < s.M; ++m)
      for (uint32_t n = 0; n < s.N; ++n)
        model[t * mn + m * s.N + n] =
            f32_bits(mma_chain_bf16(&s.A[t * mk + m * s.K], &s.Bt[t * nk + n * s.K], s.K,
                                    f32_from_bits(s.C[t * mn + m * s.N + n])));
  if (std::memcmp(model.data(), s.D.data(), model.size() * 4) == 0)
    return ::testing::AssertionSuccess();
  size_t first = 0, count = 0;
  for (size_t i = model.size(); i-- > 0;)
    if (model[i] != s.D[i]) first = i, ++count;
  const size_t t = first / mn, m = (first % mn) / s.N, n = first % s.N;
  auto r = ::testing::AssertionFailure();
  r << s.category << " (instr " << s.instr << ", K " << s.K << "): " << count << " of "
    << model.size() << " outputs differ; first: tile " << t << " row " << m << " col " << n
    << ": gpu " << hex32(s.D[first]) << " model " << hex32(model[first]) << ", c "
    << hex32(s.C[first]) << "; nonzero a*b (bf16 bits):";
  for (uint32_t k = 0; k < s.K; ++k) {
    bf16 a = s.A[t * mk + m * s.K + k], b = s.Bt[t * nk + n * s.K + k];
    if ((a.bits & 0x7fff) && (b.bits & 0x7fff)) {
      char buf[48];
      std::snprintf(buf, sizeof buf, " k%u:%04x*%04x", k, a.bits, b.bits);
      r << buf;
    }
  }
  return r;
}

struct GoldenSpec {
  const char* file;
  uint32_t instr;
};
void PrintTo(const GoldenSpec& s, std::ostream* os) { *os << s.file; }
// Instruction codes as in the probe: 1 mma.sync m16n8k16; 2 wgmma m64n8k16 (A, B in shared
// memory); 3 same with A in registers; 4 wgmma m64n64k16; 5 as 2 with scale-d = 0 in the first
// k-block (C recorded as +0).
const GoldenSpec kGolden[] = {{"mma_sync_m16n8k16.bin", 1},
                              {"wgmma_m64n8k16_ss.bin", 2},
                              {"wgmma_m64n8k16_rs.bin", 3},
                              {"wgmma_m64n64k16_ss.bin", 4},
                              {"wgmma_m64n8k16_ss_d0.bin", 5}};
// Categories every golden file must hold (the probe's generators; see docs/probes.md).
const char* const kCategories[] = {
    "rand_normal", "rand_spread", "rand_bigc", "rand_smallc", "rand_close", "rand_sparse",
    "sub_in",      "sub_out",     "sub_c",     "zeros",       "cancel",     "infnan",
    "overflow",    "nearmax",     "few_terms", "tiny_floor",  "unit_floor", "mixed"};

class MmaGolden : public ::testing::TestWithParam<GoldenSpec> {};

TEST_P(MmaGolden, ModelReproducesEveryGpuOutput) {
  const GoldenSpec spec = GetParam();
  std::vector<Section> sections;
  const std::string path = golden_dir() + "/" + spec.file;
  const std::string err = read_golden(path, sections);
  ASSERT_TRUE(err.empty()) << err;
  uint64_t outputs = 0;
  for (const char* cat : kCategories) {
    bool found = std::any_of(sections.begin(), sections.end(),
                             [&](const Section& s) { return s.category == cat; });
    EXPECT_TRUE(found) << path << ": no section for category " << cat;
  }
  for (const Section& s : sections) {
    EXPECT_EQ(s.instr, spec.instr) << path << ": section " << s.category;
    EXPECT_TRUE(check_section(s)) << path;
    outputs += s.D.size();
  }
  std::printf("[golden] %s: %zu sections, %llu GPU outputs checked\n", spec.file, sections.size(),
              (unsigned long long)outputs);
}

INSTANTIATE_TEST_SUITE_P(H200, MmaGolden, ::testing::ValuesIn(kGolden),
                         [](const ::testing::TestParamInfo<GoldenSpec>& info) {
                           std::string n = info.param.file;
                           n = n.substr(0, n.find('.'));
                           return n;
                         });

TEST(MmaGoldenReader, RejectsMissingAndMalformedFiles) {
  std::vector<Section> s;
  EXPECT_NE(read_golden("/nonexistent/lockstep_golden.bin", s).find("cannot open"),
            std::string::npos);
  const std::string tmp = ::testing::TempDir() + "lockstep_bad_golden.bin";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite("LSMMAGD1", 1, 8, f);
  uint32_t h[6] = {1, 16, 8, 16, 2, 0};  // promises 2 tiles, holds none
  std::fwrite(h, 4, 6, f);
  char name[32] = "truncated";
  std::fwrite(name, 1, 32, f);
  std::fclose(f);
  s.clear();
  EXPECT_NE(read_golden(tmp, s).find("truncated tile data"), std::string::npos);
  f = std::fopen(tmp.c_str(), "wb");
  std::fwrite("NOTMAGIC", 1, 8, f);
  std::fclose(f);
  s.clear();
  EXPECT_NE(read_golden(tmp, s).find("bad magic"), std::string::npos);
  std::remove(tmp.c_str());
}

// ---------------------------------------------------------------------------------------------
// Properties of the model.

bf16 bfv(float x) { return f32_to_bf16(x); }
uint32_t run(const std::vector<bf16>& a, const std::vector<bf16>& b, float c) {
  return f32_bits(mma_kblock_bf16(a.data(), b.data(), c));
}
std::vector<bf16> zeros16() { return std::vector<bf16>(kMmaK, bf16{0}); }

// Random bf16 with a wide exponent range; subnormals and zeros now and then.
bf16 wide_bf16(std::mt19937_64& g) {
  uint32_t r = uint32_t(g());
  uint16_t sign = (r & 1) ? 0x8000 : 0;
  switch ((r >> 1) % 16) {
    case 0:
      return bf16{sign};
    case 1:
      return bf16{uint16_t(sign | (1 + (r >> 8) % 127))};  // subnormal
    default: {
      int e = int((r >> 8) % 61) - 30;
      return bf16{uint16_t(sign | uint16_t(e + 127) << 7 | ((r >> 20) & 0x7f))};
    }
  }
}
float wide_f32(std::mt19937_64& g) {
  uint32_t r = uint32_t(g());
  int e = int(r % 81) - 40;
  return f32_from_bits((r & 0x80000000u) | uint32_t(e + 127) << 23 | ((r >> 7) & 0x7fffff));
}

// The model written a second way, straight from the contract text (docs/contract.md §M),
// with exact double arithmetic where the library uses integer tricks. Slow; for comparison.
uint32_t spec_kblock(const bf16* a, const bf16* b, float c) {
  bool nan = false;
  int inf = 0;
  auto see_inf = [&](int s) {
    if (inf != 0 && inf != s) nan = true;
    inf = s;
  };
  struct Term {
    double value;  // exact
    int e;         // exponent that enters E
  };
  std::vector<Term> terms;
  auto exp_of = [](uint32_t field, int bias) { return int(field == 0 ? 1 : field) - bias; };
  for (int i = 0; i < kMmaK; ++i) {
    const uint32_t ua = a[i].bits, ub = b[i].bits;
    const bool a_nan = (ua & 0x7fff) > 0x7f80, b_nan = (ub & 0x7fff) > 0x7f80;
    const bool a_inf = (ua & 0x7fff) == 0x7f80, b_inf = (ub & 0x7fff) == 0x7f80;
    const bool a_zero = (ua & 0x7fff) == 0, b_zero = (ub & 0x7fff) == 0;
    const int s = ((ua ^ ub) & 0x8000) ? -1 : 1;
    if (a_nan || b_nan || ((a_inf || b_inf) && (a_zero || b_zero))) {
      nan = true;
    } else if (a_inf || b_inf) {
      see_inf(s);
    } else if (!a_zero && !b_zero) {
      const double va = bf16_to_f32(a[i]), vb = bf16_to_f32(b[i]);
      terms.push_back({va * vb, exp_of((ua >> 7) & 0xff, 127) + exp_of((ub >> 7) & 0xff, 127)});
    }
  }
  const uint32_t uc = f32_bits(c);
  if ((uc & 0x7fffffffu) > 0x7f800000u)
    nan = true;
  else if ((uc & 0x7fffffffu) == 0x7f800000u)
    see_inf((uc >> 31) ? -1 : 1);
  else if ((uc & 0x7fffffffu) != 0)
    terms.push_back({double(c), exp_of((uc >> 23) & 0xff, 127)});
  if (nan) return 0x7fffffffu;
  if (inf != 0) return inf > 0 ? 0x7f800000u : 0xff800000u;
  if (terms.empty()) return 0;
  int E = INT32_MIN;
  for (const Term& t : terms) E = std::max(E, t.e);
  const int u = std::max(E - 25, -158);
  double sum = 0;  // every partial sum is a multiple of 2^u below 2^(E+7): exact in double
  for (const Term& t : terms) sum += std::trunc(std::ldexp(t.value, -u));
  const double v = std::ldexp(sum, u);
  if (std::fabs(v) >= 0x1p128) return v > 0 ? 0x7f800000u : 0xff800000u;
  if (v == 0) return 0;
  int lead;
  std::frexp(v, &lead);  // |v| in [2^(lead-1), 2^lead)
  const int q = std::max(lead - 1 - 23, -149);
  const double r = std::ldexp(std::trunc(std::ldexp(v, -q)), q);
  return r == 0 ? 0u : f32_bits(float(r));
}

TEST(MmaModel, SmallIntegersAreExact) {
  auto g = test::rng(1);
  for (int it = 0; it < 2000; ++it) {
    std::vector<bf16> a(64), b(64);
    double exact = double(int(g() % 201) - 100);
    float c = float(exact);
    for (int k = 0; k < 64; ++k) {
      int x = int(g() % 33) - 16, y = int(g() % 33) - 16;
      a[k] = bfv(float(x));
      b[k] = bfv(float(y));
      exact += double(x) * y;
    }
    ASSERT_EQ(f32_bits(mma_chain_bf16(a.data(), b.data(), 64, c)), f32_bits(float(exact)))
        << "iteration " << it;
  }
}

TEST(MmaModel, SymmetricInOperandsAndOrderWithinBlock) {
  auto g = test::rng(2);
  for (int it = 0; it < 20000; ++it) {
    std::vector<bf16> a(kMmaK), b(kMmaK);
    for (int k = 0; k < kMmaK; ++k) a[k] = wide_bf16(g), b[k] = wide_bf16(g);
    float c = (it % 5 == 0) ? 0.0f : wide_f32(g);
    uint32_t ref = run(a, b, c);
    ASSERT_EQ(run(b, a, c), ref) << "a <-> b, iteration " << it;
    std::vector<int> perm(kMmaK);
    for (int k = 0; k < kMmaK; ++k) perm[k] = k;
    std::shuffle(perm.begin(), perm.end(), g);
    std::vector<bf16> pa(kMmaK), pb(kMmaK);
    for (int k = 0; k < kMmaK; ++k) pa[k] = a[perm[k]], pb[k] = b[perm[k]];
    ASSERT_EQ(run(pa, pb, c), ref) << "k permuted, iteration " << it;
    // Negating a and c negates the result (truncation is toward zero: sign-symmetric); an
    // exact zero stays +0.
    std::vector<bf16> na(a);
    for (auto& x : na) x.bits ^= 0x8000;
    uint32_t neg = run(na, b, -c);
    ASSERT_EQ(neg, ref == 0 ? 0u : ref ^ 0x80000000u) << "negation, iteration " << it;
  }
}

// Inputs from every regime: all exponents, subnormals, zeros, inf, NaN; c likewise.
bf16 any_bf16(std::mt19937_64& g) {
  uint32_t r = uint32_t(g());
  uint16_t sign = (r & 1) ? 0x8000 : 0;
  switch ((r >> 1) % 64) {
    case 0:
      return bf16{uint16_t(sign | 0x7f80)};
    case 1:
      return bf16{uint16_t(sign | 0x7fc0)};
    case 2:
    case 3:
    case 4:
      return bf16{sign};
    case 5:
    case 6:
    case 7:
    case 8:
      return bf16{uint16_t(sign | (1 + (r >> 8) % 127))};
    default: {
      // Exponent: mostly near one scale per call site, sometimes anywhere.
      int e = ((r >> 7) & 7) == 0 ? int((r >> 10) % 254) - 126 : int((r >> 10) % 41) - 20;
      return bf16{uint16_t(sign | uint16_t(e + 127) << 7 | ((r >> 20) & 0x7f))};
    }
  }
}

TEST(MmaModel, AgreesWithTheContractWrittenOut) {
  auto g = test::rng(5);
  const int scales[] = {0, -60, -120, -140, 60, 120};
  for (int it = 0; it < 300000; ++it) {
    bf16 a[kMmaK], b[kMmaK];
    const int shift = scales[it % 6];  // moves every product by 2*shift in exponent
    for (int k = 0; k < kMmaK; ++k) {
      a[k] = any_bf16(g), b[k] = any_bf16(g);
      for (bf16* x : {&a[k], &b[k]}) {
        int field = (x->bits >> 7) & 0xff;
        if (field == 0 || field == 0xff || it % 3 == 0) continue;  // keep specials / wide mixes
        field = std::clamp(field + shift, 1, 254);
        x->bits = uint16_t((x->bits & 0x807f) | field << 7);
      }
    }
    uint32_t r = uint32_t(g());
    float c;
    switch (r % 8) {
      case 0:
        c = (r & 8) ? -0.0f : 0.0f;
        break;
      case 1:
        c = f32_from_bits((r & 0x80000000u) | (1 + (r >> 4) % 0x7fffff));
        break;
      case 2:
        c = (r & 8) ? -INFINITY : (r & 16) ? INFINITY : f32_from_bits(0x7fc00001u);
        break;
      default:
        c = f32_from_bits((r & 0x80000000u) |
                          uint32_t(std::clamp(int((r >> 3) % 80) - 40 + 2 * shift + 127, 1, 254))
                              << 23 |
                          uint32_t(g() & 0x7fffff));
    }
    const uint32_t want = spec_kblock(a, b, c), got = f32_bits(mma_kblock_bf16(a, b, c));
    if (want != got) {
      std::string in;
      for (int k = 0; k < kMmaK; ++k) {
        // NOTE: appended piecewise; `" " + std::string` trips GCC 12's -Wrestrict false positive.
        in += ' ';
        in += hex16(a[k].bits);
        in += '*';
        in += hex16(b[k].bits);
      }
      FAIL() << "iteration " << it << ": model " << hex32(got) << " spec " << hex32(want) << " c "
             << hex32(f32_bits(c)) << " products (bf16 bits)" << in;
    }
  }
}

TEST(MmaModel, ChainIsBlockAfterBlock) {
  auto g = test::rng(3);
  std::vector<bf16> a(256), b(256);
  for (auto& x : a) x = wide_bf16(g);
  for (auto& x : b) x = wide_bf16(g);
  float c = wide_f32(g), ref = c;
  for (int k = 0; k < 256; k += kMmaK) ref = mma_kblock_bf16(&a[k], &b[k], ref);
  EXPECT_EQ(f32_bits(mma_chain_bf16(a.data(), b.data(), 256, c)), f32_bits(ref));
  EXPECT_EQ(f32_bits(mma_chain_bf16(a.data(), b.data(), 0, c)), f32_bits(c));
}

TEST(MmaModel, ZeroProductsPassCThroughAndZeroIsPositive) {
  std::vector<bf16> a = zeros16(), b(kMmaK, bfv(3.0f));
  a[3].bits = 0x8000;  // -0 * 3
  for (float c :
       {1.0f, -2.5f, FLT_MAX, f32_from_bits(0x00000001u), f32_from_bits(0x807fffffu), FLT_MIN})
    EXPECT_EQ(run(a, b, c), f32_bits(c)) << c;
  EXPECT_EQ(run(a, b, -0.0f), 0u) << "-0 + (+-0 products) is +0";
  // Exact cancellation gives +0 also when every term is negative zero or c is -0.
  std::vector<bf16> x = zeros16(), y = zeros16();
  x[0] = bfv(1.5f), y[0] = bfv(2.0f), x[1] = bfv(1.5f), y[1] = bfv(-2.0f);
  EXPECT_EQ(run(x, y, -0.0f), 0u);
  x = zeros16(), y = zeros16();
  x[0] = bfv(-3.0f), y[0] = bfv(1.0f);
  EXPECT_EQ(run(x, y, 3.0f), 0u);
}

TEST(MmaModel, TermsAreTruncatedBeforeTheSum) {
  // Eight products of 1.5*2^-25 with c = 1: each is truncated to 2^-25 (unit 2^-25 for E = 0),
  // so the sum is 1 + 2^-22; exact summation would give 1 + 3*2^-23.
  std::vector<bf16> a = zeros16(), b = zeros16();
  for (int k = 0; k < 8; ++k) a[k] = bfv(1.5f), b[k] = bfv(std::ldexp(1.0f, -25));
  EXPECT_EQ(run(a, b, 1.0f), 0x3f800002u);
  // A negative term below the unit vanishes: 1 - 2^-30 gives 1, not the float below 1.
  a = zeros16(), b = zeros16();
  a[0] = bfv(-1.0f), b[0] = bfv(std::ldexp(1.0f, -30));
  EXPECT_EQ(run(a, b, 1.0f), 0x3f800000u);
}

TEST(MmaModel, ProductExponentIsUnnormalized) {
  // 1.5*1.5 = 2.25 has exponent e(a)+e(b) = 0 (not 1), so the unit is 2^-25 and c = -1.5*2^-25
  // is truncated to -2^-25 (not to 0): 2.25 - 2^-25 rounds toward zero to 2.25 - 2^-22.
  std::vector<bf16> a = zeros16(), b = zeros16();
  a[0] = bfv(1.5f), b[0] = bfv(1.5f);
  EXPECT_EQ(run(a, b, -1.5f * std::ldexp(1.0f, -25)), 0x400fffffu);
}

TEST(MmaModel, ResultRoundsTowardZero) {
  std::vector<bf16> a = zeros16(), b = zeros16();
  a[0] = bfv(1.0f), b[0] = bfv(std::ldexp(1.0f, -23));  // one ulp of 1.0, times 0.75 below
  a[1] = bfv(-0.75f), b[1] = bfv(std::ldexp(1.0f, -23));
  // 1 + 2^-23 - 0.75*2^-23 = 1 + 0.25 ulp -> 1 (round to nearest would give 1 too); and
  // 1 + 0.75 ulp -> 1 (nearest would round up).
  EXPECT_EQ(run(a, b, 1.0f), 0x3f800000u);
  a[1] = bfv(-0.25f);
  EXPECT_EQ(run(a, b, 1.0f), 0x3f800000u);
  a[1] = bfv(0.75f);  // 1 + 1.75 ulp -> 1 + 1 ulp
  EXPECT_EQ(run(a, b, 1.0f), 0x3f800001u);
}

TEST(MmaModel, SubnormalResultsTruncateOntoTheGridAndUnitHasAFloor) {
  std::vector<bf16> a = zeros16(), b = zeros16();
  a[0] = bfv(std::ldexp(1.0f, -70)), b[0] = bfv(std::ldexp(1.0f, -70));  // 2^-140, exact
  EXPECT_EQ(run(a, b, 0.0f), 0x00000200u);
  // A tiny negative below 2^-149 rounds toward zero to +0 (never -0).
  a[0] = bfv(-std::ldexp(1.0f, -75)), b[0] = bfv(std::ldexp(1.0f, -76));
  EXPECT_EQ(run(a, b, 0.0f), 0u);
  // 2^-140 - 2^-159: the unit is 2^max(E-25, -158) = 2^-158, so -2^-159 is truncated to 0 and
  // the result is 2^-140 (an exact sum would round toward zero to 2^-140 - 2^-149).
  a = zeros16(), b = zeros16();
  a[0] = bfv(std::ldexp(1.0f, -70)), b[0] = bfv(std::ldexp(1.0f, -70));
  a[1] = bfv(-std::ldexp(1.0f, -80)), b[1] = bfv(std::ldexp(1.0f, -79));
  EXPECT_EQ(run(a, b, 0.0f), 0x00000200u);
  // Subnormal bf16 inputs keep exponent -126 (no renormalization): 2^-133 * 2^0.
  a = zeros16(), b = zeros16();
  a[0] = bf16{0x0001}, b[0] = bfv(1.0f);
  EXPECT_EQ(run(a, b, 0.0f), f32_bits(std::ldexp(1.0f, -133)));
}

TEST(MmaModel, OverflowAndNearFltMax) {
  std::vector<bf16> a = zeros16(), b = zeros16();
  a[0] = bfv(std::ldexp(1.0f, 52)), b[0] = bfv(std::ldexp(1.0f, 51));  // 2^103 < ulp(FLT_MAX)
  EXPECT_EQ(run(a, b, FLT_MAX), f32_bits(FLT_MAX)) << "toward zero: stays FLT_MAX";
  b[0] = bfv(std::ldexp(1.0f, 52));  // 2^104 = ulp: the sum reaches 2^128
  EXPECT_EQ(run(a, b, FLT_MAX), 0x7f800000u);
  a[0].bits ^= 0x8000;
  EXPECT_EQ(run(a, b, -FLT_MAX), 0xff800000u);
  // Products beyond fp32's range cancel exactly inside the block: 2^130 - 2^130 + 1.
  a = zeros16(), b = zeros16();
  a[0] = bfv(std::ldexp(1.0f, 65)), b[0] = bfv(std::ldexp(1.0f, 65));
  a[1] = bfv(-std::ldexp(1.0f, 65)), b[1] = bfv(std::ldexp(1.0f, 65));
  EXPECT_EQ(run(a, b, 0.0f), 0u);
  // 16 products of 2^126 sum to 2^130: inf.
  for (int k = 0; k < kMmaK; ++k) a[k] = bfv(std::ldexp(1.0f, 63)), b[k] = a[k];
  EXPECT_EQ(run(a, b, 0.0f), 0x7f800000u);
}

TEST(MmaModel, InfAndNaN) {
  const bf16 inf{0x7f80}, ninf{0xff80};
  std::vector<bf16> a(kMmaK, bfv(1.0f)), b(kMmaK, bfv(1.0f));
  a[2] = inf;
  EXPECT_EQ(run(a, b, 1.0f), 0x7f800000u);
  EXPECT_EQ(run(a, b, -INFINITY), 0x7fffffffu) << "inf - inf";
  b[2] = bf16{0x8000};
  EXPECT_EQ(run(a, b, 1.0f), 0x7fffffffu) << "inf * -0";
  b[2] = bfv(-2.0f);
  EXPECT_EQ(run(a, b, 1.0f), 0xff800000u);
  a[5] = ninf;
  EXPECT_EQ(run(a, b, 1.0f), 0xff800000u) << "-inf twice";
  a = std::vector<bf16>(kMmaK, bfv(1.0f));
  for (uint16_t nan : {0x7fc0, 0xffc0, 0x7f81, 0xffff}) {
    a[7] = bf16{nan};
    EXPECT_EQ(run(a, b, 1.0f), 0x7fffffffu) << "NaN operand " << nan;
  }
  a[7] = bfv(1.0f);
  for (uint32_t nan : {0x7fc12345u, 0xff800001u, 0xffffffffu})
    EXPECT_EQ(run(a, b, f32_from_bits(nan)), 0x7fffffffu) << "NaN c " << nan;
}

TEST(MmaModel, Deterministic) {
  auto g = test::rng(4);
  std::vector<bf16> a(1024), b(1024);
  for (auto& x : a) x = wide_bf16(g);
  for (auto& x : b) x = wide_bf16(g);
  uint32_t r1 = f32_bits(mma_chain_bf16(a.data(), b.data(), 1024, 0.5f));
  uint32_t r2 = f32_bits(mma_chain_bf16(a.data(), b.data(), 1024, 0.5f));
  EXPECT_EQ(r1, r2);
}

}  // namespace
}  // namespace lockstep
