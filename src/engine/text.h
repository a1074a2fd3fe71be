// Text helpers for the model-file layer's error messages: file contents quoted in a message are
// escaped so a damaged or hostile file cannot put control sequences or invalid UTF-8 on a terminal.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::engine {

// Bytes < 0x20 and 0x7f become \xNN; bytes >= 0x80 too when `ascii_only` (text that may not be
// valid UTF-8); longer than `max_len` bytes: cut and "..." appended.
inline std::string printable(std::string_view s, bool ascii_only, size_t max_len = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || (ascii_only && c >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// A short description of a JSON value for a message (never recursive: values may be deep).
// Objects, arrays and null by kind, integers by value; strings, booleans and other numbers by value
// when `values`, else by kind ("a string": the safetensors header's messages).
std::string describe(const nlohmann::json& v, bool values = true);

// "[384, 128]": a shape (or, with sep ",", a list of token ids) in a message.
inline std::string list_text(const std::vector<int64_t>& v, const char* sep = ", ") {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace lockstep::engine
