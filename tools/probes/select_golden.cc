// Picks the tiles of a probe run (scripts/probe_mma.sh output, golden format) that go into
// tests/golden/, and reports which alternative MMA models the recorded GPU outputs refute.
// CPU only; not built by CMake (tools/probes/*.cu are the GPU probes). Build and use:
//   g++ -O2 -std=c++20 -ffp-contract=off -Iinclude -Isrc -o /tmp/select_golden
//       tools/probes/select_golden.cc src/core/mma_model.cc      (one command line)
//   /tmp/select_golden RUN/mma_sync_m16n8k16.bin tests/golden/mma_sync_m16n8k16.bin 6 12
// (arguments: input, output, tiles kept per random-data section, per edge-case section).
// Per section: every GPU output must equal the library model (else exit 1); tiles are chosen
// greedily so that each alternative refuted anywhere in the section is refuted by a kept tile,
// then the first tiles (one per generator mode) and the most refuting ones fill the budget.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/mma_model.h"

namespace {

using lockstep::bf16;

// A family of candidate models around the measured one; each field is one hypothesis.
struct Alt {
  const char* name;
  int unit_floor = -158;       // truncation unit never below 2^unit_floor (-100000: no floor)
  int extra = 25;              // unit 2^(E-extra)
  bool rne_result = false;     // round the sum to nearest even (via double) instead of toward zero
  bool renorm_sub_in = false;  // subnormal bf16 inputs enter E with their normalized exponent
  bool renorm_sub_c = false;   // subnormal c enters E with its normalized exponent
  bool flush_in = false, flush_c = false, flush_out = false;  // subnormals flushed to zero
  bool norm_product = false;  // products enter E with their true (normalized) exponent
};

int bitlen(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

uint32_t alt_kblock(const uint16_t* a, const uint16_t* b, uint32_t uc, const Alt& o) {
  struct Term {
    int64_t m;  // value = m * 2^lsb
    int lsb, e;
  } t[17];
  int nt = 0, inf = 0;
  bool nan = false;
  for (int i = 0; i < 16; ++i) {
    uint32_t ua = a[i], ub = b[i];
    int xa = (ua >> 7) & 0xff, xb = (ub >> 7) & 0xff, fa = ua & 0x7f, fb = ub & 0x7f;
    bool neg = ((ua ^ ub) >> 15) & 1;
    if ((xa == 0xff && fa) || (xb == 0xff && fb)) {
      nan = true;
      continue;
    }
    bool za = xa == 0 && (fa == 0 || o.flush_in), zb = xb == 0 && (fb == 0 || o.flush_in);
    if (xa == 0xff || xb == 0xff) {
      if (za || zb)
        nan = true;
      else if (inf && inf != (neg ? -1 : 1))
        nan = true;
      else
        inf = neg ? -1 : 1;
      continue;
    }
    if (za || zb) continue;
    int ma = xa ? (fa | 0x80) : fa, mb = xb ? (fb | 0x80) : fb;
    int ea = (xa ? xa : 1) - 127, eb = (xb ? xb : 1) - 127;
    int eea = ea, eeb = eb;
    if (o.renorm_sub_in) {
      if (!xa) eea = ea - 7 + bitlen(ma) - 1;
      if (!xb) eeb = eb - 7 + bitlen(mb) - 1;
    }
    if (o.norm_product) eea = ea + eb - 14 + bitlen(uint64_t(ma * mb)) - 1, eeb = 0;
    t[nt++] = {int64_t(ma * mb) * (neg ? -1 : 1), ea + eb - 14, eea + eeb};
  }
  int xc = (uc >> 23) & 0xff, fc = uc & 0x7fffff;
  if (xc == 0xff) {
    if (fc)
      nan = true;
    else if (inf && inf != ((uc >> 31) ? -1 : 1))
      nan = true;
    else
      inf = (uc >> 31) ? -1 : 1;
  }
  if (nan) return 0x7fffffffu;
  if (inf) return inf > 0 ? 0x7f800000u : 0xff800000u;
  if (!(xc == 0 && (fc == 0 || o.flush_c))) {
    int64_t cm = xc ? (fc | 0x800000) : fc;
    int ce = (xc ? xc : 1) - 127;
    int e = (!xc && o.renorm_sub_c) ? ce - 23 + bitlen(cm) - 1 : ce;
    t[nt++] = {(uc >> 31) ? -cm : cm, ce - 23, e};
  }
  if (!nt) return 0;
  int E = -100000;
  for (int i = 0; i < nt; ++i) E = std::max(E, t[i].e);
  const int u = std::max(E - o.extra, o.unit_floor);
  int64_t sum = 0;
  for (int i = 0; i < nt; ++i) {
    int64_t mag = t[i].m < 0 ? -t[i].m : t[i].m;
    int sh = t[i].lsb - u;
    int64_t v = sh >= 0 ? mag << sh : (sh <= -63 ? 0 : mag >> -sh);
    sum += t[i].m < 0 ? -v : v;
  }
  if (sum == 0) return 0;
  const bool neg = sum < 0;
  const uint64_t mag = uint64_t(neg ? -sum : sum);
  const int lead = u + bitlen(mag) - 1;
  float r;
  if (o.rne_result) {
    int drop = std::max(bitlen(mag) - 24, 0);
    r = float(std::ldexp(double(mag >> drop), u + drop));
  } else {
    if (lead >= 128) return neg ? 0xff800000u : 0x7f800000u;
    const int q = std::max(lead - 23, -149);
    const uint64_t m = q >= u ? (q - u >= 64 ? 0 : mag >> (q - u)) : mag << (u - q);
    if (m == 0 || (o.flush_out && lead < -126)) return 0;
    r = float(std::ldexp(double(m), q));
  }
  uint32_t bits;
  std::memcpy(&bits, &r, 4);
  return neg ? bits ^ 0x80000000u : bits;
}

struct Section {
  uint32_t h[6];  // instr, M, N, K, tiles, reserved
  char name[32];
  std::vector<uint16_t> A, B;
  std::vector<uint32_t> C, D;
};

std::vector<Section> read_sections(const char* path) {
  std::vector<Section> v;
  FILE* f = std::fopen(path, "rb");
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", path);
    std::exit(2);
  }
  char magic[8];
  while (std::fread(magic, 1, 8, f) == 8) {
    Section s;
    if (std::memcmp(magic, "LSMMAGD1", 8) != 0 || std::fread(s.h, 4, 6, f) != 6 ||
        std::fread(s.name, 1, 32, f) != 32) {
      std::fprintf(stderr, "%s: malformed section header\n", path);
      std::exit(2);
    }
    size_t mk = size_t(s.h[1]) * s.h[3], nk = size_t(s.h[2]) * s.h[3], mn = size_t(s.h[1]) * s.h[2],
           T = s.h[4];
    s.A.resize(T * mk);
    s.B.resize(T * nk);
    s.C.resize(T * mn);
    s.D.resize(T * mn);
    for (size_t t = 0; t < T; ++t)
      if (std::fread(&s.A[t * mk], 2, mk, f) != mk || std::fread(&s.B[t * nk], 2, nk, f) != nk ||
          std::fread(&s.C[t * mn], 4, mn, f) != mn || std::fread(&s.D[t * mn], 4, mn, f) != mn) {
        std::fprintf(stderr, "%s: truncated section %s\n", path, s.name);
        std::exit(2);
      }
    v.push_back(std::move(s));
  }
  std::fclose(f);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s IN.bin OUT.bin RAND_TILES EDGE_TILES\n", argv[0]);
    return 2;
  }
  const size_t rand_tiles = size_t(std::atoi(argv[3])), edge_tiles = size_t(std::atoi(argv[4]));
  const std::vector<Alt> alts = {
      {"design_v0", -100000, 25, true},  // DESIGN §3 as first written: no floor, nearest
      {"no_floor", -100000},
      {"floor_157", -157},
      {"floor_159", -159},
      {"round_nearest", -158, 25, true},
      {"renorm_sub_in", -158, 25, false, true},
      {"renorm_sub_c", -158, 25, false, false, true},
      {"flush_sub_in", -158, 25, false, false, false, true},
      {"flush_sub_c", -158, 25, false, false, false, false, true},
      {"flush_sub_out", -158, 25, false, false, false, false, false, true},
      {"extra_24", -158, 24},
      {"extra_26", -158, 26},
      {"norm_product_exp", -158, 25, false, false, false, false, false, false, true},
  };
  const size_t na = alts.size();
  auto secs = read_sections(argv[1]);
  FILE* fo = std::fopen(argv[2], "wb");
  if (!fo) {
    std::fprintf(stderr, "cannot write %s\n", argv[2]);
    return 2;
  }
  std::vector<uint64_t> wrong(na, 0);
  uint64_t outputs = 0, kept = 0;
  for (const Section& s : secs) {
    const size_t M = s.h[1], N = s.h[2], K = s.h[3], T = s.h[4];
    // refutes[t][i]: outputs of tile t that alternative i gets wrong.
    std::vector<std::vector<int>> refutes(T, std::vector<int>(na, 0));
    for (size_t t = 0; t < T; ++t)
      for (size_t m = 0; m < M; ++m)
        for (size_t n = 0; n < N; ++n) {
          const uint16_t* a = &s.A[(t * M + m) * K];
          const uint16_t* b = &s.B[(t * N + n) * K];
          const uint32_t c0 = s.C[(t * M + m) * N + n], gpu = s.D[(t * M + m) * N + n];
          float lib = lockstep::mma_chain_bf16(reinterpret_cast<const bf16*>(a),
                                               reinterpret_cast<const bf16*>(b), int64_t(K),
                                               lockstep::f32_from_bits(c0));
          if (lockstep::f32_bits(lib) != gpu) {
            std::fprintf(stderr, "%s tile %zu (%zu,%zu): gpu 0x%08x, library model 0x%08x\n",
                         s.name, t, m, n, gpu, lockstep::f32_bits(lib));
            return 1;
          }
          ++outputs;
          for (size_t i = 0; i < na; ++i) {
            uint32_t c = c0;
            for (size_t k = 0; k < K; k += 16) c = alt_kblock(a + k, b + k, c, alts[i]);
            if (c != gpu) ++refutes[t][i], ++wrong[i];
          }
        }
    const bool random = std::strncmp(s.name, "rand_", 5) == 0;
    const size_t budget = std::min(T, random ? rand_tiles : edge_tiles);
    std::set<size_t> chosen, open;
    for (size_t i = 0; i < na; ++i)
      for (size_t t = 0; t < T; ++t)
        if (refutes[t][i]) {
          open.insert(i);
          break;
        }
    while (!open.empty() && chosen.size() < budget) {  // greedy cover of refuted alternatives
      size_t best = 0;
      long best_score = -1;
      for (size_t t = 0; t < T; ++t) {
        if (chosen.count(t)) continue;
        long score = 0;
        for (size_t i = 0; i < na; ++i)
          score += (open.count(i) && refutes[t][i] ? 1000 : 0) + std::min(refutes[t][i], 10);
        if (score > best_score) best_score = score, best = t;
      }
      chosen.insert(best);
      for (size_t i = 0; i < na; ++i)
        if (refutes[best][i]) open.erase(i);
    }
    for (size_t t = 0; t < std::min<size_t>(3, T) && chosen.size() < budget; ++t) chosen.insert(t);
    std::vector<std::pair<long, size_t>> rest;
    for (size_t t = 0; t < T; ++t) {
      long score = 0;
      for (size_t i = 0; i < na; ++i) score += std::min(refutes[t][i], 5);
      if (!chosen.count(t)) rest.push_back({-score, t});
    }
    std::sort(rest.begin(), rest.end());
    for (const auto& r : rest)
      if (chosen.size() < budget) chosen.insert(r.second);
    uint32_t h[6];
    std::memcpy(h, s.h, sizeof h);
    h[4] = uint32_t(chosen.size());
    std::fwrite("LSMMAGD1", 1, 8, fo);
    std::fwrite(h, 4, 6, fo);
    std::fwrite(s.name, 1, 32, fo);
    std::printf("  %-12s %3zu of %4zu tiles; kept tiles refute:", s.name, chosen.size(), T);
    std::set<size_t> shown;
    for (size_t t : chosen) {
      std::fwrite(&s.A[t * M * K], 2, M * K, fo);
      std::fwrite(&s.B[t * N * K], 2, N * K, fo);
      std::fwrite(&s.C[t * M * N], 4, M * N, fo);
      std::fwrite(&s.D[t * M * N], 4, M * N, fo);
      kept += M * N;
      for (size_t i = 0; i < na; ++i)
        if (refutes[t][i]) shown.insert(i);
    }
    for (size_t i : shown) std::printf(" %s", alts[i].name);
    std::printf("\n");
  }
  std::fclose(fo);
  std::printf("%s: %llu outputs checked against the library model (all equal), %llu kept in %s\n",
              argv[1], (unsigned long long)outputs, (unsigned long long)kept, argv[2]);
  std::printf("outputs each alternative gets wrong:");
  for (size_t i = 0; i < na; ++i)
    std::printf(" %s %llu", alts[i].name, (unsigned long long)wrong[i]);
  std::printf("\n");
  return 0;
}
