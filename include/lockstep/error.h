// The one error type of the library: says which op, which argument, what was expected and what
// was found. The library throws; only main() exits.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// LS_CHECK(cond, "gemm_bf16_nt", "x: expected ", a, ", got ", b)
#define LS_CHECK(cond, op, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) throw ::lockstep::Error(::lockstep::detail::concat(op, ": ", __VA_ARGS__)); \
  } while (0)

}  // namespace lockstep
