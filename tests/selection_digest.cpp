// Prints the CPU kernels this build runs and, for each compressor on each bundled gradient,
// a hash of every selection and residual over four error-feedback calls. Built twice: for
// this machine (-march=native, static Highway target) and portable (dynamic dispatch);
// portable_dispatch_test.sh requires the two outputs to be identical, line for line.
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <sidco/sidco.hpp>

#include "support.hpp"

using namespace sidco;

namespace {

// FNV-1a over the bytes of each value's representation.
struct digest {
  std::uint64_t h = 1469598103934665603ull;
  template <class T>
  void add(T v) {
    for (std::size_t b = 0; b < sizeof(T); ++b) {
      h ^= (std::uint64_t(std::bit_cast<std::array<unsigned char, sizeof(T)>>(v)[b]));
      h *= 1099511628211ull;
    }
  }
};

template <class Preset, class T>
void print(const std::string& name, const std::string& file, const std::vector<T>& g) {
  for (double density : {0.001, 0.01, 0.1}) {
    Preset c;
    feedback::residual<T> residual(g.size());
    sparse_vector<T> out;
    digest d;
    for (int call = 0; call < 4; ++call) {
      c.template compress<T>(std::span<const T>(g), density, out, residual);
      d.add(out.size());
      for (std::size_t i = 0; i < out.size(); ++i) {
        d.add(std::uint64_t(out.indices()[i]));
        d.add(out.values()[i]);
      }
    }
    for (std::size_t i = 0; i < g.size(); ++i) d.add(residual.data()[i]);
    std::printf("%s %s %s %g: %016llx\n", name.c_str(), sizeof(T) == 4 ? "float" : "double", file.c_str(), density,
                static_cast<unsigned long long>(d.h));
  }
}

template <class T>
void print_all(const std::string& file) {
  const auto g = test::load_gradient<T>(file);
  methods::all::for_each([&](auto entry) {
    using method = typename decltype(entry)::type;
    print<methods::compressor_of<method>, T>(std::string(method::about.name), file, g);
  });
}

}  // namespace

int main() {
  std::printf("kernels: %s\n", backend::cpu::kernels());
  for (const auto& file : test::gradient_files()) {
    print_all<float>(file);
    print_all<double>(file);
  }
}
