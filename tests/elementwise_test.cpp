// What backend::cuda computes per element, checked on the host (it runs on machines without
// a GPU): one thread's moments and tails against the serial oracle, the predicates, the
// radix digit and the Top-k rank, keep_top_k's runs, and how layouts split into the blocks'
// pieces.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "doctest.hpp"
#include <sidco/backend/cuda/elementwise.hpp>
#include <sidco/backend/cuda/pieces.hpp>
#include <sidco/backend/cuda/runs.hpp>
#include <sidco/backend/cuda/stripes.hpp>
#include <sidco/backend/cuda/tuning.cuh>
#include <sidco/backend/host/keep_top_k.hpp>
#include <sidco/backend/serial.hpp>
#include <sidco/core/radix_select.hpp>
#include <sidco/core/splitmix.hpp>

#include "backend_oracle.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace elementwise_test {

using namespace sidco;
using namespace sidco::backend::cuda_detail;

TEST_CASE_TEMPLATE("one thread's statistics equal the serial oracle's moments and tails", T, float, double) {
  const auto x = test::mixed_values<T>(3000, 31, true);
  const backend::plain_source<T> source{x.data(), x.size()};
  for (double t : {0.0, 0.001, 0.004, 1e30}) {
    INFO("probe ", t);
    const auto key = threshold_key<T>(t);
    const device_probe<T> probe{key, typename float_traits<T>::accumulator(magnitude_of_key<T>(magnitude_key_t<T>(key)))};
    thread_statistics<T, 1> mine;
    for (T v : x) mine.template add<true, true>(v, &probe);
    moments got[2];
    mine.to_moments(got);
    moments want[2];
    const segment whole{0, x.size()};
    backend::serial{}.analyze<backend::pass_statistics<true, true, true>>(source, {&whole, 1}, {&t, 1}, want);
    // Sums are in double, but each element's logarithm (fast_log) and tail excess are in
    // T's accumulator type (float for float), so the tolerance is float's.
    const double tolerance = std::is_same_v<T, float> ? 2e-5 : 1e-13;
    test::check_same_moments(got[0], want[0], tolerance);
    test::check_same_tail<T>(got[1], want[1], t, want[0].max);
    // Merging two halves' bundles gives the whole.
    thread_statistics<T, 1> first, second;
    for (std::size_t i = 0; i < x.size(); ++i)
      (i < 1000 ? first : second).template add<true, true>(x[i], &probe);
    moments_bundle<2> a, b;
    first.to_moments(a.m);
    second.to_moments(b.m);
    const auto both = merge_bundles{}(a, b);
    CHECK(both.m[0].count == want[0].count);
    CHECK(both.m[0].zeros == want[0].zeros);
    CHECK(both.m[0].nonfinite == want[0].nonfinite);
    CHECK(both.m[1].count == want[1].count);
    CHECK(both.m[0].max == want[0].max);
    CHECK(both.m[0].min == want[0].min);
  }
}

TEST_CASE("one thread's sums match the oracle's at every finite scale of a float gradient") {
  // Squares of floats leave float's range below ~1e-22 and above ~1.8e19: summed in float,
  // Gaussian-k's RMS became 0 or inf on such gradients. The sums are in double.
  const auto base = test::mixed_values<float>(3000, 34, false);
  for (double scale : {1e-30, 1e-24, 1.0, 1e19, 1e30}) {
    INFO("scale ", scale);
    std::vector<float> x(base.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(double(base[i]) * scale);
    const backend::plain_source<float> source{x.data(), x.size()};
    thread_statistics<float, 0> mine;
    for (float v : x) mine.template add<false, false>(v, nullptr);
    moments got[1];
    mine.to_moments(got);
    moments want;
    const segment whole{0, x.size()};
    backend::serial{}.analyze<backend::pass_statistics<true, false, false>>(source, {&whole, 1}, {}, {&want, 1});
    REQUIRE(want.sum_sq > 0);
    REQUIRE(std::isfinite(want.sum_sq));
    CHECK(got[0].sum_sq == doctest::Approx(want.sum_sq).epsilon(1e-12));
    CHECK(got[0].sum == doctest::Approx(want.sum).epsilon(1e-12));
  }
}

TEST_CASE_TEMPLATE("the selection and band predicates decide as the oracle's double compares", T, float, double) {
  const auto x = test::mixed_values<T>(5000, 32, true);
  for (double t : {-1.0, 0.0, 1e-40, 0.002, 0.01, std::numeric_limits<double>::quiet_NaN()}) {
    const above_key<T> above{threshold_key<T>(t)};
    const in_band<T> band{threshold_key<T>(t), threshold_key<T>(t + 0.003)};
    for (T v : x) {
      const double a = std::fabs(double(v));
      REQUIRE(above(v) == (a > t));
      REQUIRE(band(v) == (a > t && a <= t + 0.003));
    }
  }
}

TEST_CASE("the radix select's digit walk finds the k-th largest key as a sort does") {
  // Distinct-ish values and heavy ties (every value one of 5), each at several k.
  auto mixed = test::mixed_values<float>(4000, 33, false);
  std::vector<float> tied(3000);
  for (std::size_t i = 0; i < tied.size(); ++i) tied[i] = float(int(i * 7919 % 5) - 2) * 0.25f;
  for (const auto* x : {&mixed, &tied})
    for (const std::size_t k : {std::size_t(1), std::size_t(137), std::size_t(1500), x->size()}) {
      CAPTURE(k);
      std::vector<std::uint32_t> sorted;
      for (float v : *x) sorted.push_back(magnitude_key(v));
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      // The device's rounds: histogram the digit of the entries still in the running.
      radix_select<std::uint32_t> walk(k);
      for (int round = 0; round < radix_select<std::uint32_t>::rounds; ++round) {
        std::size_t bins[256] = {};
        for (float v : *x)
          if (const int d = walk.digit(magnitude_key(v), round); d >= 0) ++bins[d];
        walk.choose(bins, round);
      }
      CHECK(walk.prefix == sorted[k - 1]);
      std::size_t above = 0, ties = 0;
      for (float v : *x) {
        above += walk.rank(magnitude_key(v)) > 0;
        ties += walk.rank(magnitude_key(v)) == 0;
      }
      CHECK(above + walk.needed == k);
      CHECK(ties >= walk.needed);
      CHECK(walk.needed >= 1);
    }
}

TEST_CASE("a digit chosen from the bins' running counts, as a block's threads do, equals the walk's choice") {
  // Histograms of 256 bins: sparse with zeros, one heavy bin, all zeros, all ones; needed at
  // 0, 1, each bin's running count and one past it, the total and beyond.
  std::vector<std::vector<std::uint64_t>> histograms(4, std::vector<std::uint64_t>(256, 0));
  splitmix64 draw{99};
  for (auto& c : histograms[0]) c = draw() % 4 == 0 ? draw() % 50 : 0;
  histograms[1][40] = 1000;
  histograms[1][200] = 3;
  for (auto& c : histograms[3]) c = 1;
  for (const auto& counts : histograms) {
    std::vector<std::uint64_t> at_or_above(256);  // position p: bin 255 - p
    std::uint64_t running = 0;
    std::vector<std::size_t> targets = {0, 1};
    for (std::size_t p = 0; p < 256; ++p) {
      running += counts[255 - p];
      at_or_above[p] = running;
      targets.push_back(std::size_t(running));
      targets.push_back(std::size_t(running) + 1);
    }
    targets.push_back(std::size_t(running) + 1000);
    for (const std::size_t needed : targets) {
      CAPTURE(needed);
      std::size_t want_needed = needed;
      const std::size_t want = highest_bin_reaching(counts.data(), 256, want_needed);
      std::size_t answers = 0, got = 0, got_needed = 0;
      for (std::size_t p = 0; p < 256; ++p) {
        std::size_t now = 0;
        if (bin_reaching_at(p, 256, at_or_above[p], p ? at_or_above[p - 1] : std::uint64_t(0), needed, now)) {
          ++answers;
          got = 255 - p;
          got_needed = now;
        }
      }
      CHECK(answers == 1);
      CHECK(got == want);
      CHECK(got_needed == want_needed);
      // take() fixes the digit as choose() does.
      radix_select<std::uint32_t> chosen(needed), taken(needed);
      chosen.choose(counts.data(), 1);
      taken.take(got, got_needed, 1);
      CHECK(chosen.prefix == taken.prefix);
      CHECK(chosen.mask == taken.mask);
      CHECK(chosen.needed == taken.needed);
    }
  }
}

TEST_CASE("the coarse bin of the k-th largest, split over a block's shares as the device does, equals the walk") {
  // Histograms of 4,096 bins: sparse, dense, one bin only, and empty; targets from 0 to past
  // the total, and at every share boundary's running count.
  std::vector<std::vector<std::uint64_t>> histograms(4, std::vector<std::uint64_t>(coarse_bins, 0));
  for (std::size_t b = 0; b < coarse_bins; b += 97) histograms[0][b] = b % 5;
  for (std::size_t b = 0; b < coarse_bins; ++b) histograms[1][b] = (b * 7919) % 13;
  histograms[2][0] = 40;
  for (const std::size_t threads : {std::size_t(256), std::size_t(128), std::size_t(1000)}) {
    const std::size_t share = (coarse_bins + threads - 1) / threads;
    for (const auto& counts : histograms) {
      std::uint64_t total = 0;
      std::vector<std::size_t> targets = {0, 1, 2, 39, 40, 41};
      for (std::size_t t = 0; t < threads; ++t) {
        // The running count at each share's lowest bin, and one past it.
        const std::size_t high = t * share < coarse_bins ? coarse_bins - t * share : 0;
        for (std::size_t b = high > share ? high - share : 0; b < high; ++b) total += counts[b];
        targets.push_back(std::size_t(total));
        targets.push_back(std::size_t(total) + 1);
      }
      for (const std::size_t k : targets) {
        CAPTURE(threads);
        CAPTURE(k);
        const key_bin want = kth_largest_bin(counts.data(), coarse_bins, k);
        std::size_t above = 0, answers = 0;
        key_bin got;
        for (std::size_t t = 0; t < threads; ++t) {
          const std::size_t taken = t * share;
          const std::size_t high = taken < coarse_bins ? coarse_bins - taken : 0;
          const std::size_t low = high > share ? high - share : 0;
          key_bin mine;
          if (kth_largest_bin_in_share(counts.data(), low, high, above, k, t == 0, low == 0 && high > 0, mine)) {
            ++answers;
            got = mine;
          }
          for (std::size_t b = low; b < high; ++b) above += counts[b];
        }
        CHECK(answers == 1);
        CHECK(got.bin == want.bin);
        CHECK(got.at_or_above == want.at_or_above);
      }
    }
  }
}

TEST_CASE("keep_top_k's runs, tallies and output positions, as the device uses them, equal the oracle") {
  // Runs with an empty one, one of one entry, heavy ties and runs kept whole.
  auto x = test::mixed_values<float>(2000, 35, false);
  for (std::size_t i = 900; i < 1400; ++i) x[i] = float(int(i * 7919 % 5) - 2) * 0.25f;
  const std::vector<std::size_t> run_sizes{300, 0, 1, 599, 500, 600};
  const std::vector<std::size_t> keep{17, 4, 1, 600, 123, 1};
  std::vector<run_plan> plans(run_sizes.size());
  const run_totals totals = plan_runs(run_sizes, keep, plans.data());
  CHECK(totals.entries == x.size());
  CHECK(totals.kept == 17 + 0 + 1 + 599 + 123 + 1);
  CHECK(totals.trims);
  // Every entry finds its run by binary search, empty runs skipped.
  for (std::size_t j = 0; j < x.size(); ++j) {
    const std::size_t s = run_of(plans.data(), plans.size(), j);
    REQUIRE(plans[s].begin <= j);
    REQUIRE(j < plans[s].end);
  }
  // The device's passes, one entry at a time: every run's walk from its own histograms,
  // the tallies' exclusive scan, each kept entry written at kept_at.
  using walk_type = radix_select<std::uint32_t>;
  std::vector<walk_type> walks;
  for (const auto& plan : plans) walks.emplace_back(plan.keep);
  for (int round = 0; round < walk_type::rounds; ++round) {
    std::vector<std::size_t> bins(plans.size() * walk_type::bins);
    for (std::size_t j = 0; j < x.size(); ++j) {
      const std::size_t s = run_of(plans.data(), plans.size(), j);
      if (const int d = walks[s].digit(magnitude_key(x[j]), round); plans[s].trims() && d >= 0)
        ++bins[s * walk_type::bins + std::size_t(d)];
    }
    for (std::size_t s = 0; s < plans.size(); ++s)
      if (plans[s].trims()) walks[s].choose(bins.data() + s * walk_type::bins, round);
  }
  std::vector<top_k_tally> before(x.size());
  top_k_tally sum;
  for (std::size_t j = 0; j < x.size(); ++j) {
    before[j] = sum;
    const std::size_t s = run_of(plans.data(), plans.size(), j);
    sum = add_tallies{}(sum, tally(plans[s], walks[s], magnitude_key(x[j])));
  }
  std::vector<std::pair<std::size_t, float>> got(totals.kept, {not_kept, 0.f});
  for (std::size_t j = 0; j < x.size(); ++j) {
    const std::size_t s = run_of(plans.data(), plans.size(), j);
    const std::size_t at = kept_at(plans[s], walks[s], magnitude_key(x[j]), j, before[j], before[plans[s].begin]);
    if (at == not_kept) continue;
    REQUIRE(at < got.size());
    REQUIRE(got[at].first == not_kept);  // each slot written once
    got[at] = {j, x[j]};
  }
  sparse_vector<float> oracle(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) oracle.push_back(std::uint32_t(j), x[j]);
  backend::host::keep_top_k(oracle, 0, run_sizes, keep);
  CHECK(got == test::entries(oracle));
}

TEST_CASE("layouts split into pieces of at most a tile inside one segment, in order") {
  piece_plan plan;
  const std::vector<segment> layout = {{0, 10}, {10, 1000}, {1010, 1}, {1011, 300}};
  CHECK(plan.plan(layout, 256));
  CHECK_FALSE(plan.plan(layout, 256));  // the same layout: nothing to refresh
  std::size_t next = 0;
  for (const piece& p : plan.pieces()) {
    CHECK(p.offset == next);
    CHECK(p.size >= 1);
    CHECK(p.size <= 256);
    CHECK(p.offset >= layout[p.segment].offset);
    CHECK(p.offset + p.size <= layout[p.segment].end());
    next += p.size;
  }
  CHECK(next == 1311);
  const auto& first = plan.segment_first();
  REQUIRE(first.size() == 5);
  CHECK(first[0] == 0);
  CHECK(first[1] == 1);
  CHECK(first[2] == 5);  // 1000 values: 4 pieces
  CHECK(first[3] == 6);
  CHECK(first[4] == plan.pieces().size());
  CHECK(plan.plan(std::vector<segment>{{0, 1311}}, 256));
  CHECK(plan.pieces().size() == 6);
  // An upload that failed (the CUDA backend forgets the plan): the same layout is planned
  // and uploaded again rather than taken as already on the device.
  plan.forget();
  CHECK(plan.plan(std::vector<segment>{{0, 1311}}, 256));
  CHECK(plan.pieces().size() == 6);
}

namespace {

// The indices for_each_striped<Items> reads and uses, against the plain loop's.
template <int Items>
void check_striped(std::size_t begin, std::size_t end, std::size_t stride) {
  std::vector<std::size_t> plain, read, used;
  for (std::size_t i = begin; i < end; i += stride) plain.push_back(i);
  sidco::backend::cuda_detail::for_each_striped<Items>(
      begin, end, stride, [&](std::size_t i) { return read.push_back(i), i; }, [&](std::size_t i) { used.push_back(i); });
  INFO(Items, " items from ", begin, " below ", end, " by ", stride);
  CHECK(used == plain);
  std::sort(read.begin(), read.end());
  CHECK(read == plain);  // each index read once, none past the end
}

}  // namespace

TEST_CASE("striped reads visit the plain loop's indices once each, used in its order") {
  for (const std::size_t stride : {std::size_t(1), std::size_t(3), std::size_t(256)})
    for (std::size_t begin = 0; begin < 2 * stride + 2; begin += (stride > 8 ? stride / 2 : 1))
      for (std::size_t length = 0; length < 9 * stride + 3; length += (stride > 8 ? 37 : 1)) {
        check_striped<1>(begin, begin + length, stride);
        check_striped<3>(begin, begin + length, stride);
        check_striped<4>(begin, begin + length, stride);
        check_striped<16>(begin, begin + length, stride);  // default_tuning::load_items
      }
}

TEST_CASE("a layout's tile is the smallest doubling of min_tile whose pieces fit blocks_per_sm a multiprocessor") {
  using tuning = sidco::backend::cuda_detail::default_tuning;
  using sidco::backend::cuda_detail::tile_for;
  constexpr std::size_t smallest = tuning::min_tile;
  for (const std::size_t sms : {std::size_t(1), std::size_t(108), std::size_t(132)}) {
    const std::size_t target = sms * tuning::blocks_per_sm;
    for (const std::size_t total : {std::size_t(0), std::size_t(1), smallest, smallest * target, smallest * target + 1,
                                    std::size_t(1) << 20, std::size_t(1) << 26, (std::size_t(1) << 31) + 17}) {
      INFO(sms, " multiprocessors, ", total, " values");
      const std::size_t tile = tile_for<tuning>(total, sms);
      CHECK(tile % smallest == 0);
      CHECK(std::has_single_bit(tile / smallest));
      CHECK((total + tile - 1) / tile <= target);                                // one wave covers the layout
      if (tile > smallest) CHECK((total + tile / 2 - 1) / (tile / 2) > target);  // and it is the smallest that does
    }
  }
  CHECK(tile_for<tuning>(std::size_t(1) << 20, 132) == 2048);  // 1,056 blocks at most: 512 pieces of 2,048
  CHECK(tile_for<tuning>(std::size_t(1) << 26, 132) == std::size_t(1) << 16);  // 1,024 pieces of 65,536
  // Piece sizes are 32-bit: the tile stops at 2^30 whatever N asks for.
  CHECK(tile_for<tuning>(std::numeric_limits<std::size_t>::max(), 1) == std::size_t(1) << 30);
}

TEST_CASE("a sample position drawn by its index equals the sequential generator's draw, and skip advances alike") {
  for (const std::uint64_t state : {std::uint64_t(0), std::uint64_t(0xd6c), ~std::uint64_t(0) - 3}) {
    for (const std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(16384), (std::size_t(1) << 31) + 17,
                                std::numeric_limits<std::size_t>::max()}) {
      INFO("state ", state, ", n ", n);
      splitmix64 sequential{state};
      std::size_t highest = 0;
      for (std::size_t j = 0; j < 1000; ++j) {
        const std::size_t drawn = sequential.below(n);
        CHECK(sample_position(state, j, n) == drawn);
        CHECK(drawn < n);
        highest = std::max(highest, drawn);
      }
      if (n > 1000) CHECK(highest > n / 2);  // the high word spreads over [0, n)
      splitmix64 skipped{state};
      skipped.skip(1000);
      CHECK(skipped.state == sequential.state);
    }
  }
}

}  // namespace elementwise_test
