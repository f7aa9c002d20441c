// What the fuzz targets share: reading numbers off the input, and aborting on a broken
// invariant (libFuzzer keeps the input that did it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace fuzz {

[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

/// Little-endian numbers off the input; past its end, zero bytes.
struct input_reader {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  std::uint64_t take(std::size_t bytes) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < bytes && at < size; ++b) v |= std::uint64_t(data[at++]) << (8 * b);
    return v;
  }
  bool more(std::size_t bytes) const { return at + bytes <= size; }
};

}  // namespace fuzz
