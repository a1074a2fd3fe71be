// SHA-256: the NIST known answers (FIPS 180-4 examples, one million 'a') and every prefix length
// 0..256 against hashlib on each implementation, forced by name; the SHA-NI and portable paths
// equal on every length 0..3000 (every padding boundary: 55/56/63/64 bytes and their multiples) at
// misaligned start pointers; sha256_hex runs the fastest available one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/sha256.h"
#include "util/test_util.h"

namespace lockstep::engine {

// gtest names the implementation in a failure (found by argument-dependent lookup).
void PrintTo(Sha256Impl impl, std::ostream* os) { *os << sha256_impl_name(impl); }

namespace {

class Sha256Each : public ::testing::TestWithParam<Sha256Impl> {
 protected:
  void SetUp() override {
    if (!sha256_impl_available(GetParam()))
      GTEST_SKIP() << sha256_impl_name(GetParam()) << " is not available on this CPU";
  }
};

TEST_P(Sha256Each, NistKnownAnswers) {
  const Sha256Impl impl = GetParam();
  auto hex = [&](const std::string& s) { return sha256_hex(s.data(), s.size(), impl); };
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(nullptr, 0, impl), hex(""));
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 448 bits: the padding needs a second block.
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 896 bits.
  EXPECT_EQ(
      hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopq"
          "rlmnopqrsmnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Every padding case (the tail is one block below 56 bytes, two from 56): the digests of the
// first 0, 1, ..., 256 bytes of byte i = 167·i + 13 (mod 256), their hex concatenated and hashed.
// The expected value is Python's hashlib.sha256, an implementation independent of both paths.
TEST_P(Sha256Each, EveryPrefixLengthMatchesHashlib) {
  const Sha256Impl impl = GetParam();
  std::vector<uint8_t> msg(256);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = uint8_t(167 * i + 13);
  std::string all;
  for (size_t n = 0; n <= msg.size(); ++n) all += sha256_hex(msg.data(), n, impl);
  EXPECT_EQ(sha256_hex(all.data(), all.size(), impl),
            "7a8417ae359571f9c2378cc559041465b5cf7b83b127e4b2acad0e416a7eb118");
}

INSTANTIATE_TEST_SUITE_P(Impl, Sha256Each,
                         ::testing::Values(Sha256Impl::kPortable, Sha256Impl::kShaNi),
                         [](const auto& info) {
                           return info.param == Sha256Impl::kShaNi ? "ShaNi" : "Portable";
                         });

// Random bytes, every length 0..3000, the start moved by 0..15 bytes from a 16-byte boundary.
TEST(Sha256, ShaNiEqualsPortableOnEveryLengthAndAlignment) {
  if (!sha256_impl_available(Sha256Impl::kShaNi)) GTEST_SKIP() << "no SHA-NI on this CPU";
  constexpr size_t kMaxLen = 3000, kMaxShift = 15;
  std::mt19937_64 g = test::rng(256);
  std::vector<uint8_t> buf(kMaxLen + kMaxShift + 16);
  for (uint8_t& b : buf) b = uint8_t(g());
  const uint8_t* aligned = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 16) % 16;
  for (size_t n = 0; n <= kMaxLen; ++n) {
    const uint8_t* p = aligned + n % (kMaxShift + 1);
    ASSERT_EQ(sha256_hex(p, n, Sha256Impl::kShaNi), sha256_hex(p, n, Sha256Impl::kPortable))
        << n << " bytes at 16-byte boundary + " << n % (kMaxShift + 1);
  }
  // Every shift at the lengths around the one- and two-block padding boundaries.
  for (size_t n : {55, 56, 57, 63, 64, 65, 119, 120, 121, 127, 128, 129})
    for (size_t shift = 0; shift <= kMaxShift; ++shift)
      ASSERT_EQ(sha256_hex(aligned + shift, n, Sha256Impl::kShaNi),
                sha256_hex(aligned + shift, n, Sha256Impl::kPortable))
          << n << " bytes at 16-byte boundary + " << shift;
}

TEST(Sha256, DefaultIsTheFastestAvailable) {
  const Sha256Impl want =
      sha256_impl_available(Sha256Impl::kShaNi) ? Sha256Impl::kShaNi : Sha256Impl::kPortable;
  EXPECT_EQ(sha256_impl(), want) << sha256_impl_name(sha256_impl());
  const std::string s = "the default path gives the same digest";
  EXPECT_EQ(sha256_hex(s.data(), s.size()), sha256_hex(s.data(), s.size(), Sha256Impl::kPortable));
}

}  // namespace
}  // namespace lockstep::engine
