// libFuzzer target for the .npy reader: arbitrary bytes as a file. Every input must either
// load (a vector of exactly the values the bytes hold) or throw sidco::error; anything else
// (another exception, a crash, an allocation beyond the input's size) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <sidco/io/npy.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (int as_double = 0; as_double < 2; ++as_double) {
    std::istringstream in(bytes);
    try {
      const std::size_t count = as_double ? sidco::io::read_npy<double>(in, size, "fuzz").size()
                                          : sidco::io::read_npy<float>(in, size, "fuzz").size();
      if (count * 4 > size) {
        std::fprintf(stderr, "read %zu values from %zu bytes\n", count, size);
        std::abort();
      }
    } catch (const sidco::error&) {
    }
  }
  return 0;
}
