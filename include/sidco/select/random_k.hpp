// Random-k: k indices drawn uniformly without replacement.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "sidco/backend/concept.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// Every worker that uses the same seed and calls in step draws the same indices (GRACE's
/// convention), so the selections can also be summed densely. Each call draws anew; the
/// stream depends on the seed, the call number and the segment's offset only. The backend
/// draws (core/uniform_subset.hpp), the same subset on every backend.
class random_k {
 public:
  static constexpr const char* name = "random-k";
  static constexpr bool needs_threshold = false;
  static constexpr bool fuses_layers = false;

  explicit random_k(std::uint64_t seed = 0x51dc0) : seed_(seed) {}

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double, std::size_t k, Out& out) {
    const std::uint64_t state =
        seed_ ^ (calls_++ * 0xd1b54a32d192ed03ull) ^ (std::uint64_t(source.base) * 0x8cb92ba72f3d8dd7ull);
    const std::size_t begin = out.size();
    backend.select_random(source, std::min(k, source.size), state, out);
    return {out.size() - begin, 0};
  }

  std::uint64_t seed() const { return seed_; }
  std::uint64_t calls() const { return calls_; }

  /// The call count; the seed is saved to refuse a state drawn from another seed.
  void save_state(state_writer& out) const {
    out.name(name);
    out.word(seed_);
    out.word(calls_);
  }
  void load_state(state_reader& in) {
    in.expect(name);
    const std::uint64_t seed = in.word("random_k: seed");
    if (seed != seed_) sidco::detail::fail("state: random_k: drawn with seed ", seed, ", this selection has seed ", seed_);
    calls_ = in.word("random_k: calls");
  }

 private:
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

}  // namespace sidco::select
