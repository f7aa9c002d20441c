// Reading 1-D float32/float64 arrays from NumPy .npy files (format versions 1-3), treating
// every file as hostile: the header's length is capped, its dict parsed strictly (exactly
// the keys 'descr', 'fortran_order' and 'shape', once each; a shape of one non-negative
// integer that fits), and the size it claims checked against the bytes actually present
// before anything is allocated. Every failure is a sidco::error naming the file and what
// is wrong; nothing is allocated beyond the values the file holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sidco/core/error.hpp"

namespace sidco::io {

namespace detail {

/// Throws the sidco::error every reader failure becomes: the file's name, then what.
template <class... Parts>
[[noreturn]] void npy_fail(const std::string& name, const Parts&... parts) {
  sidco::detail::fail("npy file '", name, "': ", parts...);
}

/// The longest header read: numpy writes a few hundred bytes; version 1 allows 64 KiB.
inline constexpr std::size_t max_header_bytes = std::size_t(1) << 20;

struct npy_header {
  std::string descr;
  bool fortran_order = false;
  std::size_t count = 0;
};

// A strict reader of the header's Python dict literal.
class npy_header_parser {
 public:
  npy_header_parser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  npy_header parse() {
    npy_header h;
    bool descr = false, fortran = false, shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal("a key");
      expect(':');
      if (key == "descr") {
        once(descr, key);
        h.descr = string_literal("'descr'");
      } else if (key == "fortran_order") {
        once(fortran, key);
        h.fortran_order = boolean();
      } else if (key == "shape") {
        once(shape, key);
        h.count = one_dimension();
      } else {
        fail("header has an unknown key '", key, "'");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != '}') fail("header: expected ',' or '}' at byte ", at_);
    }
    ++at_;  // '}'
    skip_space();
    if (at_ != text_.size()) fail("header: unexpected text after the dict at byte ", at_);
    if (!descr) fail("header has no 'descr' field");
    if (!fortran) fail("header has no 'fortran_order' field");
    if (!shape) fail("header has no 'shape' field");
    return h;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    npy_fail(name_, parts...);
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t')) ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail("header: expected '", c, "' at byte ", at_);
    ++at_;
  }
  void once(bool& seen, const std::string& key) {
    if (seen) fail("header has the key '", key, "' twice");
    seen = true;
  }
  std::string string_literal(const char* what) {
    skip_space();
    if (peek() != '\'' && peek() != '"') fail("header: expected ", what, " (a quoted string) at byte ", at_);
    const char quote = text_[at_++];
    const std::size_t end = text_.find(quote, at_);
    if (end == std::string_view::npos) fail("header: unterminated string at byte ", at_);
    std::string s(text_.substr(at_, end - at_));
    at_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        return value;
      }
    fail("header: 'fortran_order' is not True or False");
  }
  // "(N,)": exactly one non-negative integer that fits in size_t; anything else says what.
  std::size_t one_dimension() {
    skip_space();
    const std::size_t start = at_;
    if (peek() != '(') fail("header: 'shape' is not a tuple");
    ++at_;
    std::size_t dims = 0, first = 0;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (peek() == '-') fail("header: shape ", shape_text(start), " has a negative dimension");
      if (peek() < '0' || peek() > '9') fail("header: shape ", shape_text(start), " is not a tuple of integers");
      std::size_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        const std::size_t digit = std::size_t(text_[at_++] - '0');
        if (value > (std::numeric_limits<std::size_t>::max() - digit) / 10)
          fail("header: a dimension of shape ", shape_text(start), " does not fit in 64 bits");
        value = value * 10 + digit;
      }
      if (dims++ == 0) first = value;
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != ')') fail("header: shape ", shape_text(start), " is not a tuple of integers");
      // A single integer in parentheses is not a tuple: numpy writes (N,).
      if (dims == 1) fail("header: shape ", shape_text(start), " is not a tuple (1-D is written (N,))");
    }
    ++at_;
    if (dims != 1) fail("shape ", shape_text(start), " is not 1-D");
    return first;
  }
  std::string shape_text(std::size_t start) const {
    const std::size_t end = text_.find(')', start);
    return std::string(text_.substr(start, end == std::string_view::npos ? 40 : end - start + 1));
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t at_ = 0;
};

}  // namespace detail

/// Reads a 1-D little-endian float32 or float64 array of `size` bytes from in (named name
/// in errors), converted to T.
template <class T>
std::vector<T> read_npy(std::istream& in, std::size_t size, const std::string& name) {
  auto fail = [&](const auto&... parts) { detail::npy_fail(name, parts...); };
  char magic[8];
  if (size < 10 || !in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail("not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3) fail("unsupported format version ", major);
  const int width = major == 1 ? 2 : 4;
  unsigned char size_bytes[4] = {0, 0, 0, 0};
  if (!in.read(reinterpret_cast<char*>(size_bytes), width)) fail("truncated header");
  std::size_t header_size = 0;
  for (int i = width - 1; i >= 0; --i) header_size = header_size * 256 + size_bytes[i];
  const std::size_t data_offset = 8 + std::size_t(width) + header_size;
  if (header_size > detail::max_header_bytes)
    fail("header of ", header_size, " bytes exceeds the ", detail::max_header_bytes, "-byte limit");
  if (data_offset > size) fail("truncated header (", header_size, " bytes claimed, ", size - 8 - std::size_t(width), " present)");
  std::string text(header_size, '\0');
  if (!in.read(text.data(), std::streamsize(header_size))) fail("truncated header");
  const auto header = detail::npy_header_parser(text, name).parse();
  const bool is_f4 = header.descr == "<f4";
  const bool is_f8 = header.descr == "<f8";
  if (!is_f4 && !is_f8) fail("dtype '", header.descr, "' is not little-endian float32 ('<f4') or float64 ('<f8')");
  if (header.fortran_order) fail("Fortran-ordered arrays are not supported");
  const std::size_t item = is_f4 ? 4 : 8;
  const std::size_t present = size - data_offset;
  if (header.count > present / item)
    fail("truncated data (expected ", header.count, " values, ", present, " bytes are present)");
  if (header.count * item != present) fail("the header claims ", header.count, " values but ", present, " bytes follow it");

  std::vector<T> out(header.count);
  auto read_as = [&](auto tag) {
    using Stored = decltype(tag);
    if constexpr (std::is_same_v<Stored, T>) {
      if (!in.read(reinterpret_cast<char*>(out.data()), std::streamsize(header.count * sizeof(T))))
        fail("truncated data (expected ", header.count, " values)");
    } else {
      Stored chunk[4096];  // converted a chunk at a time: no second N-sized buffer
      for (std::size_t i = 0; i < header.count;) {
        const std::size_t n = std::min<std::size_t>(4096, header.count - i);
        if (!in.read(reinterpret_cast<char*>(chunk), std::streamsize(n * sizeof(Stored))))
          fail("truncated data (expected ", header.count, " values)");
        for (std::size_t j = 0; j < n; ++j) {
          out[i + j] = T(chunk[j]);
          // Narrowing must not change what the file says: a finite value that would
          // become infinite, or a non-zero that would become zero, is refused.
          if constexpr (sizeof(Stored) > sizeof(T)) {
            const bool overflows = std::isfinite(chunk[j]) && !std::isfinite(out[i + j]);
            const bool vanishes = chunk[j] != 0 && out[i + j] == T(0);
            if (overflows || vanishes)
              fail("value ", chunk[j], " at index ", i + j, overflows ? " overflows " : " underflows to 0 in ",
                   sizeof(T) == 4 ? "float32" : "the element type", "; read the file as float64 (load_npy<double>)");
          }
        }
        i += n;
      }
    }
  };
  if (is_f4)
    read_as(float{});
  else
    read_as(double{});
  return out;
}

/// Loads a 1-D little-endian float32 or float64 array from a .npy file, converted to T.
template <class T>
std::vector<T> load_npy(const std::string& path) {
  std::ifstream in;
  // Unbuffered: the reads are few and large, and a hostile file then costs no stream buffer.
  in.rdbuf()->pubsetbuf(nullptr, 0);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) detail::npy_fail(path, "is a directory, not a .npy file");
  in.open(path, std::ios::binary | std::ios::ate);
  if (!in) detail::npy_fail(path, "cannot open");
  const auto end = in.tellg();
  if (end < 0) detail::npy_fail(path, "cannot tell its size");
  in.seekg(0);
  return read_npy<T>(in, std::size_t(end), path);
}

}  // namespace sidco::io
