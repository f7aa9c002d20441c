// Run under mpirun with 2 and 3 ranks: the one-round exchange (comm/exchange.hpp) gives
// every rank the rank-order average of what each sent, bit for bit, with the next tensor
// compressed while it is in flight; trimming to capacity loses nothing; a rank that fails
// or disagrees makes every rank throw the same error naming it, and nothing sent is lost;
// blocking collectives (overlap = false) apply the same bits.
#include "../doctest.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sidco/comm/exchange.hpp>
#include <sidco/sidco.hpp>

#include "ranks.hpp"
#include "wait_error.hpp"

using namespace sidco;

namespace {

// Layers of different scales, each rank its own values; 30% exact zeros.
std::vector<float> gradient_for(int rank, std::uint64_t step, const std::vector<segment>& layout) {
  std::vector<float> g(layout.back().end());
  std::mt19937_64 rng(1000 * step + std::uint64_t(rank));
  std::uniform_real_distribution<double> u(0, 1);
  for (std::size_t s = 0; s < layout.size(); ++s) {
    std::exponential_distribution<double> magnitude(std::pow(10.0, double(s)));
    for (std::size_t i = layout[s].offset; i < layout[s].end(); ++i)
      g[i] = u(rng) < 0.3 ? 0.0f : float((u(rng) < 0.5 ? -1 : 1) * magnitude(rng));
  }
  return g;
}

// The reference: every rank's sent entries, gathered densely, added in rank order from 0
// and divided by the rank count.
std::vector<float> rank_order_average(const sparse_vector<float>& sent, std::size_t n) {
  std::vector<float> local(n, std::numeric_limits<float>::quiet_NaN());  // NaN: not sent
  for (std::size_t j = 0; j < sent.size(); ++j) local[sent.indices()[j]] = sent.values()[j];
  std::vector<float> all(n * std::size_t(size_of()));
  MPI_Allgather(local.data(), int(n), MPI_FLOAT, all.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<float> out(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    bool any = false;
    for (int r = 0; r < size_of(); ++r) {
      const float v = all[std::size_t(r) * n + i];
      if (std::isnan(v)) continue;
      sum = sum + v;
      any = true;
    }
    if (any) out[i] = sum / float(size_of());
  }
  return out;
}

const std::vector<segment> layout{{0, 3000}, {3000, 20000}, {23000, 7}, {23007, 9000}};

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two exchanges alike but for exact_sizes (tags options.tag and exact_tag), each with its own
// SIDCo-E compressor and residual, fed the same gradients.
struct fixed_and_exact {
  fixed_and_exact(comm::exchange_options options, int exact_tag, double delta)
      : delta(delta),
        fixed(MPI_COMM_WORLD, layout, delta, options),
        exact(MPI_COMM_WORLD, layout, delta, [&] {
          auto o = options;
          o.tag = exact_tag;
          o.exact_sizes = true;
          return o;
        }()) {}

  // One step of both sides, as the checks below read it.
  struct step_result {
    std::vector<float> gradient, fixed_residual_before;
    sparse_vector<float> fixed_sent, exact_sent;
    std::vector<float> fixed_dense, exact_dense;
    comm::exchange_report fixed_report, exact_report;
  };

  // Steps 0 .. count - 1 from the gradients of seed; check(step_result) after each.
  template <class Check>
  void run(int seed, std::uint64_t count, Check&& check) {
    for (std::uint64_t step = 0; step < count; ++step) {
      step_result r;
      r.gradient = gradient_for(seed, step, layout);
      r.fixed_residual_before.assign(fixed_residual.values().begin(), fixed_residual.values().end());
      fixed_compressor.compress<float>(r.gradient, delta, r.fixed_sent, fixed_residual);
      exact_compressor.compress<float>(r.gradient, delta, r.exact_sent, exact_residual);
      fixed.start(r.fixed_sent, fixed_residual.values(), step);
      exact.start(r.exact_sent, exact_residual.values(), step);
      r.fixed_dense.resize(n);
      r.exact_dense.resize(n);
      r.fixed_report = fixed.wait(r.fixed_dense);
      r.exact_report = exact.wait(r.exact_dense);
      CHECK(bits_equal(r.fixed_dense, r.exact_dense));  // exact sizes change the bytes, not the bits
      CHECK(r.fixed_report.bytes == fixed.format().bytes());
      CHECK(r.exact_report.bytes < fixed.format().bytes());
      check(r);
    }
  }

  double delta;
  std::size_t n = layout.back().end();
  comm::sparse_exchange<float> fixed, exact;
  segmented<presets::sidco_e<>> fixed_compressor{layout}, exact_compressor{layout};
  feedback::residual<float> fixed_residual{n}, exact_residual{n};
};

}  // namespace

TEST_CASE("two tensors in flight at once: each the rank-order average, bit for bit; trimming loses nothing") {
  const double delta = 0.01;
  const std::size_t n = layout.back().end();
  // Slack 1 trims most calls: the per-layer estimate lands a little above or below k.
  comm::sparse_exchange<float> first(MPI_COMM_WORLD, layout, delta, {1.0, comm::reduction::average, 0});
  comm::sparse_exchange<float> second(MPI_COMM_WORLD, n, delta, {1.25, comm::reduction::average, 1});
  segmented<presets::sidco_e<>> per_layer(layout);
  presets::top_k<> whole;
  feedback::residual<float> r1(n), r2(n);
  std::size_t trimmed = 0;
  for (std::uint64_t step = 0; step < 6; ++step) {
    const auto g1 = gradient_for(rank_in(), step, layout), g2 = gradient_for(rank_in() + 7, step, layout);
    const std::vector<float> before1(r1.values().begin(), r1.values().end());
    sparse_vector<float> s1, s2;
    per_layer.compress<float>(g1, delta, s1, r1);
    first.start(s1, r1.values(), step);
    // The second tensor is compressed while the first is in flight.
    whole.compress<float>(g2, delta, s2, r2);
    second.start(s2, r2.values(), step);
    std::vector<float> d1(n), d2(n);
    const auto report = first.wait(d1);
    second.wait(d2);
    trimmed += report.trimmed;
    for (std::size_t s = 0; s < layout.size(); ++s) {
      std::size_t inside = 0;
      for (auto i : s1.indices()) inside += i >= layout[s].offset && i < layout[s].end();
      CHECK(inside <= first.capacities().per_segment[s]);
    }
    // sent + residual = gradient + old residual, per element, trimmed entries included.
    std::vector<float> sent(n, 0.0f);
    for (std::size_t j = 0; j < s1.size(); ++j) sent[s1.indices()[j]] = s1.values()[j];
    for (std::size_t i = 0; i < n; ++i) REQUIRE(sent[i] + r1.values()[i] == g1[i] + before1[i]);
    CHECK(bits_equal(d1, rank_order_average(s1, n)));
    CHECK(bits_equal(d2, rank_order_average(s2, n)));
  }
  CHECK(trimmed > 0);  // or the trimming above was never tested
}

TEST_CASE("the compact coding: half the bytes; each rank keeps what rounding took; the rank-order average of what was sent") {
  const double delta = 0.01;
  const std::size_t n = layout.back().end();
  comm::exchange_options options;
  options.tag = 2;
  options.coding = comm::entry_coding::compact;
  comm::sparse_exchange<float> compact(MPI_COMM_WORLD, layout, delta, options);
  comm::sparse_exchange<float> plain(MPI_COMM_WORLD, layout, delta, {1.25, comm::reduction::average, 3});
  CHECK(compact.format().bytes() - 64 <= (plain.format().bytes() - 64) / 2 + 8);
  segmented<presets::sidco_e<>> per_layer(layout);
  feedback::residual<float> residual(n);
  for (std::uint64_t step = 0; step < 4; ++step) {
    const auto g = gradient_for(rank_in() + 11, step, layout);
    const std::vector<float> before(residual.values().begin(), residual.values().end());
    sparse_vector<float> sent;
    per_layer.compress<float>(g, delta, sent, residual);
    compact.start(sent, residual.values(), step);
    std::vector<float> dense(n);
    const auto report = compact.wait(dense);
    CHECK(report.bytes == compact.format().bytes());
    // sent now holds the values sent (bfloat16's); residual the rest, exactly.
    std::vector<float> applied(n, 0.0f);
    for (std::size_t j = 0; j < sent.size(); ++j) {
      applied[sent.indices()[j]] = sent.values()[j];
      REQUIRE(float(bfloat16(sent.values()[j])) == sent.values()[j]);
    }
    for (std::size_t i = 0; i < n; ++i) REQUIRE(applied[i] + residual.values()[i] == g[i] + before[i]);
    CHECK(bits_equal(dense, rank_order_average(sent, n)));
  }
  // Ranks that code differently are refused by every rank's constructor.
  comm::exchange_options mixed = options;
  mixed.tag = 4;
  mixed.coding = rank_in() == 1 ? comm::entry_coding::plain : comm::entry_coding::compact;
  CHECK_THROWS_WITH_AS(comm::sparse_exchange<float>(MPI_COMM_WORLD, layout, delta, mixed),
                       "sidco: exchange setup (tag 4): rank 1 codes entries plain, rank 0 compact", sidco::runtime_error);
}

TEST_CASE("the compact8 coding: 8-bit values on each payload's scale; each rank keeps what rounding took; the same "
          "bits at exact sizes") {
  const double delta = 0.01;
  const std::size_t n = layout.back().end();
  comm::exchange_options options;
  options.tag = 12;
  options.coding = comm::entry_coding::compact8;
  fixed_and_exact both(options, 13, delta);
  comm::exchange_options half = options;
  half.coding = comm::entry_coding::compact;
  comm::sparse_exchange<float> compact(MPI_COMM_WORLD, layout, delta, half);
  CHECK(both.fixed.format().bytes() < compact.format().bytes());
  both.run(rank_in() + 40, 3, [&](const fixed_and_exact::step_result& r) {
    // The values sent, each a code of its payload's scale; the residual holds the rest, exactly.
    const auto scale = comm::byte_scale<float>::of(r.fixed_sent.values());
    std::vector<float> applied(n, 0.0f);
    for (std::size_t j = 0; j < r.fixed_sent.size(); ++j) {
      applied[r.fixed_sent.indices()[j]] = r.fixed_sent.values()[j];
      std::uint8_t code;
      float rounded;
      REQUIRE((scale.encode(r.fixed_sent.values()[j], code, rounded) && rounded == r.fixed_sent.values()[j]));
    }
    const auto residual = both.fixed_residual.values();
    for (std::size_t i = 0; i < n; ++i) REQUIRE(applied[i] + residual[i] == r.gradient[i] + r.fixed_residual_before[i]);
    CHECK(bits_equal(r.fixed_dense, rank_order_average(r.fixed_sent, n)));
    // Exact sizes: 64 + 8 (the scale) + a byte a value (to 8) + the index code.
    CHECK(r.exact_report.bytes >= 72 + 2 * r.exact_sent.size());
  });
  // A rank in the other compact coding is refused by every rank's constructor.
  comm::exchange_options mixed = options;
  mixed.tag = 14;
  mixed.coding = rank_in() == 1 ? comm::entry_coding::compact : comm::entry_coding::compact8;
  CHECK_THROWS_WITH_AS(comm::sparse_exchange<float>(MPI_COMM_WORLD, layout, delta, mixed),
                       "sidco: exchange setup (tag 14): rank 1 codes entries compact, rank 0 compact8",
                       sidco::runtime_error);
}

TEST_CASE("a rank whose compress fails: every rank throws naming it, and nothing sent is lost") {
  const std::size_t n = layout.back().end();
  comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, layout, 0.01);
  segmented<presets::sidco_e<>> per_layer(layout);
  feedback::residual<float> residual(n);
  auto g = gradient_for(rank_in(), 0, layout);
  if (rank_in() == 1) g[5] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before(residual.values().begin(), residual.values().end());
  sparse_vector<float> sent;
  try {
    per_layer.compress<float>(g, 0.01, sent, residual);
    exchange.start(sent, residual.values(), 7);
  } catch (const std::exception& e) {
    exchange.start_failed(e, 7);
  }
  std::vector<float> dense(n, 1.0f);
  std::string message = wait_error(exchange, dense);
  CHECK(message.find("exchange (tag 0, step 7): rank 1 failed: gradient + residual contains 1 non-finite value(s)") !=
        std::string::npos);
  CHECK(dense == std::vector<float>(n, 1.0f));  // nothing written
  // What this rank sent is back in its residual: the step's gradient waits for the next one.
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(residual.values()[i] == (rank_in() == 1 ? before[i] : g[i] + before[i]));
}

TEST_CASE("a rank that hands start() a residual or a sparse vector of another size: every rank throws naming it; the "
          "others keep what they sent") {
  const std::size_t n = 1000;
  comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01);
  std::vector<float> g(n), residual(n, 0.0f), short_residual(n - 1, 0.0f);
  for (std::size_t i = 0; i < n; ++i) g[i] = float(int(i * 37 % 1000) - 500) + 0.25f * float(rank_in());
  sparse_vector<float> sent;
  presets::top_k<>{}.compress(g, 0.01, sent);
  const std::vector<std::uint32_t> indices(sent.indices().begin(), sent.indices().end());
  const std::vector<float> values(sent.values().begin(), sent.values().end());
  exchange.start(sent, rank_in() == 1 ? std::span<float>(short_residual) : std::span<float>(residual), 2);
  std::vector<float> dense(n, 1.0f);
  std::string message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("exchange (tag 0, step 2): rank 1 failed: sparse_exchange: residual: size 999 is not the "
                             "exchange's 1000") != std::string::npos,
                message);
  CHECK(dense == std::vector<float>(n, 1.0f));  // nothing written
  // The other ranks' sent entries wait in their residuals for the next step; rank 1's
  // residual was not the exchange's, so it is left as it was.
  std::vector<float> expected(n, 0.0f);
  if (rank_in() != 1)
    for (std::size_t e = 0; e < indices.size(); ++e) expected[indices[e]] = values[e];
  CHECK(residual == expected);
  CHECK(short_residual == std::vector<float>(n - 1, 0.0f));
  // The next step: rank 1's sparse vector is of n + 1 values; refused alike, by name.
  std::vector<float> longer(n + 1, 1.0f);
  presets::top_k<>{}.compress(rank_in() == 1 ? std::span<const float>(longer) : std::span<const float>(g), 0.01, sent);
  exchange.start(sent, {}, 3);
  message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("exchange (tag 0, step 3): rank 1 failed: exchange: the sparse vector's dense size 1001 "
                             "is not the exchange's 1000") != std::string::npos,
                message);
  CHECK(dense == std::vector<float>(n, 1.0f));
}

TEST_CASE("a dense of the wrong size given to one rank's wait(): that rank alone throws sidco::error, keeps its dense "
          "and gives nothing back; the others apply the step; none waits; the next step works (fixed and exact sizes)") {
  const std::size_t n = 1000;
  for (const bool exact : {false, true}) {
    CAPTURE(exact);
    comm::exchange_options options;
    options.exact_sizes = exact;  // the payloads' gather is then in wait(): rank 1 must still join it
    comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options);
    std::vector<float> g(n), residual(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) g[i] = float(int(i * 37 % 1000) - 500) + 0.25f * float(rank_in());
    sparse_vector<float> sent;
    presets::top_k<>{}.compress(g, 0.01, sent);
    const std::vector<float> expected = rank_order_average(sent, n);
    exchange.start(sent, residual, 4);
    std::vector<float> dense(rank_in() == 1 ? n - 1 : n, 1.0f);
    if (rank_in() == 1) {
      try {
        exchange.wait(dense);
        FAIL("rank 1's wait() returned");
      } catch (const sidco::runtime_error& e) {
        FAIL("a sidco::runtime_error (every rank's kind): " << e.what());
      } catch (const sidco::error& e) {
        CHECK_MESSAGE(std::string(e.what()).find("dense: size 999 does not match the exchange's dense size 1000") !=
                          std::string::npos,
                      e.what());
      }
      CHECK(dense == std::vector<float>(n - 1, 1.0f));  // nothing written
      CHECK(residual == std::vector<float>(n, 0.0f));   // nothing given back: the others applied it
    } else {
      exchange.wait(dense);
      CHECK(bits_equal(dense, expected));
    }
    // The exchange is usable again on every rank, rank 1's included.
    residual.assign(n, 0.0f);
    presets::top_k<>{}.compress(g, 0.01, sent);
    exchange.start(sent, residual, 5);
    dense.assign(n, 1.0f);
    exchange.wait(dense);
    CHECK(bits_equal(dense, expected));
  }
}

TEST_CASE("a rank that trims more than exchange_options::trim_limit fails the step on every rank; every entry back") {
  const std::size_t n = 20000;
  for (const auto coding : {comm::entry_coding::plain, comm::entry_coding::compact}) {
    comm::exchange_options options;
    options.trim_limit = 0.1;
    options.coding = coding;
    comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options);
    presets::sidco_e<> compressor;
    feedback::residual<float> residual(n);
    const auto g = gradient_for(rank_in(), 0, {{0, n}});
    sparse_vector<float> sent;
    compressor.compress(g, rank_in() == 1 ? 0.05 : 0.01, sent, residual);  // rank 1 at 5x the agreed density
    exchange.start(sent, residual.values(), 0);
    std::vector<float> dense(n, 5.0f);
    std::string message = wait_error(exchange, dense);
    CHECK_MESSAGE(message.find("rank 1 failed: exchange: ") != std::string::npos, message);
    CHECK_MESSAGE(message.find("exceed the capacity, over exchange_options::trim_limit 0.1: compress at the "
                               "exchange's density 0.01, or raise exchange_options::slack") != std::string::npos,
                  message);
    CHECK(dense == std::vector<float>(n, 5.0f));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == g[i]);  // every entry back, every rank
  }
}

TEST_CASE("ranks whose payloads would differ are refused by every rank's constructor, naming the first") {
  const std::size_t n = 100000;
  const auto refused = [](auto make) {
    try {
      make();
    } catch (const runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // The last rank asks for twice the density: its payloads would be twice as long (this
  // overran the others' receive buffers before the setup was agreed).
  const double delta = rank_in() == size_of() - 1 ? 0.02 : 0.01;
  std::string message = refused([&] { comm::sparse_exchange<float> e(MPI_COMM_WORLD, n, delta); });
  const std::string last = std::to_string(size_of() - 1);
  CHECK_MESSAGE(message.find("rank " + last + " has density 0.02, rank 0 has 0.01") != std::string::npos, message);
  // The same density but another capacity through the layout: {n}, {n/2, n/2}, {10, n - 10}.
  const std::vector<segment> layouts[] = {{{0, n}}, {{0, n / 2}, {n / 2, n / 2}}, {{0, 10}, {10, n - 10}}};
  message = refused([&] { comm::sparse_exchange<float> e(MPI_COMM_WORLD, layouts[rank_in() % 3], 0.01); });
  CHECK_MESSAGE(message.find("rank 1 has a layout of 2 segments unlike rank 0's 1") != std::string::npos, message);
  // A smaller payload (a lower density) on one rank: refused the same way, not truncated.
  message = refused([&] { comm::sparse_exchange<float> e(MPI_COMM_WORLD, n, rank_in() == 1 ? 0.005 : 0.01); });
  CHECK_MESSAGE(message.find("rank 1 has density 0.005, rank 0 has 0.01") != std::string::npos, message);
  // A rank that cannot set up (an invalid density) makes every rank's constructor throw it.
  message = refused([&] { comm::sparse_exchange<float> e(MPI_COMM_WORLD, n, rank_in() == 1 ? 2.0 : 0.01); });
  CHECK_MESSAGE(message.find("exchange setup (tag 0): rank 1 failed: delta = 2 is outside (0, 1]") != std::string::npos,
                message);
  // Agreed ranks go on: the communicator is intact.
  comm::sparse_exchange<float> fine(MPI_COMM_WORLD, n, 0.01);
  std::vector<float> g(n, 1.0f), dense(n);
  sparse_vector<float> sent;
  presets::top_k<>{}.compress(g, 0.01, sent);
  fine.start(sent, {}, 0);
  CHECK(fine.wait(dense).entries == sent.size() * std::size_t(size_of()));
}

TEST_CASE("ranks at another step: every rank's wait() throws naming the first") {
  const std::size_t n = 1000;
  std::vector<float> g(n, 1.0f), dense(n);
  sparse_vector<float> sent;
  comm::sparse_exchange<float> other(MPI_COMM_WORLD, n, 0.01);
  presets::top_k<>{}.compress(g, 0.01, sent);
  other.start(sent, {}, rank_in() == 1 ? 4 : 3);
  std::string message = wait_error(other, dense);
  CHECK_MESSAGE(message.find("rank 1 is at step 4, rank 0 at step 3") != std::string::npos, message);
}

TEST_CASE("an exchange destroyed with its all-gather in flight completes it: no write into freed memory") {
  // A throw between start() and wait() (the documented overlap window) unwinds the exchange
  // while MPI still writes into its inbox; the destructor completes the all-gather, and the
  // next collectives run normally on every rank.
  const std::size_t n = 1 << 20;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = float(i % 977) + float(rank_in());
  for (int round = 0; round < 3; ++round) {
    try {
      comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01);
      sparse_vector<float> sent;
      presets::top_k<>{}.compress(g, 0.01, sent);
      exchange.start(sent, {}, std::uint64_t(round));
      throw std::runtime_error("between start and wait");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "between start and wait");
    }
    // Memory the inbox held is reused at once; the next exchange is exact.
    std::vector<std::byte> reuse(std::size_t(size_of()) * (n / 100) * 8 + 4096, std::byte{0x5a});
    comm::sparse_exchange<float> next(MPI_COMM_WORLD, n, 0.01);
    sparse_vector<float> sent;
    presets::top_k<>{}.compress(g, 0.01, sent);
    next.start(sent, {}, 100);
    std::vector<float> dense(n);
    CHECK(next.wait(dense).entries == sent.size() * std::size_t(size_of()));
    CHECK(bits_equal(dense, rank_order_average(sent, n)));
    CHECK(reuse[reuse.size() / 2] == std::byte{0x5a});
  }
  // A moved exchange carries its request: the moved-from one has nothing in flight.
  comm::sparse_exchange<float> first(MPI_COMM_WORLD, n, 0.01);
  sparse_vector<float> sent;
  presets::top_k<>{}.compress(g, 0.01, sent);
  first.start(sent, {}, 5);
  comm::sparse_exchange<float> moved(std::move(first));
  std::vector<float> dense(n);
  CHECK(moved.wait(dense).entries == sent.size() * std::size_t(size_of()));
}

TEST_CASE("blocking collectives (overlap = false), at the fixed and at the exact size: the overlapped exchange's bits") {
  // start() runs the blocking all-gather (of the payloads, or at exact sizes of their sizes)
  // instead of posting it. The same gradients through both: the same updates and residuals.
  const double delta = 0.01;
  comm::exchange_options overlapped;
  overlapped.tag = 11;
  comm::exchange_options blocking = overlapped;
  blocking.tag = 13;
  blocking.overlap = false;
  fixed_and_exact posted(overlapped, 12, delta), waited(blocking, 14, delta);
  std::vector<std::vector<float>> updates, residuals;
  posted.run(rank_in() + 50, 3, [&](const fixed_and_exact::step_result& r) {
    updates.push_back(r.fixed_dense);
    residuals.emplace_back(posted.fixed_residual.values().begin(), posted.fixed_residual.values().end());
  });
  std::size_t step = 0;
  waited.run(rank_in() + 50, 3, [&](const fixed_and_exact::step_result& r) {
    CHECK(bits_equal(r.fixed_dense, updates[step]));  // and run() checks the exact size's against it
    CHECK(bits_equal(std::vector<float>(waited.fixed_residual.values().begin(), waited.fixed_residual.values().end()),
                     residuals[step]));
    CHECK(bits_equal(std::vector<float>(waited.exact_residual.values().begin(), waited.exact_residual.values().end()),
                     residuals[step]));
    ++step;
  });
  CHECK(step == 3);
}

TEST_CASE("payloads at their exact size (compact, plain): the same bits; fewer bytes; a rank destroyed mid-step fails the step alike") {
  const double delta = 0.01;
  const std::size_t n = layout.back().end();
  comm::exchange_options options;
  options.tag = 6;
  options.coding = comm::entry_coding::compact;
  fixed_and_exact both(options, 7, delta);
  both.run(rank_in() + 20, 3, [&](const fixed_and_exact::step_result& r) {
    CHECK(bits_equal(std::vector<float>(both.fixed_residual.values().begin(), both.fixed_residual.values().end()),
                     std::vector<float>(both.exact_residual.values().begin(), both.exact_residual.values().end())));
    // 64 + 2 bytes a value (to 8) + the gap code (to 8), well under the fixed size.
    CHECK(r.exact_report.bytes >= 64 + 3 * r.exact_sent.size());
  });
  // The last rank throws between start() and wait(): its destructor joins the payloads'
  // all-gather with its failure, and every other rank's wait() raises it.
  comm::exchange_options doomed_options = options;
  doomed_options.tag = 8;
  doomed_options.exact_sizes = true;
  auto& first = both.fixed_compressor;
  auto& ra = both.fixed_residual;
  const auto g = gradient_for(rank_in() + 30, 9, layout);
  sparse_vector<float> sent;
  if (rank_in() == size_of() - 1) {
    try {
      comm::sparse_exchange<float> doomed(MPI_COMM_WORLD, layout, delta, doomed_options);
      first.compress<float>(g, delta, sent, ra);
      doomed.start(sent, ra.values(), 9);
      throw std::runtime_error("between start and wait");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "between start and wait");
    }
  } else {
    comm::sparse_exchange<float> peer(MPI_COMM_WORLD, layout, delta, doomed_options);
    const std::vector<float> old(ra.values().begin(), ra.values().end());
    first.compress<float>(g, delta, sent, ra);
    peer.start(sent, ra.values(), 9);
    std::vector<float> dense(n);
    const std::string wanted =
        "rank " + std::to_string(size_of() - 1) + " failed: sparse_exchange: destroyed between start() and wait()";
    CHECK_THROWS_WITH_AS(peer.wait(dense), doctest::Contains(wanted.c_str()), sidco::runtime_error);
    // Its sent entries are back, whole (the values before rounding): nothing was applied.
    for (std::size_t i = 0; i < n; ++i) REQUIRE(ra.values()[i] == g[i] + old[i]);
  }
  // Plain payloads at their exact size too: the same bits as the fixed size, in 64 + 8 bytes
  // an entry (to 8), where the fixed size carries the slack.
  comm::exchange_options plain_options;
  plain_options.tag = 9;
  fixed_and_exact plain(plain_options, 10, delta);
  plain.run(rank_in() + 40, 2, [&](const fixed_and_exact::step_result& r) {
    CHECK(r.exact_report.bytes == 64 + (r.exact_sent.size() * 4 + 7) / 8 * 8 + r.exact_sent.size() * 4);
  });
}
