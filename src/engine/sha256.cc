// SHA-256 (FIPS 180-4): the message padded to a multiple of 64 bytes (0x80, zeros, the bit length
// big-endian in the last 8 bytes) and folded block by block into the eight-word state by the
// compression function. blocks_portable is the plain spec; blocks_sha_ni computes the same function
// with the x86 SHA extensions (four rounds per two sha256rnds2, the message schedule by
// sha256msg1/sha256msg2), so both give the same digest bit for bit.
#include "engine/sha256.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

// K: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// H(0): the first 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

// Folds `n` 64-byte blocks at p into the state h = (a, b, c, d, e, f, g, h).
using BlocksFn = void (*)(uint32_t* h, const uint8_t* p, size_t n);

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void blocks_portable(uint32_t* h, const uint8_t* p, size_t n) {
  for (; n; --n, p += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
             uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 =
          hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
}

#if defined(__x86_64__)
// NOTE: only these functions are compiled for the SHA extensions (and SSE4.1's blend, SSSE3's
// byte shuffle), so the library runs on any x86-64; sha256_impl() calls them only on a CPU that
// has them. Helpers carry the same target so that they inline.
#define LOCKSTEP_SHA_NI __attribute__((target("sha,sse4.1")))

// Rounds 4q..4q+3 with the message words w = W[4q..4q+3] (lane 0 first). The instructions keep
// the state as two registers, abef = (f, e, b, a) and cdgh = (h, g, d, c) from lane 0 up;
// sha256rnds2(cdgh, abef, wk) runs two rounds with wk's lanes 0 and 1 and returns the new abef,
// while the old abef is the new cdgh: two calls with the roles swapped leave both in place.
LOCKSTEP_SHA_NI inline void four_rounds(__m128i& abef, __m128i& cdgh, __m128i w, int q) {
  const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * q));
  const __m128i wk = _mm_add_epi32(w, k);
  cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);                           // now (a, b, e, f)
  abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0e));  // lanes 2, 3
}

// W[t..t+3] from the sixteen words before it: w0 = W[t-16..t-13], w1 = W[t-12..t-9],
// w2 = W[t-8..t-5], w3 = W[t-4..t-1].
LOCKSTEP_SHA_NI inline __m128i next_words(__m128i w0, __m128i w1, __m128i w2, __m128i w3) {
  __m128i w = _mm_sha256msg1_epu32(w0, w1);          // W[t-16] + σ0(W[t-15])
  w = _mm_add_epi32(w, _mm_alignr_epi8(w3, w2, 4));  // + W[t-7]
  return _mm_sha256msg2_epu32(w, w3);                // + σ1(W[t-2])
}

LOCKSTEP_SHA_NI void blocks_sha_ni(uint32_t* h, const uint8_t* p, size_t n) {
  // Byte order: the message words are big-endian; swap the bytes of each 32-bit lane.
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  const __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)),
                                         0xb1);  // (b, a, d, c)
  const __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)),
                                         0x1b);      // (h, g, f, e)
  __m128i abef = _mm_alignr_epi8(dcba, hgfe, 8);     // (f, e, b, a)
  __m128i cdgh = _mm_blend_epi16(hgfe, dcba, 0xf0);  // (h, g, d, c)
  for (; n; --n, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    const auto* m = reinterpret_cast<const __m128i*>(p);
    __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128(m), bswap);
    __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128(m + 1), bswap);
    __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128(m + 2), bswap);
    __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128(m + 3), bswap);
    four_rounds(abef, cdgh, w0, 0);
    four_rounds(abef, cdgh, w1, 1);
    four_rounds(abef, cdgh, w2, 2);
    four_rounds(abef, cdgh, w3, 3);
    for (int q = 4; q < 16; q += 4) {  // w0..w3 always hold the last sixteen words
      w0 = next_words(w0, w1, w2, w3);
      four_rounds(abef, cdgh, w0, q);
      w1 = next_words(w1, w2, w3, w0);
      four_rounds(abef, cdgh, w1, q + 1);
      w2 = next_words(w2, w3, w0, w1);
      four_rounds(abef, cdgh, w2, q + 2);
      w3 = next_words(w3, w0, w1, w2);
      four_rounds(abef, cdgh, w3, q + 3);
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1b);  // (a, b, e, f)
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1);  // (g, h, c, d)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, dchg, 0xf0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}
#undef LOCKSTEP_SHA_NI
#endif

// NOTE: cpuid rather than __builtin_cpu_supports("sha"), which clang 14 does not know.
bool cpu_has_sha_ni() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
#else
  return false;
#endif
}

BlocksFn blocks_of(Sha256Impl impl) {
#if defined(__x86_64__)
  if (impl == Sha256Impl::kShaNi) return blocks_sha_ni;
#endif
  return blocks_portable;
}

}  // namespace

const char* sha256_impl_name(Sha256Impl impl) {
  return impl == Sha256Impl::kShaNi ? "sha-ni" : "portable";
}

bool sha256_impl_available(Sha256Impl impl) {
  static const bool sha_ni = cpu_has_sha_ni();
  return impl == Sha256Impl::kPortable || sha_ni;
}

Sha256Impl sha256_impl() {
  return sha256_impl_available(Sha256Impl::kShaNi) ? Sha256Impl::kShaNi : Sha256Impl::kPortable;
}

std::string sha256_hex(const void* data, size_t size) {
  return sha256_hex(data, size, sha256_impl());
}

std::string sha256_hex(const void* data, size_t size, Sha256Impl impl) {
  LS_CHECK(sha256_impl_available(impl), "sha256_hex", sha256_impl_name(impl),
           " is not available on this CPU or build");
  const BlocksFn blocks = blocks_of(impl);
  uint32_t h[8];
  std::memcpy(h, kInit, sizeof h);
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t full = size / 64, rest = size % 64;
  blocks(h, p, full);
  // The padded tail: the rest, 0x80, zeros, the bit length; two blocks once the rest is 56 or more.
  uint8_t tail[128] = {};
  if (rest) std::memcpy(tail, p + 64 * full, rest);
  tail[rest] = 0x80;
  const size_t tail_blocks = rest < 56 ? 1 : 2;
  const uint64_t bits = uint64_t(size) * 8;
  for (int i = 0; i < 8; ++i) tail[64 * tail_blocks - 1 - i] = uint8_t(bits >> (8 * i));
  blocks(h, tail, tail_blocks);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint32_t v : h)
    for (int i = 28; i >= 0; i -= 4) s += kDigits[(v >> i) & 15];
  return s;
}

}  // namespace lockstep::engine
