// SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): tiny, fast, and the same stream on every
// platform, compiler and device, which the shared-seed convention needs (std:: distributions
// are implementation-defined). Its j-th word is a pure function of the state and j, so a GPU
// thread draws word j without the ones before it and host and device draw the same stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sidco/core/config.hpp"

namespace sidco {

inline constexpr std::uint64_t splitmix_gamma = 0x9e3779b97f4a7c15ull;

SIDCO_HOST_DEVICE constexpr std::uint64_t splitmix_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The j-th word (from 0) a generator at state yields.
SIDCO_HOST_DEVICE constexpr std::uint64_t splitmix_word(std::uint64_t state, std::uint64_t j) {
  return splitmix_mix(state + (j + 1) * splitmix_gamma);
}

/// Uniform in [0, n) by multiply-shift (the high word of word * n); the bias, below
/// n / 2^64, is far below any test.
SIDCO_HOST_DEVICE inline std::size_t uniform_below(std::uint64_t word, std::size_t n) {
#if defined(__CUDA_ARCH__)
  return std::size_t(__umul64hi(word, std::uint64_t(n)));
#else
  __extension__ using wide = unsigned __int128;
  return std::size_t((wide(word) * n) >> 64);
#endif
}

/// The sequential generator; word j of a generator at state s is splitmix_word(s, j).
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t operator()() { return splitmix_mix(state += splitmix_gamma); }
  std::size_t below(std::size_t n) { return uniform_below((*this)(), n); }
  /// As if count words had been drawn.
  void skip(std::uint64_t count) { state += count * splitmix_gamma; }
};

/// Position j of a sample of uniform positions in [0, n) drawn from a generator at state:
/// what splitmix64{state}.below(n) returns on its (j + 1)-th call.
SIDCO_HOST_DEVICE inline std::size_t sample_position(std::uint64_t state, std::size_t j, std::size_t n) {
  return uniform_below(splitmix_word(state, j), n);
}

}  // namespace sidco
