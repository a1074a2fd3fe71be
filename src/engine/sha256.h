// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits. Two implementations of the
// compression function give the same digest: portable C++ (any CPU; the reference) and the x86
// SHA extensions (SHA-NI), which sha256_hex uses wherever the CPU has them. Tests hold them equal.
#pragma once

#include <cstddef>
#include <string>

namespace lockstep::engine {

enum class Sha256Impl { kPortable, kShaNi };

// "portable", "sha-ni".
const char* sha256_impl_name(Sha256Impl impl);
// Whether this build and CPU can run `impl`: kPortable always; kShaNi on x86-64 with the SHA
// extensions and SSE4.1 (checked at run time; the build needs no -march flag).
bool sha256_impl_available(Sha256Impl impl);
// What sha256_hex(data, size) runs: kShaNi where available, else kPortable. Same digest either way.
Sha256Impl sha256_impl();

std::string sha256_hex(const void* data, size_t size);
// The same with a chosen implementation (tests, bench_sha256); throws Error where it is not
// available.
std::string sha256_hex(const void* data, size_t size, Sha256Impl impl);

}  // namespace lockstep::engine
