// The exchanges' payload (comm/wire.hpp), setup record (comm/setup.hpp) and cores
// (comm/allgather/core.hpp, comm/reduce/core.hpp), without a network: every rank reads the
// same payloads, so a property of a step on one set of payloads holds on every rank alike;
// ranks are simulated in one process, their payloads routed as the transports route them.
#include <bit>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/capacity.hpp>
#include <sidco/comm/reduce/frames.hpp>
#include <sidco/comm/reduce/grid.hpp>
#include <sidco/comm/reduce/hops.hpp>
#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/comm/setup.hpp>
#include <sidco/comm/wire.hpp>
#include <sidco/core/utf8.hpp>
#include <sidco/sidco.hpp>

#include "reference.hpp"
#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace wire_test {

using namespace sidco;

namespace {

constexpr std::size_t n = 2000;
constexpr double delta = 0.02;

// One rank's side of an exchange: its gradient, old residual, and what it packed.
struct rank_side {
  std::vector<float> gradient, old_residual;
  feedback::residual<float> residual{n};
  sparse_vector<float> sent;
  std::vector<std::byte> payload;
};

std::vector<rank_side> pack_ranks(int ranks, const comm::wire_format& format, const comm::capacity_plan& plan) {
  std::vector<rank_side> sides(static_cast<std::size_t>(ranks));
  const std::vector<segment> layout{{0, n}};
  for (int r = 0; r < ranks; ++r) {
    rank_side& side = sides[std::size_t(r)];
    std::mt19937_64 rng(100 + std::uint64_t(r));
    std::normal_distribution<float> normal;
    side.gradient.resize(n);
    side.old_residual.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      side.gradient[i] = normal(rng);
      side.old_residual[i] = 0.1f * normal(rng);
      side.residual.values()[i] = side.old_residual[i];
    }
    presets::sidco_e<> compressor;
    compressor.compress(side.gradient, delta, side.sent, side.residual);
    comm::host_residual<float> sink{side.residual.values()};
    const std::size_t trimmed = comm::trim_to_capacity(side.sent, layout, plan, sink);
    side.payload.resize(format.bytes());
    comm::pack(side.sent, trimmed, {3, 7, delta, comm::reduction::average}, format, side.payload);
  }
  return sides;
}

std::vector<std::span<const std::byte>> views_of(const std::vector<std::vector<std::byte>>& payloads) {
  return {payloads.begin(), payloads.end()};
}

// What decode() gives: the dense result, or the message it threw.
struct verdict {
  std::vector<float> dense;
  std::string error;
  bool operator==(const verdict& o) const {
    return error == o.error && dense.size() == o.dense.size() &&
           std::memcmp(dense.data(), o.dense.data(), dense.size() * sizeof(float)) == 0;
  }
};

verdict decode_all(const std::vector<std::vector<std::byte>>& payloads, const comm::wire_format& format) {
  verdict v;
  v.dense.assign(n, -1.0f);
  try {
    comm::decode<float, std::uint32_t>(views_of(payloads), format, std::span<float>(v.dense));
  } catch (const sidco::runtime_error& e) {
    v.error = e.what();
  }
  return v;
}

// P ranks' reduce-scatter exchanges simulated in one process: each rank's core, blocks and
// selection; round 1 and round 2 routed as the MPI and gloo transports route them (block j
// of every rank to owner j, in rank order; every owner's selection to every rank).
template <class T, class Policy>
struct simulated_reduce {
  std::vector<comm::reduce_core<T, std::uint32_t, Policy>> cores;
  std::vector<std::vector<std::byte>> blocks, selections;

  simulated_reduce(std::size_t ranks, const std::vector<segment>& layout, double density, double slack = 1.25,
                   comm::reduction op = comm::reduction::average) {
    for (std::size_t r = 0; r < ranks; ++r)
      cores.emplace_back(layout, density, ranks, r, comm::exchange_options{slack, op, 5});
    blocks.assign(ranks, std::vector<std::byte>(cores[0].block_bytes() * ranks));
    selections.assign(ranks, std::vector<std::byte>(cores[0].block_bytes()));
  }
  std::size_t ranks() const { return cores.size(); }
  // Round 2 on every owner; problems[j], when given, is what owner j found wrong since round 1.
  void select_all(const std::vector<const std::exception*>& problems = {}) {
    const std::size_t bytes = cores[0].block_bytes();
    for (std::size_t j = 0; j < ranks(); ++j) {
      std::vector<std::span<const std::byte>> received;
      for (const auto& b : blocks) received.push_back(std::span<const std::byte>(b).subspan(j * bytes, bytes));
      cores[j].select(received, selections[j], problems.empty() ? nullptr : problems[j]);
    }
  }
  std::vector<std::span<const std::byte>> selection_views() const { return {selections.begin(), selections.end()}; }
};

}  // namespace

TEST_CASE("utf8_prefix never cuts a sequence; valid_utf8 replaces what is not text") {
  const std::string text = "ab\xC3\xA9\xE2\x82\xAC";  // "abé€"
  CHECK(detail::utf8_prefix(text, 3) == "ab");
  CHECK(detail::utf8_prefix(text, 4) == "ab\xC3\xA9");
  CHECK(detail::utf8_prefix(text, 6) == "ab\xC3\xA9");
  CHECK(detail::utf8_prefix(text, 7) == text);
  CHECK(detail::utf8_prefix(text, 100) == text);
  CHECK(detail::valid_utf8(text) == text);
  CHECK(detail::valid_utf8("a\xC3") == "a\xEF\xBF\xBD");           // cut mid-sequence
  CHECK(detail::valid_utf8("\x1a") == "\xEF\xBF\xBD");              // a control character
  CHECK(detail::valid_utf8("\xC0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong NUL
  CHECK(detail::valid_utf8("\xED\xA0\x80").find("\xED") == std::string::npos);  // a surrogate
  CHECK(detail::valid_utf8("\xF4\x90\x80\x80").find("\xF4") == std::string::npos);  // above U+10FFFF
  CHECK(detail::valid_utf8("line\nnext\ttab") == "line\nnext\ttab");
}

TEST_CASE("a failed rank's message cut mid-UTF-8, or not text, still reads as a message") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(2);
  std::vector<std::vector<std::byte>> payloads(2, std::vector<std::byte>(format.bytes()));
  sparse_vector<float> none(n);
  comm::pack(none, 0, {0, 1, delta, comm::reduction::average}, format, payloads[0]);
  // A message longer than the room, with a two-byte character across the cut.
  std::string long_message(format.message_bytes() - 1, 'x');
  long_message += "\xC3\xA9 and more";
  comm::pack_failure<float, std::uint32_t>(sidco::runtime_error(long_message), n, {0, 1, delta, comm::reduction::average},
                                           format, payloads[1]);
  CHECK(comm::header_of(payloads[1]).count == format.message_bytes() - 1);  // the 'é' left out whole
  std::vector<float> dense(n);
  CHECK(decode_all(payloads, format).error.find("rank 1 failed: xxx") != std::string::npos);
  // Bytes that are not text (a peer's damaged message) are replaced, never passed on.
  std::memcpy(payloads[1].data() + comm::wire_format::header_bytes, "bad \xFF\xFE\x1a", 7);
  try {
    comm::decode<float, std::uint32_t>(views_of(payloads), format, std::span<float>(dense));
    FAIL("no error");
  } catch (const sidco::runtime_error& e) {
    const std::string message = e.what();
    CHECK(message.find("rank 1 failed: bad \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") != std::string::npos);
    CHECK(detail::valid_utf8(message) == message);
  }
}

TEST_CASE("an unknown status is named; a non-finite value from a peer is refused") {
  const comm::capacity_plan plan = comm::plan_capacity(std::vector<segment>{{0, n}}, delta, 1.25);
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(plan.total);
  auto sides = pack_ranks(2, format, plan);
  std::vector<std::vector<std::byte>> payloads{sides[0].payload, sides[1].payload};
  payloads[1][5] = std::byte{0x1a};  // status
  CHECK(decode_all(payloads, format).error.find("rank 1 sent status 26, neither ok (0), failed (1) nor relayed (2)") !=
        std::string::npos);
  payloads[1] = sides[1].payload;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t count = std::size_t(comm::header_of(payloads[1]).count);
  std::memcpy(payloads[1].data() + format.values_offset(count) + 3 * sizeof(float), &nan, sizeof nan);
  CHECK(decode_all(payloads, format).error.find("rank 1 sent a non-finite value at position 3") != std::string::npos);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(payloads[1].data() + format.values_offset(count), &inf, sizeof inf);
  CHECK(decode_all(payloads, format).error.find("rank 1 sent a non-finite value at position 0") != std::string::npos);
}

TEST_CASE_TEMPLATE("every damaged entry is refused, naming it: a repeated, falling or out-of-range index, a "
                   "non-finite value, a byte past the count", T, float, double, float16) {
  // agree() first runs one branch-free pass over the entries (entries_ok) and says what is
  // wrong only when it fails: each damage below must make that pass fail, at the first,
  // a middle and the last entry (the vector loops' heads and tails).
  constexpr std::size_t dense = 1000, count = 37;
  const auto format = comm::format_for<T, std::uint32_t>(count + 11);
  std::vector<std::vector<std::byte>> clean(3, std::vector<std::byte>(format.bytes()));
  for (std::size_t r = 0; r < 3; ++r) {
    sparse_vector<T, std::uint32_t> sent(dense);
    for (std::size_t j = 0; j < count; ++j) sent.push_back(std::uint32_t(3 + 25 * j + r), T(float(j) - 18.5f));
    comm::pack(sent, 0, {7, 1, delta, comm::reduction::sum}, format, clean[r]);
  }
  const auto error_of = [&](const std::vector<std::vector<std::byte>>& payloads) {
    try {
      comm::agree<T, std::uint32_t>(views_of(payloads), format);
    } catch (const sidco::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(error_of(clean).empty());
  const auto set_index = [&](std::vector<std::byte>& p, std::size_t j, std::uint32_t i) {
    std::memcpy(p.data() + format.indices_offset() + j * sizeof(std::uint32_t), &i, sizeof i);
  };
  const auto index = [&](const std::vector<std::byte>& p, std::size_t j) {
    std::uint32_t i;
    std::memcpy(&i, p.data() + format.indices_offset() + j * sizeof i, sizeof i);
    return i;
  };
  const auto expect = [&](const std::vector<std::vector<std::byte>>& payloads, const std::string& wanted) {
    const std::string error = error_of(payloads);
    CHECK_MESSAGE(error.find(wanted) != std::string::npos, error, " (wanted: ", wanted, ")");
  };
  for (const std::size_t j : {std::size_t(0), count / 2, count - 1}) {
    CAPTURE(j);
    auto payloads = clean;
    if (j > 0) {  // the same index as the one before it, then one below it
      set_index(payloads[1], j, index(payloads[1], j - 1));
      expect(payloads, "rank 1 sent index " + std::to_string(index(payloads[1], j)) + " at position " +
                           std::to_string(j) + " after");
      set_index(payloads[1], j, index(payloads[1], j - 1) - 1);
      expect(payloads, "(indices must ascend)");
    }
    payloads = clean;
    if (j == count - 1) {  // the last index at the dense size (ascending still)
      set_index(payloads[1], j, dense);
      expect(payloads, "rank 1 sent index 1000 at position " + std::to_string(j) + ", outside dense size 1000");
    }
    for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()}) {
      payloads = clean;
      const T v = T(bad);
      std::memcpy(payloads[2].data() + format.values_offset(count) + j * sizeof(T), &v, sizeof v);
      expect(payloads, "rank 2 sent a non-finite value at position " + std::to_string(j));
    }
  }
  // A byte past the count, in the indices' slots and in the values' (a count lowered in transit).
  for (const std::size_t offset : {format.indices_offset() + count * sizeof(std::uint32_t), format.values_offset(count) - 1,
                                   format.values_offset(count) + count * sizeof(T), format.bytes() - 1}) {
    auto payloads = clean;
    payloads[0][offset] = std::byte{1};
    expect(payloads, "rank 0 sent a payload with entries past its count 37");
  }
}

TEST_CASE("an average whose sum overflows divides first: finite where every value is") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(1);
  std::vector<std::vector<std::byte>> payloads(3, std::vector<std::byte>(format.bytes()));
  for (int r = 0; r < 3; ++r) {
    sparse_vector<float> one(10);
    one.push_back(4, 3e38f);
    comm::pack(one, 0, {0, 0, 0.1, comm::reduction::average}, format, payloads[std::size_t(r)]);
  }
  std::vector<float> dense(10);
  comm::decode<float, std::uint32_t>(views_of(payloads), format, std::span<float>(dense));
  // (3e38 / 3) three times, as a dense all-reduce of averaged buffers gives it.
  CHECK(dense[4] == 3e38f / 3 + 3e38f / 3 + 3e38f / 3);
  CHECK(std::isfinite(dense[4]));
  // Where the sum does not overflow, it is divided once, as before.
  for (int r = 0; r < 3; ++r) {
    sparse_vector<float> one(10);
    one.push_back(4, 0.1f * float(r + 1));
    comm::pack(one, 0, {0, 0, 0.1, comm::reduction::average}, format, payloads[std::size_t(r)]);
  }
  comm::decode<float, std::uint32_t>(views_of(payloads), format, std::span<float>(dense));
  CHECK(dense[4] == (0.0f + 0.1f + 0.2f + 0.3f) / 3.0f);
}

TEST_CASE("every single-field corruption of a header is refused alike on every rank, or decodes the same") {
  // Each header field of rank 1's payload (or rank 0's, against which the others are
  // compared) set to other values in transit. Every rank reads the same payloads, so each
  // rank's verdict is this one; a refusal returns each rank's own sent entries (from its
  // own copy, not the damaged one) to its residual: residual = gradient + old residual.
  const comm::capacity_plan plan = comm::plan_capacity(std::vector<segment>{{0, n}}, delta, 1.25);
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(plan.total);
  const auto sides = pack_ranks(3, format, plan);
  std::vector<std::vector<std::byte>> clean;
  for (const auto& side : sides) clean.push_back(side.payload);
  const verdict reference = decode_all(clean, format);
  REQUIRE(reference.error.empty());

  struct field {
    const char* name;
    std::size_t offset, bytes;
  };
  const field fields[] = {{"magic", 0, 4},      {"version", 4, 1},   {"status", 5, 1},     {"value_code", 6, 1},
                          {"index_bytes", 7, 1}, {"op", 8, 1},        {"error", 9, 1},      {"coding", 10, 1}, {"index_code", 11, 1},
                          {"tag", 12, 4},        {"dense_size", 16, 8}, {"capacity", 24, 8}, {"count", 32, 8},
                          {"sequence", 40, 8},   {"trimmed", 48, 8},  {"delta", 56, 8}};
  std::size_t refused = 0, equal = 0;
  std::set<std::string> refused_fields;
  for (const std::size_t damaged : {std::size_t(1), std::size_t(0)}) {
    for (const field& f : fields) {
      for (const std::uint64_t change : {std::uint64_t(1), std::uint64_t(0x80), ~std::uint64_t(0), std::uint64_t(2)}) {
        auto payloads = clean;
        std::uint64_t value = 0;
        std::memcpy(&value, payloads[damaged].data() + f.offset, f.bytes);
        value = change == 2 ? value - 1 : value ^ change;  // 2: the field one lower
        std::memcpy(payloads[damaged].data() + f.offset, &value, f.bytes);
        if (payloads[damaged] == clean[damaged]) continue;
        const verdict v = decode_all(payloads, format);
        // Every rank alike: decode reads only the payloads.
        CHECK(decode_all(payloads, format) == v);
        if (!v.error.empty()) {
          ++refused;
          refused_fields.insert(f.name);
          for (const auto& side : sides) {
            std::vector<float> residual(side.residual.values().begin(), side.residual.values().end());
            comm::host_residual<float> sink{std::span<float>(residual)};
            comm::give_back_all<float, std::uint32_t>(side.sent.indices(), side.sent.values(), sink);
            for (std::size_t i = 0; i < n; ++i) REQUIRE(residual[i] == side.gradient[i] + side.old_residual[i]);
          }
        } else {
          ++equal;
          INFO(f.name, " of rank ", damaged, " changed by ", change);
          CHECK(v == reference);
        }
      }
    }
  }
  // Fields only reports read (error while ok, trimmed) and the index code, which plain
  // payloads do not read, decode the same; the rest are refused.
  for (const char* name : {"magic", "version", "status", "value_code", "index_bytes", "op", "coding", "tag", "dense_size",
                           "capacity", "count", "sequence", "delta"})
    CHECK_MESSAGE(refused_fields.count(name) == 1, name);
  CHECK(refused > 0);
  CHECK(equal > 0);
}

TEST_CASE("setup records: ranks whose payloads would differ are named, with both values") {
  const std::vector<segment> whole{{0, n}}, halves{{0, n / 2}, {n / 2, n / 2}};
  const comm::wire_fields fields{2, 0, 0.01, comm::reduction::average};
  const auto record = [&](const std::vector<segment>& layout, double d, double slack) {
    const auto plan = comm::plan_capacity(layout, d, slack);
    return comm::setup_of<float, std::uint32_t>(layout, comm::format_for<float, std::uint32_t>(plan.total),
                                                {fields.tag, 0, d, fields.op}, slack);
  };
  const auto check = [](std::vector<comm::exchange_setup> setups, const std::string& expected) {
    std::string message = "accepted";
    try {
      comm::check_setups(setups);
    } catch (const sidco::runtime_error& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
  };
  CHECK_NOTHROW(comm::check_setups(std::vector{record(whole, 0.01, 1.25), record(whole, 0.01, 1.25)}));
  check({record(whole, 0.01, 1.25), record(whole, 0.02, 1.25)}, "rank 1 has density 0.02, rank 0 has 0.01");
  check({record(whole, 0.01, 1.25), record(whole, 0.01, 1.25), record(halves, 0.01, 1.25)},
        "rank 2 has a layout of 2 segments unlike rank 0's 1");
  check({record(whole, 0.01, 1.25), record(whole, 0.01, 2.0)}, "rank 1 has capacity slack 2, rank 0 has 1.25");
  auto other_type = comm::setup_of<double, std::uint32_t>(whole, comm::format_for<double, std::uint32_t>(25),
                                                          {2, 0, 0.01, fields.op}, 1.25);
  check({record(whole, 0.01, 1.25), other_type}, "rank 1 sends float64 values, rank 0 float32");
  check({record(whole, 0.01, 1.25), comm::failed_setup(sidco::error("sidco: density = 2 is outside (0, 1]"), 2)},
        "exchange setup (tag 2): rank 1 failed: density = 2 is outside (0, 1]");
}

TEST_CASE("DGC's sample stays bounded near a density of one entry in N") {
  // k = 1 of 2^22: the 2/delta minimum would sample 2^23 values, more than N.
  std::vector<float> g(std::size_t(1) << 22);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (auto& v : g) v = normal(rng);
  presets::dgc<> dgc;
  sparse_vector<float> out;
  const double tiny = 1.0 / double(g.size());
  const auto report = dgc.compress(g, tiny, out);
  CHECK(report.selected >= 1);
  CHECK(dgc.workspace_bytes() <= 8 * (std::size_t(1) << 20) + (std::size_t(1) << 16));
}

TEST_CASE("reduce-scatter: a block only one owner sees as bad is relayed; every rank raises it, gives back, keeps its state") {
  // Three ranks: blocks packed, routed to their owners, selected, and the selections applied
  // on every rank, as the MPI and gloo transports do.
  constexpr std::size_t ranks = 3;
  simulated_reduce<float, comm::owner_sidco_e> sim(ranks, {{0, n}}, delta);
  const comm::wire_fields fields{5, 2, delta, comm::reduction::average};
  struct side {
    std::vector<float> gradient, old, residual;
    sparse_vector<float> sent;
  };
  std::vector<side> sides(ranks);
  std::vector<std::vector<std::byte>> before;
  for (std::size_t r = 0; r < ranks; ++r) {
    side& s = sides[r];
    std::mt19937_64 rng(40 + r);
    std::normal_distribution<float> normal;
    for (std::size_t i = 0; i < n; ++i) s.gradient.push_back(normal(rng)), s.old.push_back(0.1f * normal(rng));
    s.residual = s.old;
    feedback::residual<float> state(std::span<float>(s.residual));
    presets::sidco_e<> compressor;
    compressor.compress(s.gradient, delta, s.sent, state);
    before.push_back(saved_state(sim.cores[r]));
    comm::host_residual<float> sink{std::span<float>(s.residual)};
    REQUIRE(sim.cores[r].pack(s.sent, sink, fields, sim.blocks[r]));
  }
  const std::size_t bytes = sim.cores[0].block_bytes();
  // Rank 1's block to owner 2 names, first, an index owner 0 owns (ascending still).
  REQUIRE(comm::header_of(std::span<const std::byte>(sim.blocks[1]).subspan(2 * bytes, bytes)).count > 0);
  std::byte* first = sim.blocks[1].data() + 2 * bytes + sim.cores[0].plan().format.indices_offset();
  std::uint32_t foreign = 0;
  while (comm::owner_of(foreign, ranks) != 0) ++foreign;
  std::uint32_t was;
  std::memcpy(&was, first, sizeof was);
  REQUIRE(foreign < was);
  std::memcpy(first, &foreign, sizeof foreign);
  sim.select_all();
  CHECK(comm::header_of(sim.selections[2]).status == std::uint8_t(comm::wire_status::relayed));
  CHECK(comm::header_of(sim.selections[0]).status == std::uint8_t(comm::wire_status::ok));
  std::set<std::string> messages;
  for (std::size_t r = 0; r < ranks; ++r) {
    side& s = sides[r];
    comm::host_residual<float> sink{std::span<float>(s.residual)};
    try {
      sim.cores[r].apply(sim.selection_views(), sink);
      FAIL("no error on rank ", r);
    } catch (const sidco::runtime_error& e) {
      messages.insert(e.what());
    }
    for (std::size_t i = 0; i < n; ++i) REQUIRE(s.residual[i] == s.gradient[i] + s.old[i]);
    CHECK(saved_state(sim.cores[r]) == before[r]);  // the owner's adaptive state
    CHECK_FALSE(sim.cores[r].in_step());
  }
  REQUIRE(messages.size() == 1);
  const std::string owned = "exchange (tag 5, step 2): rank 1 sent index " + std::to_string(foreign) + ", owned by rank 0, not 2";
  CHECK_MESSAGE(messages.begin()->find(owned) != std::string::npos, *messages.begin());
}

TEST_CASE("reduce-scatter: a rank's own problem after round 1 fails the step on every rank alike; the next step works") {
  // What a transport finds on this rank between the rounds (a dense buffer of the wrong
  // size given to wait()) goes out instead of its selection: every rank raises it, gives
  // back everything it sent, and keeps the state it had before the step.
  constexpr std::size_t ranks = 3;
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  const std::size_t size = gradient.size();
  simulated_reduce<float, comm::owner_sidco_e> sim(ranks, {{0, size}}, 0.01);
  std::vector<std::vector<float>> residuals(ranks, std::vector<float>(size, 0.0f));
  std::vector<presets::sidco_e<>> compressors(ranks);
  auto step = [&](std::uint64_t t, const std::exception* problem_on_rank_2) {
    std::vector<sparse_vector<float>> sent(ranks);
    std::vector<std::vector<float>> inputs(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<float> g(size);
      for (std::size_t i = 0; i < size; ++i) g[i] = gradient[(i + r * 331 + t * 57) % size];
      inputs[r] = residuals[r];
      for (std::size_t i = 0; i < size; ++i) inputs[r][i] = inputs[r][i] + g[i];
      feedback::residual<float> state{std::span<float>(residuals[r])};
      compressors[r].compress(std::span<const float>(g), 0.01, sent[r], state);
      comm::host_residual<float> sink{std::span<float>(residuals[r])};
      sim.cores[r].pack(sent[r], sink, sim.cores[r].fields(t), sim.blocks[r]);
    }
    sim.select_all({nullptr, nullptr, problem_on_rank_2});
    std::set<std::string> errors;
    for (std::size_t r = 0; r < ranks; ++r) {
      comm::host_residual<float> sink{std::span<float>(residuals[r])};
      try {
        sim.cores[r].apply(sim.selection_views(), sink);
        // Conservation, bitwise: what is applied of this rank's entries plus the residual.
        const auto global = sim.cores[r].global_selection();
        for (std::size_t j = 0; j < sent[r].size(); ++j) {
          const std::uint32_t i = sent[r].indices()[j];
          if (std::binary_search(global.begin(), global.end(), i)) REQUIRE(residuals[r][i] == 0.0f);
        }
      } catch (const sidco::runtime_error& e) {
        errors.insert(e.what());
        for (std::size_t i = 0; i < size; ++i) REQUIRE(residuals[r][i] == inputs[r][i]);
      }
    }
    return errors;
  };
  CHECK(step(0, nullptr).empty());
  std::vector<std::vector<std::byte>> after_first;
  for (const auto& core : sim.cores) after_first.push_back(saved_state(core));
  const sidco::error wrong_dense("sidco: dense: size 7 is not the exchange's 33000");
  const auto errors = step(1, &wrong_dense);
  REQUIRE(errors.size() == 1);
  CHECK_MESSAGE(errors.begin()->find("exchange (tag 5, step 1): rank 2 failed: dense: size 7") != std::string::npos,
                *errors.begin());
  for (std::size_t r = 0; r < ranks; ++r) CHECK(saved_state(sim.cores[r]) == after_first[r]);
  for (std::uint64_t t = 2; t < 5; ++t) CHECK(step(t, nullptr).empty());
  for (std::size_t r = 1; r < ranks; ++r) {
    REQUIRE(std::ranges::equal(sim.cores[r].global_selection(), sim.cores[0].global_selection()));
    REQUIRE(std::memcmp(sim.cores[r].updates().data(), sim.cores[0].updates().data(),
                        sim.cores[0].updates().size() * sizeof(float)) == 0);
  }
}

TEST_CASE_TEMPLATE("sum_runs: each index's values added in run order, in the accumulator type", T, float, double,
                   float16) {
  // Ranges crossing several windows and starting mid-window, runs with no entries, indices
  // on window edges, signed zeros, values whose sum depends on the order; both walks (the
  // windowed one and the grouped one, which sum_runs takes for many short runs) and sum_runs'
  // choice, at few runs and at many (a few entries each).
  using A = typename float_traits<T>::accumulator;
  constexpr std::size_t size = 3 * comm::sum_window + 777;
  for (const std::size_t ranks :
       {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(5), std::size_t(17), std::size_t(300)}) {
    for (const std::size_t begin : {std::size_t(0), std::size_t(13), comm::sum_window - 1}) {
      const std::size_t end = size - (begin == 0 ? 0 : 5);
      std::mt19937_64 rng(ranks * 131 + begin);
      std::uniform_real_distribution<double> u(0, 1);
      const std::vector<std::size_t> edges = {begin, comm::sum_window, 2 * comm::sum_window - 1, 2 * comm::sum_window,
                                              end - 1};
      std::vector<sparse_vector<T, std::uint32_t>> sent(ranks, sparse_vector<T, std::uint32_t>(size));
      std::map<std::size_t, A> expected;
      const double scale = ranks > 100 ? 0.005 : 1.0;  // many runs: a few entries each
      for (std::size_t r = 0; r < ranks; ++r) {
        const double keep = r == 1 ? 0.0 : scale * (0.05 + 0.1 * double(r % 8));  // rank 1 sends nothing
        for (std::size_t i = begin; i < end; ++i) {
          const bool edge = std::find(edges.begin(), edges.end(), i) != edges.end();
          if (!(edge && r != 1) && u(rng) >= keep) continue;
          const T v = i % 7 == 0 ? T(-0.0) : T((u(rng) - 0.5) * std::pow(10.0, 8 * u(rng) - 4));
          sent[r].push_back(std::uint32_t(i), v);
          auto [at, fresh] = expected.try_emplace(i, A(0));
          at->second = A(at->second + to_accumulator(v));
        }
      }
      std::vector<comm::entry_run<T, std::uint32_t>> runs;
      for (const auto& s : sent)
        runs.push_back({reinterpret_cast<const std::byte*>(s.indices().data()),
                        reinterpret_cast<const std::byte*>(s.values().data()), s.size()});
      const std::span<const comm::entry_run<T, std::uint32_t>> view(runs);
      for (const int walk : {0, 1, 2}) {
        CAPTURE(ranks);
        CAPTURE(begin);
        CAPTURE(walk);
        std::vector<std::pair<std::uint64_t, A>> got;
        const auto add = [&](std::uint64_t i, A sum) { got.emplace_back(i, sum); };
        if (walk == 0) comm::detail::fold_runs_windowed<T, std::uint32_t, A>(view, begin, end, comm::detail::accumulate<T>{}, add);
        else if (walk == 1) comm::detail::fold_runs_grouped<T, std::uint32_t, A>(view, begin, end, comm::detail::accumulate<T>{}, add);
        else comm::sum_runs<T, std::uint32_t>(view, begin, end, add);
        REQUIRE(got.size() == expected.size());
        std::size_t j = 0;
        for (const auto& [index, sum] : expected) {
          REQUIRE(got[j].first == index);
          REQUIRE(std::memcmp(&got[j].second, &sum, sizeof sum) == 0);
          ++j;
        }
      }
    }
  }
}

TEST_CASE("sum_runs groups the entries first for many short runs, not for a few long ones") {
  // The reduce exchange's shapes at N = 2^20, k = N / 100: P runs of k / P entries (an
  // owner's blocks, the owners' selections), and the all-gather's P runs of k.
  constexpr std::size_t n = std::size_t(1) << 20, k = n / 100;
  const auto runs_of = [&](std::size_t ranks, std::size_t each) {
    return std::vector<comm::entry_run<float, std::uint32_t>>(ranks, comm::entry_run<float, std::uint32_t>{nullptr, nullptr, each});
  };
  const auto grouped = [&](std::size_t ranks, std::size_t each) {
    const auto runs = runs_of(ranks, each);
    return comm::detail::fold_grouped(std::span<const comm::entry_run<float, std::uint32_t>>(runs), 0, n);
  };
  CHECK(grouped(1024, k / 1024));
  CHECK(grouped(256, k / 256));
  CHECK_FALSE(grouped(16, k / 16));
  CHECK_FALSE(grouped(4, k / 4));
  CHECK_FALSE(grouped(64, k));
}

TEST_CASE_TEMPLATE("reduce-scatter: the Top-k owner keeps the exact Top-k, ties to the lower index", T, float, double) {
  // Magnitudes spread over many binades with runs of ties (what the gathered later radix
  // digits must still order right), at shares from one entry to all but one.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> x(5000);
  for (auto& v : x) v = T((u(rng) < 0.5 ? -1 : 1) * std::pow(2.0, 12 * u(rng) - 6));
  for (std::size_t i = 0; i < x.size(); i += 7) x[i] = x[3];
  comm::owner_top_k owner;
  for (const std::size_t k : {std::size_t(1), std::size_t(50), std::size_t(700), std::size_t(2500), x.size() - 1}) {
    std::vector<std::uint32_t> indices(x.size());
    std::vector<T> values = x;
    for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = std::uint32_t(2 * i);
    const std::size_t kept = owner.select(indices.data(), values.data(), x.size(), k);
    std::vector<double> magnitudes(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) magnitudes[i] = double(x[i]);
    const auto want = test::reference_top_k<double>(magnitudes, k);
    INFO("k ", k);
    REQUIRE(kept == k);
    for (std::size_t j = 0; j < kept; ++j) REQUIRE(indices[j] == 2 * want[j].first);
  }
}

TEST_CASE("reduce-scatter: the default owner keeps the exact Top-k of its reduced values at every share") {
  // A region's reduced values as an owner sees them: the largest magnitudes of a real
  // gradient (the ranks' tails) at ascending, spaced indices. At small shares the owner runs
  // its SIDCo + exact_k compressor; from direct_share on, the exact Top-k itself, leaving the
  // compressor's adaptive state as it was. Either way: the reference Top-k, ties to the
  // lower index.
  const auto g = test::load_gradient("lstm_it10.npy");
  std::vector<float> tail(g.begin(), g.end());
  std::nth_element(tail.begin(), tail.begin() + 60000, tail.end(),
                   [](float a, float b) { return std::fabs(a) > std::fabs(b); });
  tail.resize(60000);
  std::shuffle(tail.begin(), tail.end(), std::mt19937_64(3));
  for (std::size_t i = 100; i < 200; ++i) tail[i] = tail[50];  // a run of ties: the lower indices win
  comm::owner_sidco_e owner;
  CHECK(std::string(comm::owner_sidco_e::name) == "sidco-e-exact");  // the registry's name
  for (const double share : {0.002, 0.01, 0.05, 0.099, 0.1, 0.3, 0.9}) {
    const std::size_t k = std::size_t(share * double(tail.size()));
    std::vector<std::uint32_t> indices(tail.size());
    std::vector<float> values = tail;
    for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = std::uint32_t(5 * i + 1);
    state_writer before;
    owner.save_state(before);
    const std::size_t kept = owner.select(indices.data(), values.data(), tail.size(), k);
    state_writer after;
    owner.save_state(after);
    INFO("share ", share);
    const auto want = test::reference_top_k<float>(tail, k);
    REQUIRE(kept == want.size());
    for (std::size_t j = 0; j < kept; ++j) {
      REQUIRE(indices[j] == 5 * want[j].first + 1);
      REQUIRE(values[j] == want[j].second);
    }
    CHECK((share >= owner.direct_share) == (before.bytes() == after.bytes()));
  }
}

TEST_CASE_TEMPLATE("a sum beyond the type's range fails the step as non-finite on every rank, in both exchanges", T,
                   float, float16) {
  // Two ranks send big at the same index with reduction::sum: finite each, beyond T's range
  // summed (float: inf in its float accumulator; float16: 80000, finite in its float
  // accumulator, beyond float16 once rounded). The owner relays it as a non-finite failure
  // (as a rank's own overflow), whichever policy, and every rank raises nonfinite_exchange
  // with its entries given back.
  constexpr std::size_t ranks = 2;
  constexpr bool half = std::is_same_v<T, float16>;
  const T big = T(half ? 40000.0f : 3e38f);
  const std::string sum = half ? "add up to 80000, beyond float16's range" : "add up to inf, beyond float32's range";
  const auto sent_by = [&](std::size_t r) {  // big at index 3, 1 at an index of the rank's own
    sparse_vector<T> sent(n);
    sent.push_back(std::uint32_t(3), big);
    sent.push_back(std::uint32_t(7 + r), T(1.0f));
    return sent;
  };
  for (const bool top_k_owner : {true, false}) {
    auto run = [&](auto policy) {
      simulated_reduce<T, decltype(policy)> sim(ranks, {{0, n}}, delta, 1.25, comm::reduction::sum);
      std::vector<sparse_vector<T>> sent;
      std::vector<std::vector<T>> residuals(ranks, std::vector<T>(n, T(0.0f)));
      for (std::size_t r = 0; r < ranks; ++r) {
        sent.push_back(sent_by(r));
        comm::host_residual<T> sink{std::span<T>(residuals[r])};
        sim.cores[r].pack(sent[r], sink, sim.cores[r].fields(2), sim.blocks[r]);
      }
      sim.select_all();
      const std::size_t owner = comm::owner_of(3, ranks);  // index 3's
      CHECK(comm::header_of(sim.selections[owner]).error == std::uint8_t(comm::error_kind::nonfinite));
      CHECK(comm::header_of(sim.selections[1 - owner]).status == std::uint8_t(comm::wire_status::ok));
      std::set<std::string> messages;
      for (std::size_t r = 0; r < ranks; ++r) {
        comm::host_residual<T> sink{std::span<T>(residuals[r])};
        try {
          sim.cores[r].apply(sim.selection_views(), sink);
          FAIL("no error on rank ", r);
        } catch (const comm::nonfinite_exchange& e) {
          messages.insert(e.what());
        }
        CHECK(to_accumulator(residuals[r][3]) == to_accumulator(big));
        CHECK(to_accumulator(residuals[r][7 + r]) == 1.0f);
      }
      REQUIRE(messages.size() == 1);
      CHECK_MESSAGE(messages.begin()->find("the ranks' values at index 3 " + sum) != std::string::npos,
                    *messages.begin());
    };
    if (top_k_owner) run(comm::owner_top_k{});
    else run(comm::owner_sidco_e{});
  }
  // The all-gather's decode of the same entries: the same sentence, dense left zero.
  comm::allgather_core<T> gather({{0, n}}, delta, 1.25);
  std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(gather.format().bytes()));
  for (std::size_t r = 0; r < ranks; ++r) {
    auto sent = sent_by(r);
    comm::host_residual<T> none;
    gather.encode(sent, none, {0, 2, delta, comm::reduction::sum}, payloads[r]);
  }
  std::vector<T> dense(n, T(5.0f));
  std::string message;
  try {
    comm::decode<T, std::uint32_t>(views_of(payloads), gather.format(), std::span<T>(dense));
  } catch (const comm::nonfinite_exchange& e) {
    message = e.what();
  }
  CHECK_MESSAGE(message.find("the ranks' values at index 3 " + sum) != std::string::npos, message);
  CHECK(std::all_of(dense.begin(), dense.end(), [](T v) { return to_accumulator(v) == 0.0f; }));
}

TEST_CASE_TEMPLATE("an average whose sum overflows is finite in both exchanges, by one rule, bit for bit", T, float,
                   float16, bfloat16) {
  // Every rank sends a value at index 3 whose sum over the ranks is beyond T's range (or,
  // for float16, beyond it once rounded) while their average is not. The all-gather's decode
  // and the reduce-scatter's owner apply the same rule (comm/sum.hpp): the same finite bits.
  const double big = std::is_same_v<T, float16> ? 30000.0 : 2e38;
  for (const std::size_t ranks : {std::size_t(2), std::size_t(3), std::size_t(5)}) {
    const std::vector<segment> layout{{0, n}};
    std::vector<sparse_vector<T, std::uint32_t>> sent(ranks, sparse_vector<T, std::uint32_t>(n));
    for (std::size_t r = 0; r < ranks; ++r) {
      sent[r].push_back(std::uint32_t(3), T(big * (1.0 - 0.01 * double(r))));
      sent[r].push_back(std::uint32_t(100 + r), T(1.0));
      sent[r].push_back(std::uint32_t(1500), T(-0.5 * double(r + 1)));
    }
    // The all-gather's decode.
    comm::allgather_core<T> gather(layout, delta, 1.25);
    std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(gather.format().bytes()));
    for (std::size_t r = 0; r < ranks; ++r) {
      auto copy = sent[r];
      comm::host_residual<T> none;
      gather.encode(copy, none, {0, 1, delta, comm::reduction::average}, payloads[r]);
    }
    std::vector<T> dense(n);
    comm::decode<T, std::uint32_t>(views_of(payloads), gather.format(), std::span<T>(dense));
    REQUIRE(std::isfinite(double(to_accumulator(dense[3]))));
    CHECK(double(to_accumulator(dense[3])) > 0.9 * big);
    // The reduce-scatter's, with either owner.
    auto run = [&](auto policy) {
      simulated_reduce<T, decltype(policy)> sim(ranks, layout, delta);
      for (std::size_t r = 0; r < ranks; ++r) {
        auto copy = sent[r];
        comm::host_residual<T> none;
        REQUIRE(sim.cores[r].pack(copy, none, sim.cores[r].fields(1), sim.blocks[r]));
      }
      sim.select_all();
      for (std::size_t r = 0; r < ranks; ++r) {
        comm::host_residual<T> none;
        sim.cores[r].apply(sim.selection_views(), none);
        const auto global = sim.cores[r].global_selection();
        const auto updates = sim.cores[r].updates();
        REQUIRE(std::binary_search(global.begin(), global.end(), std::uint32_t(3)));
        for (std::size_t j = 0; j < global.size(); ++j)
          REQUIRE(std::memcmp(&updates[j], &dense[global[j]], sizeof(T)) == 0);
      }
    };
    run(comm::owner_top_k{});
    run(comm::owner_sidco_e{});
  }
}

TEST_CASE_TEMPLATE("the device path's decode (entries written into zeros) gives decode's bits", T, float, double,
                   float16, bfloat16) {
  // The CUDA transports (the hook's all-gather codec, nccl_exchange) run decode_into on the
  // host and write the entries into the zeroed device buffer; the CPU codec runs decode into
  // the bucket. Real gradients at 1, 2, 3 and 8 ranks, plain and compact payloads, with one
  // index whose sum overflows for the average.
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  const std::size_t size = gradient.size();
  for (const auto coding : {comm::entry_coding::plain, comm::entry_coding::compact})
  for (const std::size_t ranks : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(8)}) {
    CAPTURE(int(coding));
    CAPTURE(ranks);
    comm::allgather_core<T> core({{0, size}}, 0.01, 1.25, coding);
    std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(core.format().bytes()));
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<T> g(size);
      for (std::size_t i = 0; i < size; ++i) g[i] = T(gradient[(i + r * 997) % size]);
      // Near the type's largest: the ranks' sum overflows (float16: once rounded), their average does not.
      g[size / 2] = T(std::is_same_v<T, float16> ? 49000.0 : std::is_same_v<T, double> ? 1.3e308 : 2.5e38);
      sparse_vector<T, std::uint32_t> sent;
      presets::top_k<> compressor;
      compressor.compress(std::span<const T>(g), 0.01, sent);
      comm::host_residual<T> none;
      core.encode(sent, none, {1, 0, 0.01, comm::reduction::average}, payloads[r]);
    }
    std::vector<T> dense(size), written(size, T(0));
    comm::host_residual<T> none;
    const auto host = core.decode(views_of(payloads), std::span<T>(dense), none);
    std::vector<std::uint32_t> indices{7};  // decode_into clears what they held
    std::vector<T> values{T(1)};
    const auto device = core.decode_into(views_of(payloads), indices, values, none);
    REQUIRE(indices.size() == values.size());
    CHECK(std::is_sorted(indices.begin(), indices.end()));
    for (std::size_t j = 0; j < indices.size(); ++j) written[indices[j]] = values[j];
    CHECK(host.distinct == device.distinct);
    CHECK(indices.size() == device.distinct);
    REQUIRE(std::memcmp(written.data(), dense.data(), size * sizeof(T)) == 0);
    CHECK(std::isfinite(double(to_accumulator(dense[size / 2]))));
  }
}

// The reduce exchange's oracle on a real gradient split among `ranks`, over `steps` steps:
// every rank applies the same bits, the global selection's update at each index is
// comm/sum.hpp's rule over what the ranks' blocks held there (computed here from the blocks'
// own entries), and per rank, bitwise, residual + applied contribution = gradient + old
// residual.
template <class T>
void check_reduce_rule(const std::vector<T>& gradient, std::size_t ranks, comm::reduction op, std::uint64_t steps) {
  using A = typename float_traits<T>::accumulator;
  const std::size_t size = gradient.size();
  {
    {
      simulated_reduce<T, comm::owner_top_k> sim(ranks, {{0, size}}, 0.01, 1.25, op);
      std::vector<std::vector<T>> residuals(ranks, std::vector<T>(size, T(0)));
      for (std::uint64_t step = 0; step < steps; ++step) {
        std::vector<sparse_vector<T, std::uint32_t>> sent(ranks);
        std::vector<std::vector<T>> inputs(ranks);
        for (std::size_t r = 0; r < ranks; ++r) {
          std::vector<T> g(size);
          for (std::size_t i = 0; i < size; ++i) g[i] = gradient[(i + r * 997 + step * 31) % size];
          feedback::residual<T> state{std::span<T>(residuals[r])};
          presets::top_k<> compressor({}, {}, backend::cpu(1));  // one thread: ranks compress one after another
          compressor.compress(std::span<const T>(g), 0.01, sent[r], state);
          inputs[r] = residuals[r];
          for (std::size_t j = 0; j < sent[r].size(); ++j) inputs[r][sent[r].indices()[j]] = sent[r].values()[j];
          comm::host_residual<T> sink{std::span<T>(residuals[r])};
          REQUIRE(sim.cores[r].pack(sent[r], sink, sim.cores[r].fields(step), sim.blocks[r]));
        }
        sim.select_all();
        for (std::size_t r = 0; r < ranks; ++r) {
          comm::host_residual<T> sink{std::span<T>(residuals[r])};
          sim.cores[r].apply(sim.selection_views(), sink);
        }
        const auto global = sim.cores[0].global_selection();
        const auto updates = sim.cores[0].updates();
        for (std::size_t r = 1; r < ranks; ++r) {
          REQUIRE(std::ranges::equal(sim.cores[r].global_selection(), global));
          REQUIRE(std::memcmp(sim.cores[r].updates().data(), updates.data(), updates.size() * sizeof(T)) == 0);
        }
        // The reference: each kept index's values as the blocks held them (sent, trimmed), in rank order.
        for (std::size_t j = 0; j < global.size(); ++j) {
          A sum = A(0);
          for (std::size_t r = 0; r < ranks; ++r) {
            const auto at = std::lower_bound(sent[r].indices().begin(), sent[r].indices().end(), global[j]);
            if (at != sent[r].indices().end() && *at == global[j])
              sum = A(sum + to_accumulator(sent[r].values()[std::size_t(at - sent[r].indices().begin())]));
          }
          const T want = from_accumulator<T>(op == comm::reduction::average ? A(sum / A(double(ranks))) : sum);
          REQUIRE(std::memcmp(&updates[j], &want, sizeof(T)) == 0);
        }
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto kept = sent[r].indices();  // what the blocks held, ascending
          std::size_t unconserved = 0, next_kept = 0, next_global = 0;  // both lists walked beside i
          for (std::size_t i = 0; i < size; ++i) {
            while (next_kept < kept.size() && kept[next_kept] < i) ++next_kept;
            while (next_global < global.size() && global[next_global] < i) ++next_global;
            const bool applied_here = next_kept < kept.size() && kept[next_kept] == i && next_global < global.size() &&
                                      global[next_global] == i;
            unconserved += applied_here ? residuals[r][i] != T(0)
                                        : std::memcmp(&residuals[r][i], &inputs[r][i], sizeof(T)) != 0;
          }
          REQUIRE(unconserved == 0);
        }
        // Ascending, each index once, every block's entries where they belong.
        REQUIRE(std::adjacent_find(global.begin(), global.end(), std::greater_equal<>()) == global.end());
        for (std::size_t r = 0; r < ranks; ++r)
          for (std::size_t j = 0; j < ranks; ++j) {
            const auto block = std::span<const std::byte>(sim.blocks[r]).subspan(j * sim.cores[0].block_bytes(),
                                                                                   sim.cores[0].block_bytes());
            const auto count = std::size_t(comm::header_of(block).count);
            for (std::size_t e = 0; e < count; ++e)
              REQUIRE(comm::owner_of(comm::detail::index_at<std::uint32_t>(
                                         block.data() + sim.cores[0].plan().format.indices_offset() + 4 * e),
                                     ranks) == j);
          }
      }
    }
  }
}

TEST_CASE_TEMPLATE("reduce-scatter: the update is the rule applied to the owners' rank-order sums; nothing lost per rank",
                   T, float, double, float16, bfloat16) {
  // 1, 2, 3 and 5 ranks, summed and averaged, over three steps.
  std::vector<T> gradient;
  for (const float v : test::load_gradient<float>("cnn_it200.npy")) gradient.push_back(T(v));
  for (const std::size_t ranks : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(5)})
    for (const comm::reduction op : {comm::reduction::average, comm::reduction::sum})
      check_reduce_rule<T>(gradient, ranks, op, 3);
}

TEST_CASE("reduce-scatter: the same rule at 300 ranks, where the owners' sums and the decode group entries first") {
  // 2^17 values of a real gradient, k = 1,311: a block holds about 5 entries, few enough that
  // sum_runs takes the grouped walk (checked on that shape) for the owners' sums and every
  // rank's merge of the 300 selections.
  std::vector<float> gradient = test::load_gradient<float>("cnn_it200.npy");
  gradient.resize(std::size_t(1) << 17);
  constexpr std::size_t ranks = 300;
  simulated_reduce<float, comm::owner_top_k> shape(ranks, {{0, gradient.size()}}, 0.01);
  const std::size_t per_block = (shape.cores[0].plan().target + ranks - 1) / ranks;  // what a block holds, about
  std::vector<comm::entry_run<float, std::uint32_t>> runs(ranks, {nullptr, nullptr, per_block});
  REQUIRE(comm::detail::fold_grouped(std::span<const comm::entry_run<float, std::uint32_t>>(runs), 0, gradient.size()));
  check_reduce_rule<float>(gradient, ranks, comm::reduction::average, 2);
}

TEST_CASE("reduce-scatter: moving hot rows keep the applied density at 16 and 64 ranks") {
  // Heavy-tailed values (log-normal), 30% zeros, plus 32 rows of 64 values 50x larger that every rank
  // shares and that move every step (an embedding's rows for this batch): whatever indices
  // they fall on, each owner's blocks hold about k/P entries, so the global selection keeps
  // its target. Contiguous regions rebalanced from the last step applied 0.94 of it at 16
  // ranks and 0.85 at 64 (bench/smpi_exchange.cpp, same gradients). Exact Top-k with error
  // feedback on every rank, N = 2^18, delta = 0.01, 8 steps; tolerance: every step >= 0.95.
  constexpr std::size_t n = std::size_t(1) << 18, width = 64, rows = 32;
  constexpr double delta = 0.01;
  const double k = double(target_count(delta, n));
  for (const std::size_t ranks : {std::size_t(16), std::size_t(64)}) {
    simulated_reduce<float, comm::owner_top_k> sim(ranks, {{0, n}}, delta);
    std::vector<std::vector<float>> residuals(ranks, std::vector<float>(n, 0.0f));
    // One draw of the values, each rank's and step's a rotation of it by a random offset.
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::normal_distribution<float> spread(0.0f, 1.5f);
    std::vector<float> values(n), g(n);
    for (auto& v : values) v = u(rng) < 0.3f ? 0.0f : (u(rng) < 0.5f ? -1.0f : 1.0f) * std::exp(spread(rng)) * 1e-3f;
    double lowest = 2;
    for (std::uint64_t step = 0; step < 8; ++step) {
      std::mt19937_64 shared(step * 7919u + 17);
      std::vector<std::size_t> hot;
      for (std::size_t j = 0; j < rows; ++j) hot.push_back(std::size_t(shared() % (n / width)));
      for (std::size_t r = 0; r < ranks; ++r) {
        const std::size_t offset = std::size_t(rng() % n);
        for (std::size_t i = 0; i < n; ++i) g[i] = values[(i + offset) % n];
        for (const std::size_t row : hot)
          for (std::size_t i = row * width; i < (row + 1) * width; ++i) g[i] *= 50.0f;
        feedback::residual<float> state{std::span<float>(residuals[r])};
        sparse_vector<float, std::uint32_t> sent;
        presets::top_k<> compressor({}, {}, backend::cpu(1));  // one thread: ranks compress one after another
        compressor.compress(std::span<const float>(g), delta, sent, state);
        comm::host_residual<float> sink{std::span<float>(residuals[r])};
        REQUIRE(sim.cores[r].pack(sent, sink, sim.cores[r].fields(step), sim.blocks[r]));
      }
      sim.select_all();
      for (std::size_t r = 0; r < ranks; ++r) {
        comm::host_residual<float> sink{std::span<float>(residuals[r])};
        sim.cores[r].apply(sim.selection_views(), sink);
      }
      lowest = std::min(lowest, double(sim.cores[0].global_selection().size()) / k);
    }
    INFO(ranks, " ranks: lowest applied density / target ", lowest);
    CHECK(lowest >= 0.95);
  }
}

TEST_CASE("residual sinks: entries staged for a device residual are what a host residual receives") {
  // Slack 1 at 5 ranks: about half the blocks receive more than their k/P share of the real
  // gradient's selection, so entries are trimmed; a transport whose residual is in device memory stages
  // them and writes them in one go: the same writes.
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  const std::size_t size = gradient.size(), ranks = 5;
  const auto plan = comm::plan_reduce<float, std::uint32_t>(std::vector<segment>{{0, size}}, 0.01, 1.0, ranks);
  std::vector<float> residual(size, 0.f);
  feedback::residual<float> state{std::span<float>(residual)};
  sparse_vector<float, std::uint32_t> sent;
  presets::top_k<> compressor;
  compressor.compress(std::span<const float>(gradient), 0.01, sent, state);
  auto staged_sent = sent;
  std::vector<float> staged_target = residual;
  std::vector<std::byte> blocks(plan.format.bytes() * ranks), staged_blocks(blocks.size());
  comm::host_residual<float> host{std::span<float>(residual)};
  const std::size_t trimmed = comm::pack_blocks(sent, plan, comm::wire_fields{}, host, std::span<std::byte>(blocks));
  comm::staged_residual<float, std::uint32_t> staged;
  CHECK(comm::pack_blocks(staged_sent, plan, comm::wire_fields{}, staged, std::span<std::byte>(staged_blocks)) ==
        trimmed);
  REQUIRE(trimmed > 0);
  CHECK(staged.size() == trimmed);
  for (std::size_t j = 0; j < staged.size(); ++j) staged_target[staged.indices[j]] = staged.values[j];
  CHECK(std::memcmp(staged_target.data(), residual.data(), size * sizeof(float)) == 0);
  CHECK(blocks == staged_blocks);
}

TEST_CASE("reduce-scatter checkpoints: one versioned format; the older ones load; what cannot apply is refused") {
  const std::vector<segment> layout{{0, 5000}};
  comm::reduce_core<float, std::uint32_t, comm::owner_sidco_e> core(layout, 0.01, 3, 0);
  // The region bounds the older formats held (read and dropped now), and an owner whose
  // adaptive state moved.
  const std::vector<std::size_t> bounds{0, 1410, 3377, 5000};
  comm::owner_sidco_e owner;
  std::vector<float> values(3000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(double(i)) * double(i % 97));
  std::vector<std::uint32_t> indices(values.size());
  std::iota(indices.begin(), indices.end(), 0u);
  owner.select(indices.data(), values.data(), values.size(), 20);
  state_writer owner_bytes;
  owner.save_state(owner_bytes);
  // The older formats, as the MPI/NCCL exchanges and the hook wrote them, and version 2.
  for (const char* tag : {"sparse_reduce_exchange", "reduce_codec", "version 2"}) {
    state_writer legacy;
    const bool v2 = std::string(tag) == "version 2";
    if (v2) {
      legacy.name(comm::reduce_state_name);
      legacy.word(2);
      legacy.word(3);
      legacy.word(5000);
    } else {
      legacy.name(tag);
      legacy.word(bounds.size());
    }
    for (std::size_t b : bounds) legacy.word(b);
    if (v2) legacy.name("sidco-e-exact");
    auto bytes = legacy.take();
    bytes.insert(bytes.end(), owner_bytes.bytes().begin(), owner_bytes.bytes().end());
    const auto info = comm::read_reduce_state_info(bytes);
    CHECK(info.version == (v2 ? 2 : 1));
    CHECK(info.ranks == 3);
    CHECK(info.size == 5000);
    state_reader in(bytes);
    core.load_state(in);
    in.finish();
    CHECK(saved_state(core.policy()) == owner_bytes.bytes());
    // The hook's older state always held SIDCo-E's owner state: a Top-k owner skips it.
    comm::reduce_core<float, std::uint32_t, comm::owner_top_k> top_k(layout, 0.01, 3, 0);
    state_reader again(bytes);
    if (std::string(tag) == "reduce_codec") {
      top_k.load_state(again);
      again.finish();  // read to the end: the owner state skipped
    }
  }
  // Today's format round-trips, says what it is, and is refused where it cannot apply.
  const auto saved = saved_state(core);
  const auto info = comm::read_reduce_state_info(saved);
  CHECK(info.version == comm::reduce_state_version);
  CHECK(info.ranks == 3);
  CHECK(info.size == 5000);
  CHECK(info.owner == "sidco-e-exact");
  comm::reduce_core<float, std::uint32_t, comm::owner_sidco_e> fresh(layout, 0.01, 3, 1);
  state_reader in(saved);
  fresh.load_state(in);
  in.finish();
  CHECK(saved_state(fresh) == saved);
  auto refused = [&](auto& other, const char* sentence) {
    const auto before = saved_state(other);
    state_reader reader(saved);
    std::string message;
    try {
      other.load_state(reader);
    } catch (const sidco::error& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find(sentence) != std::string::npos, message);
    CHECK(saved_state(other) == before);
  };
  comm::reduce_core<float, std::uint32_t, comm::owner_sidco_e> two_ranks(layout, 0.01, 2, 0);
  refused(two_ranks, "saved for 3 ranks and 5000 values; this exchange has 2 ranks and 5000 values");
  comm::reduce_core<float, std::uint32_t, comm::owner_sidco_e> bigger(std::vector<segment>{{0, 6000}}, 0.01, 3, 0);
  refused(bigger, "saved for 3 ranks and 5000 values; this exchange has 3 ranks and 6000 values");
  comm::reduce_core<float, std::uint32_t, comm::owner_top_k> other_owner(layout, 0.01, 3, 0);
  refused(other_owner, "saved by owner 'sidco-e-exact'; this exchange's owner is 'top-k'");
}

TEST_CASE("a rank whose input is not finite fails as nonfinite_exchange on every rank; any other failure does not") {
  const comm::capacity_plan plan = comm::plan_capacity(std::vector<segment>{{0, n}}, delta, 1.25);
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(plan.total);
  auto sides = pack_ranks(3, format, plan);
  // Rank 1's compress refuses its NaN (the type a compressor throws for it), packed as its failure.
  std::vector<float> bad = sides[1].gradient;
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  sparse_vector<float> sent;
  feedback::residual<float> residual(n);
  presets::sidco_e<> compressor;
  std::vector<std::vector<std::byte>> payloads{sides[0].payload, sides[1].payload, sides[2].payload};
  try {
    compressor.compress(bad, delta, sent, residual);
    FAIL("a NaN was compressed");
  } catch (const sidco::nonfinite_error& e) {
    CHECK(std::string(e.what()).find("non-finite") != std::string::npos);
    comm::pack_failure<float, std::uint32_t>(e, n, {3, 7, delta, comm::reduction::average}, format, payloads[1]);
  }
  CHECK(comm::header_of(payloads[1]).error == std::uint8_t(comm::error_kind::nonfinite));
  CHECK(comm::failed_for_nonfinite_input(views_of(payloads)));
  std::vector<float> dense(n, 5.0f);
  auto decode_throws_nonfinite = [&] {
    try {
      comm::decode<float, std::uint32_t>(views_of(payloads), format, std::span<float>(dense));
    } catch (const comm::nonfinite_exchange& e) {
      CHECK(std::string(e.what()).find("rank 1 failed") != std::string::npos);
      return true;
    } catch (const sidco::runtime_error&) {
    }
    return false;
  };
  CHECK(decode_throws_nonfinite());
  CHECK(dense == std::vector<float>(n, 5.0f));
  // Two ranks over- or underflowing alike: still only non-finite input.
  payloads[2] = payloads[1];
  CHECK(comm::failed_for_nonfinite_input(views_of(payloads)));
  CHECK(decode_throws_nonfinite());
  // Another failure beside it is a real error: a plain runtime_error, not something to skip.
  comm::pack_failure<float, std::uint32_t>(sidco::runtime_error("damaged state"), n,
                                           {3, 7, delta, comm::reduction::average}, format, payloads[2]);
  CHECK_FALSE(comm::failed_for_nonfinite_input(views_of(payloads)));
  CHECK_FALSE(decode_throws_nonfinite());
  CHECK(decode_all(payloads, format).error.find("rank 1 failed (1 later rank(s) failed too)") != std::string::npos);
  // No failure at all is not a non-finite failure either.
  payloads = {sides[0].payload, sides[1].payload, sides[2].payload};
  CHECK_FALSE(comm::failed_for_nonfinite_input(views_of(payloads)));
}

TEST_CASE("two-hop routes: every rank's traffic for every rank goes through one intermediate, O(sqrt P) peers each") {
  for (std::size_t ranks = 1; ranks <= 150; ranks += ranks < 40 ? 1 : 7) {
    const comm::grid_routes routes(ranks);
    INFO("P = ", ranks, ", width ", routes.width());
    std::size_t most_peers = 0;
    for (std::size_t s = 0; s < ranks; ++s) {
      const auto peers = routes.neighbours(s);
      const std::set<std::size_t> near(peers.begin(), peers.end());
      std::vector<int> reached(ranks, 0);
      std::size_t through = 0;  // intermediates s sends to
      for (std::size_t i = 0; i < ranks; ++i) {
        const auto destinations = routes.destinations(s, i);
        REQUIRE(std::is_sorted(destinations.begin(), destinations.end()));
        if (!destinations.empty() && i != s) {
          REQUIRE(near.count(i) == 1);  // one hop joins them
          ++through;
        }
        for (const std::size_t d : destinations) {
          ++reached[d];
          REQUIRE(routes.via(s, d) == i);
          const auto senders = routes.senders(i, d);
          REQUIRE(std::count(senders.begin(), senders.end(), s) == 1);
          if (i == d) continue;
          const auto next = routes.neighbours(d);
          REQUIRE(std::count(next.begin(), next.end(), i) == 1);
        }
      }
      for (std::size_t d = 0; d < ranks; ++d) REQUIRE(reached[d] == 1);  // exactly once
      // Every sender a phase-2 link names really goes through it.
      for (const std::size_t d : peers)
        for (const std::size_t from : routes.senders(s, d)) REQUIRE(routes.via(from, d) == s);
      most_peers = std::max(most_peers, peers.size());
      CHECK(through <= routes.width() + routes.rows());
    }
    CHECK(most_peers <= routes.width() + routes.rows() - 2);
    CHECK(routes.width() * routes.width() >= ranks);
    CHECK((routes.width() - 1) * (routes.width() - 1) < ranks);
  }
  const comm::grid_routes thousand(1024);
  CHECK(thousand.width() == 32);
  CHECK(thousand.neighbours(517).size() == 62);
}

namespace {

// Every rank's router runs one round of two hops, messages moved by hand: with exact
// lengths (MPI) or in zeroed buffers of the most each message can take (gloo). damage(phase,
// sender, receiver, message) may change a message in transit. Returns, per receiving rank,
// the frame each rank had for it, copied.
using hop_damage = std::function<void(int, std::size_t, std::size_t, std::vector<std::byte>&)>;
std::vector<std::vector<std::vector<std::byte>>> route_by_hand(
    std::size_t ranks, const std::vector<std::vector<std::vector<std::byte>>>& frames, bool personal, bool exact,
    const comm::wire_format& format, const hop_damage& damage = {}) {
  std::vector<comm::two_hop_router> routers;
  for (std::size_t r = 0; r < ranks; ++r) routers.emplace_back(ranks, r, comm::max_frame_bytes(format), exact);
  const auto failure = [](std::size_t sender, const char* why, std::vector<std::byte>& out) {
    comm::wire_format f = comm::format_for<float, std::uint32_t>(40);
    std::vector<std::byte> payload(f.bytes()), scratch;
    comm::append_failure_frame<float, std::uint32_t>(
        sidco::error(sidco::detail::message("rank ", sender, ": ", why)), 1000, {1, 2, 0.01, comm::reduction::average},
        f, scratch, out);
  };
  std::vector<std::vector<std::span<const std::byte>>> mine(ranks);
  for (std::size_t r = 0; r < ranks; ++r)
    for (const auto& f : frames[r]) mine[r].push_back(std::span<const std::byte>(f));
  // inboxes[phase][r][m]: what rank r receives from its m-th incoming peer.
  std::vector<std::vector<std::vector<std::byte>>> inbox(ranks);
  const auto deliver = [&](int phase, const std::vector<std::vector<comm::two_hop_router::outgoing>>& sent,
                           const auto& receives_of) {
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto receives = receives_of(routers[r]);
      inbox[r].assign(receives.size(), {});
      for (std::size_t m = 0; m < receives.size(); ++m) {
        const std::size_t from = receives[m].peer;
        const auto it = std::find_if(sent[from].begin(), sent[from].end(), [&](const auto& o) { return o.peer == r; });
        REQUIRE(it != sent[from].end());
        std::vector<std::byte> message(it->bytes.begin(), it->bytes.end());
        REQUIRE(message.size() <= receives[m].most);
        if (damage) damage(phase, from, r, message);
        if (!exact) message.resize(std::max(message.size(), receives[m].most), std::byte{0});
        inbox[r][m] = std::move(message);
      }
    }
  };
  const auto spans = [&](std::size_t r) {
    std::vector<std::span<const std::byte>> out;
    for (const auto& m : inbox[r]) out.push_back(std::span<const std::byte>(m));
    return out;
  };
  const comm::frame_kind kind{};
  std::vector<std::vector<comm::two_hop_router::outgoing>> sent(ranks);
  for (std::size_t r = 0; r < ranks; ++r) sent[r] = routers[r].first(mine[r], personal, 0x5eed, true);
  deliver(1, sent, [](const comm::two_hop_router& router) { return router.first_receives(); });
  std::vector<std::vector<std::vector<std::byte>>> first(ranks);  // phase 1's messages stay alive
  for (std::size_t r = 0; r < ranks; ++r) {
    first[r] = inbox[r];
    std::vector<std::span<const std::byte>> received;
    for (const auto& m : first[r]) received.push_back(std::span<const std::byte>(m));
    sent[r] = routers[r].second(received, format, kind, failure);
  }
  deliver(2, sent, [](const comm::two_hop_router& router) { return router.second_receives(); });
  std::vector<std::vector<std::vector<std::byte>>> out(ranks);
  for (std::size_t r = 0; r < ranks; ++r)
    for (const auto f : routers[r].finish(spans(r), format, kind, failure)) out[r].emplace_back(f.begin(), f.end());
  return out;
}

}  // namespace

TEST_CASE("two-hop router: every rank's frame reaches every rank, in exact-length messages or zero-padded buffers; "
          "damage becomes failure frames naming the sender") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(40);
  const comm::wire_fields fields{1, 2, 0.01, comm::reduction::average};
  for (const std::size_t ranks : {1, 2, 3, 5, 7, 10}) {
    // frames[s][d]: rank s's payload for d, a few entries that say s and d.
    std::vector<std::vector<std::vector<std::byte>>> frames(ranks, std::vector<std::vector<std::byte>>(ranks));
    std::vector<std::byte> payload(format.bytes());
    for (std::size_t s = 0; s < ranks; ++s)
      for (std::size_t d = 0; d < ranks; ++d) {
        std::vector<std::uint32_t> indices;
        std::vector<float> values;
        for (std::size_t j = 0; j < 1 + (s * 7 + d) % 3; ++j) {
          indices.push_back(std::uint32_t(100 * j + 10 * s + d));
          values.push_back(float(s) - 0.5f * float(d));
        }
        comm::pack<float, std::uint32_t>(indices, values, 1000, 0, fields, format, payload);
        comm::append_frame<float, std::uint32_t>(payload, format, {}, frames[s][d]);
      }
    for (const bool exact : {true, false})
      for (const bool personal : {true, false}) {
        INFO("P = ", ranks, exact ? ", exact lengths" : ", zero-padded", personal ? ", personal" : ", one for all");
        const auto out = route_by_hand(ranks, frames, personal, exact, format);
        for (std::size_t d = 0; d < ranks; ++d)
          for (std::size_t s = 0; s < ranks; ++s) REQUIRE(out[d][s] == frames[s][personal ? d : 0]);
      }
    if (ranks < 5) continue;
    // Damage in phase 1 on a link from rank 1 to an intermediate: the frames 1 sent through
    // it arrive as failures naming rank 1; every other frame as sent.
    const comm::grid_routes routes(ranks);
    std::size_t via = 1;
    for (std::size_t d = 0; d < ranks && via == 1; ++d)
      if (routes.via(1, d) != d) via = routes.via(1, d);
    REQUIRE(via != 1);
    const auto failed = [&](const std::vector<std::byte>& frame) {
      std::vector<std::byte> back(format.bytes());
      comm::read_frame<float, std::uint32_t>(frame, comm::detail::header_for<float, std::uint32_t>(fields, 1000, format),
                                             format, {}, back);
      const comm::wire_header h = comm::header_of(back);
      return h.status != std::uint8_t(comm::wire_status::ok);
    };
    const auto message_of = [&](const std::vector<std::byte>& frame) {
      std::vector<std::byte> back(format.bytes());
      comm::read_frame<float, std::uint32_t>(frame, comm::detail::header_for<float, std::uint32_t>(fields, 1000, format),
                                             format, {}, back);
      return std::string(reinterpret_cast<const char*>(back.data()) + sizeof(comm::wire_header));
    };
    struct damage_case {
      const char* what;
      bool exact;
      std::function<void(std::vector<std::byte>&)> change;
      const char* why;
    };
    const std::vector<damage_case> cases{
        {"a byte past the frames (zero-padded)", false, [](auto& m) { m.push_back(std::byte{1}); }, "longer than its frames"},
        {"a zero past the frames (exact lengths)", true, [](auto& m) { m.push_back(std::byte{0}); }, "longer than its frames"},
        {"cut short", true, [](auto& m) { m.pop_back(); }, "cut short"},
        // (Zero-padded, a message cut short may read as whole: its missing bytes were zeros
        // or read as codes. That transport's own framing delivers whole messages.)
        {"another digest", false, [](auto& m) { m[0] ^= std::byte{1}; }, "another tensor, step"},
    };
    for (const auto& c : cases) {
      INFO("P = ", ranks, ": ", c.what, ", s = 1, via ", via);
      const auto out = route_by_hand(ranks, frames, true, c.exact, format,
                                     [&](int phase, std::size_t from, std::size_t to, std::vector<std::byte>& m) {
                                       if (phase == 1 && from == 1 && to == via) c.change(m);
                                     });
      for (std::size_t d = 0; d < ranks; ++d)
        for (std::size_t s = 0; s < ranks; ++s) {
          const bool hit = s == 1 && routes.via(1, d) == via;
          INFO("d = ", d, " s = ", s);
          REQUIRE(failed(out[d][s]) == hit);
          if (hit) {
            const std::string message = message_of(out[d][s]);
            CHECK(message.find("rank 1: ") != std::string::npos);
            CHECK(message.find(c.why) != std::string::npos);
          } else {
            REQUIRE(out[d][s] == frames[s][d]);
          }
        }
    }
  }
}

TEST_CASE("frames: the compact coding's blocks send values narrowed, losslessly, or whole when a value does not narrow") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(40);
  const comm::wire_fields fields{9, 12, 0.01, comm::reduction::average};
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>(fields, 1000, format);
  const std::vector<std::uint32_t> indices{3, 17, 400, 999};
  const comm::frame_kind narrow{false, true};
  std::vector<std::byte> payload(format.bytes()), back(format.bytes());
  // bfloat16 values (as the reduce core's pack rounds them): 2 bytes each, read back exact,
  // subnormals and the largest finite included.
  const std::vector<float> rounded{1.5f, -2.0f, std::bit_cast<float>(0x00010000u),  // bfloat16's least subnormal
                                   float(sidco::bfloat16(std::numeric_limits<float>::max()))};
  comm::pack<float, std::uint32_t>(indices, rounded, 1000, 0, fields, format, payload);
  std::vector<std::byte> frame;
  comm::append_frame<float, std::uint32_t>(payload, format, narrow, frame);
  CHECK(frame.size() == 1 + indices.size() * 2 + 6);
  CHECK(comm::frame_length(frame, format, narrow) == frame.size());
  CHECK(comm::frame_length(frame, format, comm::frame_kind{}) == 0);  // read at full width: runs past the end
  comm::read_frame<float, std::uint32_t>(frame, header, format, narrow, back);
  CHECK(back == payload);
  // A value bfloat16 cannot hold: the payload travels whole, and reads back as it was.
  const std::vector<float> unrounded{1.5f, -2.0f, 3.1415927f, 1e-30f};
  comm::pack<float, std::uint32_t>(indices, unrounded, 1000, 0, fields, format, payload);
  frame.clear();
  comm::append_frame<float, std::uint32_t>(payload, format, narrow, frame);
  CHECK(frame.size() == 2 + comm::used_bytes(payload, format));
  CHECK(comm::frame_length(frame, format, narrow) == frame.size());
  std::fill(back.begin(), back.end(), std::byte{1});
  comm::read_frame<float, std::uint32_t>(frame, header, format, narrow, back);
  CHECK(back == payload);
  // Doubles narrow to floats.
  const comm::wire_format wide = comm::format_for<double, std::uint32_t>(40);
  std::vector<std::byte> doubles(wide.bytes()), doubles_back(wide.bytes());
  comm::pack<double, std::uint32_t>(indices, std::vector<double>{0.5, -0.25, double(1e-30f), 3.0}, 1000, 0, fields, wide,
                                    doubles);
  frame.clear();
  comm::append_frame<double, std::uint32_t>(doubles, wide, narrow, frame);
  CHECK(frame.size() == 1 + indices.size() * 4 + 6);
  comm::read_frame<double, std::uint32_t>(frame, comm::detail::header_for<double, std::uint32_t>(fields, 1000, wide),
                                          wide, narrow, doubles_back);
  CHECK(doubles_back == doubles);
}

TEST_CASE("frames: compact8's values travel a byte each after their scale, zero as its own code, losslessly; a value "
          "without a code sends the frame whole; a scale outside the type's range arrives as a failure") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(40);
  const comm::wire_fields fields{9, 12, 0.01, comm::reduction::average};
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>(fields, 1000, format);
  const std::vector<std::uint32_t> indices{3, 17, 400, 999};
  const comm::frame_kind bytes = comm::frame_kind_for(true, comm::entry_coding::compact8);
  CHECK(bytes.byte_values);
  CHECK(bytes.with_trimmed);
  CHECK_FALSE(bytes.narrow_values);
  std::vector<std::byte> payload(format.bytes()), back(format.bytes());
  // 4 significant bits within 16 binades of the largest (scale 2^3), and an owner's zero update.
  const std::vector<float> rounded{9.0f, -0.0009765625f * 1.5f, 0.0f, -15.0f};
  comm::pack<float, std::uint32_t>(indices, rounded, 1000, 2, fields, format, payload);
  std::vector<std::byte> frame;
  comm::append_frame<float, std::uint32_t>(payload, format, bytes, frame);
  // count, trimmed, the scale (zigzag 3: 6), 4 codes, the gaps 3, 13, 382, 598.
  CHECK(frame.size() == 1 + 1 + 1 + 4 + 1 + 1 + 2 + 2);
  CHECK(std::uint8_t(frame[2]) == 6);
  CHECK(std::uint8_t(frame[5]) == 0x80);  // zero's code
  CHECK(comm::frame_length(frame, format, bytes) == frame.size());
  comm::read_frame<float, std::uint32_t>(frame, header, format, bytes, back);
  CHECK(back == payload);
  // A value with no code (more bits than 4; a value below the scale's range): whole.
  for (const float odd : {3.1415927f, 1e-9f, std::numeric_limits<float>::infinity(), -0.0f}) {
    CAPTURE(odd);
    const std::vector<float> values{9.0f, odd, 1.0f, 2.0f};
    comm::pack<float, std::uint32_t>(indices, values, 1000, 0, fields, format, payload);
    frame.clear();
    comm::append_frame<float, std::uint32_t>(payload, format, bytes, frame);
    CHECK(frame.size() == 2 + comm::used_bytes(payload, format));
    std::fill(back.begin(), back.end(), std::byte{1});
    comm::read_frame<float, std::uint32_t>(frame, header, format, bytes, back);
    CHECK(back == payload);
  }
  // 16-bit and 64-bit values alike.
  const comm::wire_format half = comm::format_for<sidco::bfloat16, std::uint32_t>(40);
  std::vector<std::byte> halves(half.bytes()), halves_back(half.bytes());
  using sidco::bfloat16;
  const std::vector<bfloat16> half_values{bfloat16(0.5f), bfloat16(-0.25f), bfloat16(0.0f), bfloat16(0.375f)};
  comm::pack<bfloat16, std::uint32_t>(indices, half_values, 1000, 0, fields, half, halves);
  frame.clear();
  comm::append_frame<bfloat16, std::uint32_t>(halves, half, bytes, frame);
  CHECK(frame.size() == 1 + 1 + 1 + 4 + 6);
  const auto half_header = comm::detail::header_for<bfloat16, std::uint32_t>(fields, 1000, half);
  comm::read_frame<bfloat16, std::uint32_t>(frame, half_header, half, bytes, halves_back);
  CHECK(halves_back == halves);
  // A scale beyond float's (2^200, damaged in transit): the payload reads as a failure naming it.
  frame.clear();
  comm::pack<float, std::uint32_t>(indices, rounded, 1000, 2, fields, format, payload);
  comm::append_frame<float, std::uint32_t>(payload, format, bytes, frame);
  std::vector<std::byte> damaged(frame.begin(), frame.begin() + 2);
  comm::detail::append_code(damaged, comm::detail::zigzag(200));
  damaged.insert(damaged.end(), frame.begin() + 3, frame.end());
  REQUIRE(comm::frame_length(damaged, format, bytes) == damaged.size());
  comm::read_frame<float, std::uint32_t>(damaged, header, format, bytes, back);
  CHECK(comm::header_of(back).status != std::uint8_t(comm::wire_status::ok));
  const std::vector<std::span<const std::byte>> one{back};
  CHECK_THROWS_WITH_AS((comm::agree<float, std::uint32_t>(one, format)), doctest::Contains("scale 2^200"),
                       sidco::runtime_error);
}

TEST_CASE("frames: compact8's float codes from the bits are byte_scale's codes, bit for bit, whatever the values") {
  static_assert(comm::byte_value_binades == 16 && comm::byte_value_mantissa_bits == 3);
  std::mt19937_64 rng(88);
  std::size_t coded = 0, whole = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const std::size_t count = 1 + rng() % 12;
    const int top = int(rng() % 280) - 150;  // subnormal to the largest binades
    std::vector<float> values(count);
    for (auto& v : values) {
      // Mostly 4-bit values within the 16 binades below top; sometimes one that is not.
      const int kind = int(rng() % 40);
      const float four = std::ldexp(float(8 + rng() % 8), top - int(rng() % 17) - 3) * (rng() % 2 ? -1.0f : 1.0f);
      v = kind == 0   ? 0.0f
          : kind == 1 ? -0.0f
          : kind == 2 ? four * 1.0001f
          : kind == 3 ? std::numeric_limits<float>::infinity()
          : kind == 4 ? std::bit_cast<float>(std::uint32_t(rng()))
                      : four;
    }
    std::vector<std::byte> fast, by_scale;
    std::vector<float> scratch;
    const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
    const bool fast_ok = comm::detail::append_byte_values<float>(bytes, count, scratch, fast);
    const bool scale_ok = comm::detail::append_byte_values_by_scale<float>(bytes, count, scratch, by_scale);
    REQUIRE(fast_ok == scale_ok);
    if (fast_ok) REQUIRE(fast == by_scale);
    (fast_ok ? coded : whole) += 1;
  }
  INFO(coded, " coded, ", whole, " whole");
  CHECK(coded > 5000);  // or the codes went untested
  CHECK(whole > 5000);  // or the refusals did
}

TEST_CASE("frames: gap codes read back as written, cut-short and overlong ones refused; narrowing to bfloat16 "
          "equals bfloat16(v) and back") {
  std::mt19937_64 rng(56);
  std::vector<std::uint64_t> values{0, 1, 127, 128, 16383, 16384, std::numeric_limits<std::uint64_t>::max()};
  for (unsigned bits = 1; bits < 64; ++bits) values.push_back((std::uint64_t(1) << bits) - 1 + rng() % 2);
  for (int i = 0; i < 2000; ++i) values.push_back(rng() >> (rng() % 64));
  for (const std::uint64_t value : values) {
    // 7 bits a byte: the code's length follows from the value alone.
    std::size_t length = 1;
    for (std::uint64_t rest = value >> 7; rest != 0; rest >>= 7) ++length;
    std::vector<std::byte> bytes(3 + length + 8);
    for (auto& b : bytes) b = std::byte(rng());  // what lies around the code must not matter
    REQUIRE(std::size_t(comm::detail::put_varint(value, bytes.data() + 3) - bytes.data()) == 3 + length);
    for (std::size_t end = 3; end <= bytes.size(); ++end) {  // buffers that end inside, at and past the code
      std::size_t at = 3;
      std::uint64_t read = 0;
      const bool ok = comm::detail::take_code(std::span<const std::byte>(bytes).first(end), at, read);
      REQUIRE(ok == (end >= 3 + length));
      if (ok) REQUIRE((read == value && at == 3 + length));
    }
  }
  // Longer than a 64-bit number's code (ten bytes): an eleventh byte is refused, even a stop.
  std::vector<std::byte> overlong(11, std::byte{0x80});
  overlong.back() = std::byte{0x01};
  std::size_t at = 0;
  std::uint64_t read = 0;
  CHECK_FALSE(comm::detail::take_code(overlong, at, read));
  // Narrowing float to bfloat16: the same verdict and bits as bfloat16(v) and back, per value.
  std::vector<std::uint32_t> patterns{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                      0x7f810000u /* signalling NaN, low half zero: quieted, so inexact */,
                                      0x7fc10000u, 0x7fc00001u, 0x00010000u, 0x00008000u, 0x3f800000u, 0x3f800001u,
                                      0x7f7f0000u, 0x7f7fffffu};
  for (int i = 0; i < 4000; ++i) patterns.push_back(std::uint32_t(rng()) & (i % 2 ? 0xffff0000u : 0xffffffffu));
  for (const std::uint32_t bits : patterns)
    for (std::size_t count : {std::size_t(1), std::size_t(5)}) {  // the value alone, and among rounded ones
      std::vector<std::uint32_t> run(count, 0x40400000u);  // 3.0f: exact in bfloat16
      run[count / 2] = bits;
      std::vector<std::uint16_t> out(count, 0);
      const bool exact = comm::detail::narrow_exactly<float>(reinterpret_cast<const std::byte*>(run.data()), count,
                                                             reinterpret_cast<std::byte*>(out.data()));
      bool expected = true;
      std::vector<std::uint16_t> want(count);
      for (std::size_t j = 0; j < count; ++j) {
        const float v = std::bit_cast<float>(run[j]);
        const sidco::bfloat16 narrowed(v);
        expected = expected && std::bit_cast<std::uint32_t>(float(narrowed)) == run[j];
        want[j] = narrowed.bits;
      }
      REQUIRE(exact == expected);
      if (expected) REQUIRE(out == want);
    }
}

TEST_CASE("frames: a payload as a count and its entries reads back as the payload; a failure travels whole") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(40);
  const comm::wire_fields fields{9, 12, 0.01, comm::reduction::average};
  const std::vector<std::uint32_t> indices{3, 17, 400, 999};
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 1e-30f};
  std::vector<std::byte> payload(format.bytes()), back(format.bytes());
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>(fields, 1000, format);
  for (const bool with_trimmed : {false, true}) {
    comm::pack<float, std::uint32_t>(indices, values, 1000, with_trimmed ? 77 : 0, fields, format, payload);
    const comm::frame_kind kind{with_trimmed, false};
    std::vector<std::byte> frame;
    comm::append_frame<float, std::uint32_t>(payload, format, kind, frame);
    // A byte for twice the count and one for 77; values as they are; gaps 3, 13, 382, 598
    // less one: 1, 1, 2, 2 bytes.
    CHECK(frame.size() == 1 + (with_trimmed ? 1 : 0) + indices.size() * 4 + 6);
    CHECK(comm::frame_length(frame, format, kind) == frame.size());
    comm::read_frame<float, std::uint32_t>(frame, header, format, kind, back);
    CHECK(back == payload);
    // Cut short, or a count over the capacity: not a frame.
    CHECK(comm::frame_length(std::span<const std::byte>(frame).first(frame.size() - 1), format, kind) == 0);
    std::vector<std::byte> over = frame;
    over[0] = std::byte(2 * 41);
    CHECK(comm::frame_length(over, format, kind) == 0);
    // A code that never ends: not a frame.
    std::vector<std::byte> endless(12, std::byte{0xff});
    CHECK(comm::frame_length(endless, format, kind) == 0);
  }
  // Counts and trimmed counts past one byte's code read back too.
  {
    const comm::wire_format wide = comm::format_for<float, std::uint32_t>(300);
    std::vector<std::uint32_t> many(200);
    std::vector<float> ones(200, 1.0f);
    for (std::size_t j = 0; j < many.size(); ++j) many[j] = std::uint32_t(5 * j);
    std::vector<std::byte> big(wide.bytes()), big_back(wide.bytes());
    comm::pack<float, std::uint32_t>(many, ones, 1000, 70000, fields, wide, big);
    std::vector<std::byte> frame;
    comm::append_frame<float, std::uint32_t>(big, wide, {true, false}, frame);
    CHECK(frame.size() == 2 + 3 + 200 * 4 + 200);  // 400 in 2 bytes, 70,000 in 3, gaps of 4 in 1
    CHECK(comm::frame_length(frame, wide, {true, false}) == frame.size());
    comm::read_frame<float, std::uint32_t>(frame, comm::detail::header_for<float, std::uint32_t>(fields, 1000, wide), wide,
                                           {true, false}, big_back);
    CHECK(big_back == big);
  }
  // An empty payload: a byte.
  comm::pack<float, std::uint32_t>({}, {}, 1000, 0, fields, format, payload);
  std::vector<std::byte> empty;
  comm::append_frame<float, std::uint32_t>(payload, format, {}, empty);
  CHECK(empty.size() == 1);
  // A failure: its header and message, byte for byte.
  comm::pack_failure<float, std::uint32_t>(sidco::error("sidco: the reason"), 1000, fields, format, payload);
  std::vector<std::byte> failure;
  comm::append_frame<float, std::uint32_t>(payload, format, {true, false}, failure);
  CHECK(failure.size() == 2 + 64 + std::string("sidco: the reason").size());  // 2·81 + 1 in 2 bytes
  CHECK(comm::frame_length(failure, format, {true, false}) == failure.size());
  CHECK(comm::frame_length(failure, format, {false, true}) == failure.size());
  std::fill(back.begin(), back.end(), std::byte{1});
  comm::read_frame<float, std::uint32_t>(failure, header, format, {true, false}, back);
  CHECK(back == payload);
  // The digest names the step's fields: any one of them changed changes it.
  const auto digest = [&](comm::wire_fields f, std::size_t size) {
    return comm::fields_digest<float, std::uint32_t>(f, size, format);
  };
  const std::uint64_t base = digest(fields, 1000);
  CHECK(digest(fields, 1000) == base);
  CHECK(digest({10, 12, 0.01, comm::reduction::average}, 1000) != base);
  CHECK(digest({9, 13, 0.01, comm::reduction::average}, 1000) != base);
  CHECK(digest({9, 12, 0.02, comm::reduction::average}, 1000) != base);
  CHECK(digest({9, 12, 0.01, comm::reduction::sum}, 1000) != base);
  CHECK(digest(fields, 1001) != base);
  CHECK(comm::fields_digest<double, std::uint32_t>(fields, 1000, comm::format_for<double, std::uint32_t>(40)) != base);
}

TEST_CASE("frames: a round's messages (append_messages, read_messages) read back as its payloads; one cut short, "
          "overlong or at another digest becomes a failure naming its sender") {
  const comm::wire_format format = comm::format_for<float, std::uint32_t>(40);
  const comm::wire_fields fields{9, 12, 0.01, comm::reduction::average};
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>(fields, 1000, format);
  const std::uint64_t digest = comm::fields_digest<float, std::uint32_t>(fields, 1000, format);
  constexpr std::size_t ranks = 4;
  std::vector<std::byte> payloads(ranks * format.bytes());
  const auto payload_of = [&](std::size_t r) {
    return std::span<const std::byte>(payloads).subspan(r * format.bytes(), format.bytes());
  };
  for (std::size_t r = 0; r < ranks; ++r) {  // rank r's payload: r + 1 entries, a failure at rank 2
    const auto mine = std::span<std::byte>(payloads).subspan(r * format.bytes(), format.bytes());
    if (r == 2) {
      comm::pack_failure<float, std::uint32_t>(sidco::error("sidco: rank 2's reason"), 1000, fields, format, mine);
      continue;
    }
    std::vector<std::uint32_t> indices;
    std::vector<float> values;
    for (std::size_t j = 0; j <= r; ++j) {
      indices.push_back(std::uint32_t(100 * j + r));
      values.push_back(0.5f + float(j));
    }
    comm::pack<float, std::uint32_t>(indices, values, 1000, 0, fields, format, mine);
  }
  for (const bool with_digest : {true, false}) {
    const std::uint64_t* lead = with_digest ? &digest : nullptr;
    std::vector<std::byte> out{std::byte{7}};  // appended after what is there
    const auto sizes = comm::append_messages<float, std::uint32_t>(payloads, ranks, format, {}, lead, out);
    REQUIRE(sizes.size() == ranks);
    std::vector<std::span<const std::byte>> messages;
    std::size_t at = 1;
    for (const std::size_t size : sizes) {  // each: as append_message writes it alone
      std::vector<std::byte> alone;
      comm::append_message<float, std::uint32_t>(payload_of(messages.size()), format, {}, lead, alone);
      messages.push_back(std::span<const std::byte>(out).subspan(at, size));
      REQUIRE(std::ranges::equal(messages.back(), alone));
      at += size;
    }
    CHECK(at == out.size());
    std::vector<std::byte> back(ranks * format.bytes(), std::byte{1});
    const auto slot = [&](std::size_t r) {
      return std::span<std::byte>(back).subspan(r * format.bytes(), format.bytes());
    };
    comm::read_messages<float, std::uint32_t>(messages, header, format, {}, lead, slot);
    CHECK(back == payloads);
    // Rank 1's message cut short, rank 3's one byte longer: failures naming them; the rest as sent.
    std::vector<std::byte> longer(messages[3].begin(), messages[3].end());
    longer.push_back(std::byte{5});
    std::vector<std::span<const std::byte>> damaged = messages;
    damaged[1] = messages[1].first(messages[1].size() - 1);
    damaged[3] = longer;
    comm::read_messages<float, std::uint32_t>(damaged, header, format, {}, lead, slot);
    for (const std::size_t r : {0, 2}) CHECK(std::ranges::equal(slot(r), payload_of(r)));
    for (const std::size_t r : {1, 3}) {
      const comm::wire_header h = comm::header_of(slot(r));
      REQUIRE(h.status != std::uint8_t(comm::wire_status::ok));
      const std::string text(reinterpret_cast<const char*>(slot(r).data()) + sizeof h, std::size_t(h.count));
      CHECK(text.find("the message from rank " + std::to_string(r)) != std::string::npos);
    }
  }
  // Messages led by another step's digest: every one a failure naming its sender.
  std::vector<std::byte> out;
  const std::uint64_t other = comm::fields_digest<float, std::uint32_t>({9, 13, 0.01, comm::reduction::average}, 1000,
                                                                        format);
  const auto sizes = comm::append_messages<float, std::uint32_t>(payloads, ranks, format, {}, &other, out);
  std::vector<std::span<const std::byte>> messages;
  for (std::size_t r = 0, at = 0; r < ranks; at += sizes[r++])
    messages.push_back(std::span<const std::byte>(out).subspan(at, sizes[r]));
  std::vector<std::byte> back(ranks * format.bytes());
  comm::read_messages<float, std::uint32_t>(messages, header, format, {}, &digest, [&](std::size_t r) {
    return std::span<std::byte>(back).subspan(r * format.bytes(), format.bytes());
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto mine = std::span<const std::byte>(back).subspan(r * format.bytes(), format.bytes());
    const comm::wire_header h = comm::header_of(mine);
    REQUIRE(h.status != std::uint8_t(comm::wire_status::ok));
    const std::string text(reinterpret_cast<const char*>(mine.data()) + sizeof h, std::size_t(h.count));
    CHECK(text.find("the message from rank " + std::to_string(r) + " held another tensor, step") != std::string::npos);
  }
}

}  // namespace wire_test
