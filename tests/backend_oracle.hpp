// The kernel oracle: a backend's contract members against backend::serial on the same
// inputs, for any backend (one type to add). Data is uploaded to the backend's memory
// space and results come back through it, so device backends run the same comparisons.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "doctest.hpp"
#include <sidco/backend/concept.hpp>
#include <sidco/backend/serial.hpp>
#include <sidco/backend/source.hpp>
#include <sidco/core/splitmix.hpp>
#include <sidco/core/uniform_subset.hpp>

#include "reference.hpp"

namespace sidco::test {

/// Copies between host vectors and a backend's memory space.
template <class Memory>
struct transfer {
  template <class T>
  static typename Memory::template buffer<T> upload(std::span<const T> host) {
    typename Memory::template buffer<T> b;
    b.resize(host.size());
    Memory::copy_from_host(host, typename Memory::template view<T>{b.data(), host.size()});
    return b;
  }
  template <class T>
  static std::vector<std::remove_const_t<T>> download(typename Memory::template view<T> v) {
    std::vector<std::remove_const_t<T>> host(v.size());
    Memory::copy_to_host(typename Memory::template view<const std::remove_const_t<T>>{v.data(), v.size()},
                         std::span<std::remove_const_t<T>>(host));
    return host;
  }
  template <class T, class Index>
  static std::vector<std::pair<std::size_t, T>> entries(const sparse_vector<T, Index, Memory>& s) {
    const auto indices = download<const Index>(s.indices());
    const auto values = download<const T>(s.values());
    std::vector<std::pair<std::size_t, T>> out;
    for (std::size_t i = 0; i < indices.size(); ++i) out.emplace_back(std::size_t(indices[i]), values[i]);
    return out;
  }
  /// Whether a holds exactly want's entries (indices equal, values ==), the first difference
  /// reported. Host vectors are read in place: copies of millions of entries per comparison
  /// cost the oracle tests more page faults than their kernels took time.
  template <class T, class Index, class WantIndex>
  static bool same_entries(const sparse_vector<T, Index, Memory>& a, const sparse_vector<T, WantIndex>& want) {
    if constexpr (std::is_same_v<Memory, memory::host>) {
      return equal_entries<T>(a.indices(), a.values(), want.indices(), want.values());
    } else {
      const auto indices = download<const Index>(a.indices());
      const auto values = download<const T>(a.values());
      return equal_entries<T>(std::span<const Index>(indices), std::span<const T>(values), want.indices(),
                              want.values());
    }
  }

 private:
  template <class T, class Index, class WantIndex>
  static bool equal_entries(std::span<const Index> indices, std::span<const T> values,
                            std::span<const WantIndex> want_indices, std::span<const T> want_values) {
    if (indices.size() != want_indices.size()) {
      MESSAGE(indices.size(), " entries where ", want_indices.size(), " were expected");
      return false;
    }
    for (std::size_t i = 0; i < indices.size(); ++i)
      if (std::size_t(indices[i]) != std::size_t(want_indices[i]) || !(values[i] == want_values[i])) {
        MESSAGE("entry ", i, ": (", std::size_t(indices[i]), ", ", double(values[i]), ") where (",
                std::size_t(want_indices[i]), ", ", double(want_values[i]), ") was expected");
        return false;
      }
    return true;
  }
};

// Float sums (float and the 16-bit types) run in float lanes over blocks of 1024 before
// they reach double.
template <class T>
constexpr double sum_tolerance = sizeof(T) <= 4 ? 2e-6 : 1e-13;
// ln|x|: the fast log's own error (2e-7 of max(|ln a|, 1) for float) adds up over the sum.
template <class T>
constexpr double log_tolerance = sizeof(T) <= 4 ? 4e-6 : 1e-12;

inline void check_same_moments(const moments& got, const moments& want, double tolerance, bool with_log = true) {
  CHECK(got.count == want.count);
  CHECK(got.zeros == want.zeros);
  CHECK(got.nonfinite == want.nonfinite);
  CHECK(got.min == want.min);
  CHECK(got.max == want.max);
  CHECK(got.sum == doctest::Approx(want.sum).epsilon(tolerance));
  CHECK(got.sum_sq == doctest::Approx(want.sum_sq).epsilon(tolerance));
  if (with_log) CHECK(got.sum_log == doctest::Approx(want.sum_log).epsilon(tolerance));
}

// Tails: excesses are computed in T from the largest T not above t, the oracle's in double
// from t; they agree to T's rounding on the scale of the largest magnitude.
template <class T>
void check_same_tail(const moments& got, const moments& want, double t, double largest) {
  CHECK(got.count == want.count);
  CHECK(got.nonfinite == want.nonfinite);
  // Excesses round to T (16-bit types: from float arithmetic).
  const double slack = 4 * double(std::numeric_limits<T>::epsilon()) * (largest + std::fabs(t));
  const double n = double(want.count);
  if (want.count > 0) {
    CHECK(std::fabs(got.sum - want.sum) <= sum_tolerance<T> * want.sum + n * slack);
    CHECK(std::fabs(got.sum_sq - want.sum_sq) <= 4 * sum_tolerance<T> * want.sum_sq + 4 * n * slack * (largest + slack));
  }
}

template <class T>
std::vector<T> mixed_values(std::size_t n, std::uint64_t seed, bool with_nonfinite) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> magnitude(300.0);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> x(n);
  for (auto& v : x) {
    const double pick = u(rng);
    if (pick < 0.3)
      v = pick < 0.15 ? T(0) : T(-0.0);
    else if (with_nonfinite && pick > 0.995)
      v = pick > 0.998 ? std::numeric_limits<T>::quiet_NaN() : -std::numeric_limits<T>::infinity();
    else if (pick > 0.99)
      v = T(double(std::numeric_limits<T>::denorm_min()) * (1 + 100 * u(rng)));
    else
      v = T((u(rng) < 0.5 ? -1 : 1) * magnitude(rng));
  }
  return x;
}

/// Up to three uneven segments tiling [0, n): one, two or three pieces.
inline std::vector<segment> uneven_layout(std::size_t n) {
  if (n < 3) return {{0, n}};
  const std::size_t a = n / 5 + 1, b = n / 2;
  return {{0, a}, {a, b}, {a + b, n - a - b}};
}

template <class Backend>
struct oracle {
  using M = typename Backend::memory;
  using move = transfer<M>;

  template <class T, class Index>
  static void compare_selections(Backend& backend, const backend::plain_source<T, M>& source,
                                 const backend::plain_source<T>& host, std::span<const segment> layout,
                                 std::span<const double> t) {
    sparse_vector<T, Index> b(host.size);
    b.push_back(0, T(7));
    std::vector<std::size_t> kept_serial(layout.size()), kept(layout.size());
    backend::serial{}.select_above<true>(host, layout, t, b, 0, kept_serial);
    // Hints of the kept count: none (two passes), far too few (every region fills and the rest
    // is written after), exact, and far too many.
    const std::size_t count = b.size() - 1;
    for (std::size_t hint : {std::size_t(0), std::size_t(1), count, 10 * count + 100}) {
      INFO("hint ", hint, ", index bytes ", sizeof(Index), ", segments ", layout.size());
      std::vector<Index> first_index{0};
      std::vector<T> first_value{T(7)};
      sparse_vector<T, Index, M> a(source.size);
      a.resize(1);  // appends after what is there
      M::copy_from_host(std::span<const Index>(first_index), a.mutable_indices());
      M::copy_from_host(std::span<const T>(first_value), a.mutable_values());
      backend.template select_above<true>(source, layout, t, a, hint, kept);
      CHECK(move::same_entries(a, b));
      CHECK(kept == kept_serial);
    }
  }

  template <class T>
  static void compare_kernels(Backend& backend, std::span<const T> x, const std::string& what) {
    INFO(what, ", n = ", x.size());
    backend::serial serial;
    const auto buffer = move::template upload<T>(x);
    const backend::plain_source<T, M> source{buffer.data(), x.size()};
    const backend::plain_source<T> host{x.data(), x.size()};
    const segment whole{0, x.size()};
    const auto layout = uneven_layout(x.size());
    // Moments, whole and per segment, with and without a probe; counts only.
    moments got[2], want[2];
    backend.template analyze<backend::pass_statistics<true, false>>(source, {&whole, 1}, {}, std::span(got, 1));
    serial.analyze<backend::pass_statistics<true, false>>(host, {&whole, 1}, {}, std::span(want, 1));
    check_same_moments(got[0], want[0], sum_tolerance<T>, false);
    backend.template analyze<backend::pass_statistics<true, true>>(source, {&whole, 1}, {}, std::span(got, 1));
    serial.analyze<backend::pass_statistics<true, true>>(host, {&whole, 1}, {}, std::span(want, 1));
    check_same_moments(got[0], want[0], log_tolerance<T>);
    backend.template analyze<backend::pass_statistics<false>>(source, {&whole, 1}, {}, std::span(got, 1));
    CHECK(got[0].zeros == want[0].zeros);
    CHECK(got[0].nonfinite == want[0].nonfinite);
    CHECK(got[0].count == want[0].count);
    // The coarse histograms' pass counts, per segment, what the counts-only moments pass
    // counts. The coarse bin of each segment's k-th largest, whole and per segment, at k from
    // 0 to past the segment's size, from the histograms kept (and from a pass without counts,
    // halfway): the highest bin with k or more values in it or above (0 when none), against a
    // histogram counted here.
    for (const auto& parts : {std::vector<segment>{whole}, layout}) {
      std::vector<moments> counts(parts.size()), counts_serial(parts.size());
      backend.coarse_histograms(source, std::span<const segment>(parts), std::span<moments>(counts));
      serial.analyze<backend::pass_statistics<false>>(host, std::span<const segment>(parts), {},
                                                      std::span<moments>(counts_serial));
      for (std::size_t s = 0; s < parts.size(); ++s) {
        INFO("counts of segment ", s, " of ", parts.size());
        CHECK(counts[s].count == counts_serial[s].count);
        CHECK(counts[s].zeros == counts_serial[s].zeros);
        CHECK(counts[s].nonfinite == counts_serial[s].nonfinite);
        CHECK(counts[s].sum == 0);
        CHECK(counts[s].max == 0);
      }
      for (const double share : {0.0, 1e-9, 0.001, 0.3, 1.0, 2.0}) {
        constexpr int shift = coarse_shift<magnitude_key_t<T>>;
        std::vector<std::size_t> targets;
        for (const auto& part : parts) targets.push_back(std::size_t(std::ceil(share * double(part.size))));
        std::vector<key_bin> got(parts.size());
        if (share == 0.3) backend.coarse_histograms(source, std::span<const segment>(parts), std::span<moments>{});
        backend.kth_largest_bins(std::span<const std::size_t>(targets), std::span<key_bin>(got));
        for (std::size_t s = 0; s < parts.size(); ++s) {
          const std::size_t bin = got[s].bin, k = targets[s], segments = parts.size();
          INFO("segment ", s, " of ", segments, ", k ", k);
          std::vector<std::size_t> at_or_above(coarse_bins + 1, 0);
          for (std::size_t i = parts[s].offset; i < parts[s].end(); ++i) ++at_or_above[magnitude_key(x[i]) >> shift];
          for (std::size_t b = coarse_bins; b-- > 0;) at_or_above[b] += at_or_above[b + 1];
          REQUIRE(bin < coarse_bins);
          CHECK(got[s].at_or_above == at_or_above[bin]);
          CHECK((bin == 0 || at_or_above[bin] >= k));
          CHECK((bin == coarse_bins - 1 || at_or_above[bin + 1] < k));
        }
      }
    }
    const auto nonfinite = backend.first_nonfinite(source), nonfinite_serial = serial.first_nonfinite(host);
    CHECK(nonfinite.index == nonfinite_serial.index);
    if (nonfinite.index < x.size()) CHECK(std::isnan(nonfinite.value) == std::isnan(nonfinite_serial.value));
    // The sample's positions are drawn inside the backend: the same magnitudes as the
    // sequential generator's positions read on the host.
    for (const std::uint64_t state : {std::uint64_t(0xd6c), ~std::uint64_t(0)}) {
      if (x.empty()) break;
      std::vector<double> sampled(x.size() / 3 + 5), sampled_serial(sampled.size());
      backend.sample_magnitudes(source, state, sampled);
      serial.sample_magnitudes(host, state, sampled_serial);
      splitmix64 sequential{state};
      const auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
      std::size_t first_wrong = sampled.size();  // one check for the lot: a million CHECKs cost seconds
      for (std::size_t j = 0; j < sampled.size() && first_wrong == sampled.size(); ++j) {
        const double expected = std::fabs(double(x[sequential.below(x.size())]));
        if (!same(sampled_serial[j], expected) || !same(sampled[j], expected)) first_wrong = j;
      }
      INFO("sample ", first_wrong, " of generator state ", state, " (", sampled.size(), ": none wrong)");
      CHECK(first_wrong == sampled.size());
    }

    for (double t : {-1.0, 0.0, 1e-40, 0.001, 0.003, 0.01, 1e30, double(std::numeric_limits<float>::denorm_min())}) {
      INFO("threshold ", t);
      CHECK(backend.count_above(source, t) == serial.count_above(host, t));
      compare_selections<T, std::uint64_t>(backend, source, host, {&whole, 1}, {&t, 1});
      // Indices as wide as the values: the SIMD kernels' own path, when built with them.
      compare_selections<T, magnitude_key_t<T>>(backend, source, host, {&whole, 1}, {&t, 1});
      // Per segment: each its own threshold.
      const std::vector<double> per_segment = {t, t * 2 + 0.001, t / 2};
      compare_selections<T, std::uint32_t>(backend, source, host, layout,
                                           std::span<const double>(per_segment.data(), layout.size()));
      // Probes and tails: a negative threshold is taken as 0 by every backend.
      check_same_tail<T>(backend.template tail<false>(source, t), serial.tail<false>(host, t), t, want[0].max);
      // One probe for the whole vector, and one per segment.
      backend.template analyze<backend::pass_statistics<true, true>>(source, {&whole, 1}, {&t, 1}, std::span(got, 2));
      serial.analyze<backend::pass_statistics<true, true>>(host, {&whole, 1}, {&t, 1}, std::span(want, 2));
      check_same_moments(got[0], want[0], log_tolerance<T>);
      check_same_tail<T>(got[1], want[1], t, want[0].max);
      std::vector<moments> seg_got(2 * layout.size()), seg_want(2 * layout.size());
      const std::span<const double> probes(per_segment.data(), layout.size());
      backend.template analyze<backend::pass_statistics<true, false>>(source, layout, probes, seg_got);
      serial.analyze<backend::pass_statistics<true, false>>(host, layout, probes, seg_want);
      for (std::size_t s = 0; s < layout.size(); ++s) {
        INFO("segment ", s);
        check_same_moments(seg_got[2 * s], seg_want[2 * s], sum_tolerance<T>, false);
        check_same_tail<T>(seg_got[2 * s + 1], seg_want[2 * s + 1], probes[s], want[0].max);
      }
    }
  }

  template <class T>
  static void compare_feedback(Backend& backend, std::span<const T> g, std::span<const T> r0) {
    backend::serial serial;
    const auto gradient = move::template upload<T>(g);
    for (double t : {0.0, 0.002, 0.01}) {
      INFO("threshold ", t);
      auto rb = std::vector<T>(r0.begin(), r0.end());
      const backend::feedback_source<T> sb{g.data(), rb.data(), g.size()};
      const segment whole{0, g.size()};
      sparse_vector<T> b(g.size());
      std::size_t kept = 0;
      serial.select_above<true>(sb, {&whole, 1}, {&t, 1}, b, 0, {&kept, 1});
      for (std::size_t hint : {std::size_t(0), std::size_t(1), b.size()}) {
        INFO("hint ", hint);
        auto ra = move::template upload<T>(r0);
        const backend::feedback_source<T, M> sa{gradient.data(), ra.data(), g.size()};
        sparse_vector<T, std::uint32_t, M> a(g.size());
        backend.template select_above<true>(sa, {&whole, 1}, {&t, 1}, a, hint, {&kept, 1});
        CHECK(move::same_entries(a, b));
        CHECK(move::template download<T>({ra.data(), ra.size()}) == rb);
      }
      // The deferred path, exactly as exact_k uses it: settle as unsent, then a band, then
      // merge, keep the top k, mark sent.
      auto ra = move::template upload<T>(r0);
      rb.assign(r0.begin(), r0.end());
      const backend::feedback_source<T, M> sa{gradient.data(), ra.data(), g.size()};
      sparse_vector<T, std::uint32_t, M> a(g.size());
      b.clear(g.size());
      const double upper = t + 0.01;
      backend.template select_above<false>(sa, {&whole, 1}, {&upper, 1}, a, 0, {&kept, 1});
      serial.select_above<false>(sb, {&whole, 1}, {&upper, 1}, b, 0, {&kept, 1});
      const std::size_t run = b.size();
      backend.select_band(sa, t, upper, a);
      serial.select_band(sb, t, upper, b);
      CHECK(move::same_entries(a, b));
      const std::array<std::size_t, 1> runs{run};
      backend.merge_runs(a, 0, runs);
      serial.merge_runs(b, 0, runs);
      CHECK(move::same_entries(a, b));
      // One run, or four as segmented's layers give them: one empty, one kept whole.
      const std::size_t n = b.size();
      const std::vector<std::size_t> run_sizes =
          t == 0.0 ? std::vector<std::size_t>{n} : std::vector<std::size_t>{n / 4, 0, n / 4, n - 2 * (n / 4)};
      const std::vector<std::size_t> keep =
          t == 0.0 ? std::vector<std::size_t>{n / 3 + 1} : std::vector<std::size_t>{n / 12 + 1, 3, n, 1};
      backend.keep_top_k(a, 0, run_sizes, keep);
      serial.keep_top_k(b, 0, run_sizes, keep);
      CHECK(move::same_entries(a, b));
      backend.mark_sent(sa, a, 0);
      serial.mark_sent(sb, b, 0);
      CHECK(move::template download<T>({ra.data(), ra.size()}) == rb);
      // Scatter-add of what was kept, scaled.
      auto dense = move::template upload<T>(g);
      std::vector<T> dense_serial(g.begin(), g.end());
      backend.scatter_add(a, {dense.data(), dense.size()}, T(0.5));
      serial.scatter_add(b, std::span<T>(dense_serial), T(0.5));
      CHECK(move::template download<T>({dense.data(), dense.size()}) == dense_serial);
    }
    // Random-k's draw at every size: none, one, small and large by redraws (n / 40: the
    // device draws it where k reaches its tuning's device_draw_from), by selection sampling
    // (n / 10) and all: the subset uniform_subset draws, the state settled as the oracle's.
    const std::size_t n = g.size();
    for (const std::size_t k : {std::size_t(0), std::size_t(1), std::size_t(16), n / 40, n / 10, n})
      for (const std::uint64_t state : {std::uint64_t(0x51dc0), ~std::uint64_t(0)}) {
        INFO("random subset of ", k, " from state ", state);
        auto ra = move::template upload<T>(r0);
        auto rb = std::vector<T>(r0.begin(), r0.end());
        const backend::feedback_source<T, M> sa{gradient.data(), ra.data(), n};
        const backend::feedback_source<T> sb{g.data(), rb.data(), n};
        sparse_vector<T, std::uint32_t, M> a(n);
        sparse_vector<T> b(n);
        backend.select_random(sa, k, state, a);
        serial.select_random(sb, k, state, b);
        std::vector<std::size_t> drawn;
        uniform_subset(n, k, state, drawn);
        REQUIRE(b.size() == drawn.size());
        CHECK(std::equal(drawn.begin(), drawn.end(), b.indices().begin()));
        CHECK(move::same_entries(a, b));
        CHECK(move::template download<T>({ra.data(), ra.size()}) == rb);
      }
  }
};

}  // namespace sidco::test
