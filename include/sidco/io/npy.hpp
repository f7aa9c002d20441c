// Reading 1-D float32/float64 arrays from NumPy .npy files (format versions 1-3).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "sidco/core/error.hpp"

namespace sidco::io {

namespace detail {

// The value of `'key': value` in the header dict, up to the next top-level comma or brace.
inline std::string npy_field(const std::string& header, const std::string& key,
                             const std::string& path) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos)
    sidco::detail::fail("npy file '", path, "': header has no '", key, "' field");
  auto start = header.find(':', at);
  if (start == std::string::npos)
    sidco::detail::fail("npy file '", path, "': malformed '", key, "' field");
  ++start;
  while (start < header.size() && header[start] == ' ') ++start;
  std::size_t end = start;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  return header.substr(start, end - start);
}

}  // namespace detail

/// Loads a 1-D little-endian float32 or float64 array, converted to T.
template <class T>
std::vector<T> load_npy(const std::string& path) {
  using sidco::detail::fail;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("npy file '", path, "': cannot open");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail("npy file '", path, "': not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3) fail("npy file '", path, "': unsupported format version ", major);
  std::uint32_t header_size = 0;
  unsigned char size_bytes[4] = {0, 0, 0, 0};
  const int width = major == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(size_bytes), width))
    fail("npy file '", path, "': truncated header");
  for (int i = width - 1; i >= 0; --i) header_size = header_size * 256 + size_bytes[i];
  std::string header(header_size, '\0');
  if (!in.read(header.data(), header_size)) fail("npy file '", path, "': truncated header");

  const std::string descr = detail::npy_field(header, "descr", path);
  const bool is_f4 = descr == "'<f4'";
  const bool is_f8 = descr == "'<f8'";
  if (!is_f4 && !is_f8)
    fail("npy file '", path, "': dtype ", descr, " is not little-endian float32 or float64");
  if (detail::npy_field(header, "fortran_order", path) != "False")
    fail("npy file '", path, "': Fortran-ordered arrays are not supported");
  const std::string shape = detail::npy_field(header, "shape", path);
  std::size_t count = 0;
  int dims = 0;
  for (std::size_t i = 0; i < shape.size();) {
    if (shape[i] >= '0' && shape[i] <= '9') {
      std::size_t end = i;
      while (end < shape.size() && shape[end] >= '0' && shape[end] <= '9') ++end;
      count = std::stoull(shape.substr(i, end - i));
      ++dims;
      i = end;
    } else {
      ++i;
    }
  }
  if (dims != 1) fail("npy file '", path, "': shape ", shape, " is not 1-D");

  std::vector<T> out(count);
  auto read_as = [&](auto tag) {
    using Stored = decltype(tag);
    std::vector<Stored> raw(count);
    if (!in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(count * sizeof(Stored))))
      fail("npy file '", path, "': truncated data (expected ", count, " values)");
    for (std::size_t i = 0; i < count; ++i) out[i] = T(raw[i]);
  };
  if (is_f4)
    read_as(float{});
  else
    read_as(double{});
  return out;
}

}  // namespace sidco::io
