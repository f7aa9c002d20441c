// Helpers shared by the tests: the bundled real gradients and brute-force references.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <sidco/io/npy.hpp>

#include "bundled_gradients.hpp"

namespace sidco::test {

/// Every real gradient file bundled under examples/data/gradients.
inline const std::vector<std::string>& gradient_files() {
  static const std::vector<std::string> files = {
      "cnn_ef_it200.npy", "cnn_it10.npy",  "cnn_it200.npy",
      "ffn_it10.npy",     "ffn_it200.npy", "lstm_it10.npy"};
  return files;
}

/// Built under a sanitizer (scripts/test.sh's clang builds: AddressSanitizer with UBSan beside
/// it, ThreadSanitizer): they check memory, undefined behaviour and races, which every path
/// shows on the smaller inputs too. The tests whose cost is their size (statistics over many
/// calls, the largest gradient at several thread counts) run a smaller sweep there; the g++
/// build runs the whole of it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif
#else
inline constexpr bool sanitized = false;
#endif

/// One bundled gradient of each model (the FFN's, the CNN's, the LSTM's); under the sanitizers
/// without the LSTM's 3.7M values (1.2M of the 7M left).
inline const std::vector<std::string>& one_gradient_per_model() {
  static const std::vector<std::string> files =
      sanitized ? std::vector<std::string>{"ffn_it10.npy", "cnn_it200.npy"}
                : std::vector<std::string>{"ffn_it10.npy", "cnn_it200.npy", "lstm_it10.npy"};
  return files;
}

/// Every bundled gradient; under the sanitizers one of each model but the LSTM.
inline const std::vector<std::string>& swept_gradient_files() {
  return sanitized ? one_gradient_per_model() : gradient_files();
}

/// The folder the gradients are read from: SIDCO_GRADIENTS_DIR in the environment (binaries
/// moved to another machine, scripts/gpu_check.sh) or the source tree's.
inline std::string gradients_dir() {
  const char* moved = std::getenv("SIDCO_GRADIENTS_DIR");
  return moved && *moved ? moved : bundled::gradients_dir();
}

template <class T = float>
std::vector<T> load_gradient(const std::string& file) {
  return io::load_npy<T>(gradients_dir() + "/" + file);
}

/// Brute force: how many |x| exceed t.
template <class T>
std::size_t count_above(std::span<const T> x, double t) {
  std::size_t n = 0;
  for (T v : x) n += std::fabs(double(v)) > t;
  return n;
}

}  // namespace sidco::test
