// The compact entry coding (comm/compact.hpp) through the all-gather core, without a
// network: ranks simulated in one process, their payloads routed as an all-gather routes
// them. What narrowing rounds off stays in each rank's residual, bit for bit; a compact
// exchange gives the bits a plain one gives for the values it sent; damage is refused alike.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/compact.hpp>
#include <sidco/comm/reduce/carry.hpp>
#include <sidco/comm/reduce/core.hpp>
#include <sidco/comm/reduce/frames.hpp>
#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/comm/setup.hpp>
#include <sidco/sidco.hpp>

#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace compact_test {

using namespace sidco;

namespace {

using views = std::vector<std::span<const std::byte>>;

views views_of(const std::vector<std::vector<std::byte>>& payloads) { return {payloads.begin(), payloads.end()}; }

// A residual kept as a map, for dense spaces too large to hold.
template <class T>
struct map_residual {
  std::map<std::uint64_t, T> values;
  template <class Index>
  void give_back(Index index, T value) {
    values[std::uint64_t(index)] = value;
  }
};

// A host residual that counts how often a step gives each index back: a device residual's
// writer (backend/cuda/entries.cuh) takes each index once a write.
struct counted_residual {
  comm::host_residual<float> residual;
  std::map<std::uint64_t, int> times;
  template <class Index>
  void give_back(Index index, float value) {
    residual.give_back(index, value);
    ++times[std::uint64_t(index)];
  }
  // The first index given back more than once ("" when none was).
  std::string repeated() const {
    for (const auto& [index, count] : times)
      if (count > 1) return "index " + std::to_string(index) + " given back " + std::to_string(count) + " times";
    return "";
  }
};

// One rank's step: its gradient and old residual, the residual after compress and encode,
// what it sent (as encoded: rounded), its payload.
template <class T>
struct rank_step {
  std::vector<T> gradient, old_residual;
  feedback::residual<T> residual;
  sparse_vector<T> sent;
  std::vector<std::byte> payload;
};

// Each rank compresses a real gradient (rank r: file r, scaled by its own noise) with
// SIDCo-E and error feedback and encodes it with core.
template <class T>
std::vector<rank_step<T>> encode_ranks(std::size_t ranks, comm::allgather_core<T>& core, double delta,
                                       std::size_t size) {
  std::vector<rank_step<T>> steps;
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto file = test::gradient_files()[r % test::gradient_files().size()];
    const auto g = test::load_gradient<float>(file);
    rank_step<T> s{{}, {}, feedback::residual<T>(size), sparse_vector<T>(size), {}};
    std::mt19937_64 rng(40 + r);
    std::normal_distribution<float> noise(1.0f, 0.3f), small(0.0f, 1e-4f);
    for (std::size_t i = 0; i < size; ++i) {
      s.gradient.push_back(T(g[i % g.size()] * noise(rng)));
      s.old_residual.push_back(T(small(rng)));
      s.residual.values()[i] = s.old_residual.back();
    }
    presets::sidco_e<> compressor;
    compressor.compress(std::span<const T>(s.gradient), delta, s.sent, s.residual);
    s.payload.resize(core.format().bytes());
    comm::host_residual<T> sink{s.residual.values()};
    core.encode(s.sent, sink, {2, 9, delta, comm::reduction::average}, s.payload);
    steps.push_back(std::move(s));
  }
  return steps;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("compact: each rank keeps what rounding took, bit for bit; the sum is the plain one of what it sent",
                   T, float, double) {
  constexpr std::size_t size = 200000;
  std::map<std::pair<double, std::size_t>, std::size_t> sent_by_compact;  // (delta, ranks) -> entries sent
  for (const auto coding : {comm::entry_coding::compact, comm::entry_coding::compact8})
  for (const double delta : {0.01, 0.1}) {
    for (const std::size_t ranks : {std::size_t(1), std::size_t(3), std::size_t(6)}) {
      const int coding_number = int(coding);
      CAPTURE(coding_number);
      CAPTURE(delta);
      CAPTURE(ranks);
      const std::vector<segment> layout{{0, size}};
      comm::allgather_core<T> compact(layout, delta, 1.25, coding);
      comm::allgather_core<T> plain(layout, delta, 1.25);
      REQUIRE(compact.format().coding == coding);
      auto steps = encode_ranks<T>(ranks, compact, delta, size);
      // Conservation: residual + sent = gradient + old residual, exactly, at every index.
      std::size_t sent = 0, index_code = 0;
      for (const auto& s : steps) {
        std::vector<T> applied(size, T(0));
        const auto scale = comm::byte_scale<T>::of(s.sent.values());
        for (std::size_t j = 0; j < s.sent.size(); ++j) {
          applied[s.sent.indices()[j]] = s.sent.values()[j];
          // What went on the wire is a value of the narrow type (compact8: a code on the
          // payload's scale): widening it loses nothing.
          using N = comm::compact_value_t<T>;
          std::uint8_t code;
          T rounded;
          if (coding == comm::entry_coding::compact)
            REQUIRE(same_bits(T(N(s.sent.values()[j])), s.sent.values()[j]));
          else
            REQUIRE((scale.encode(s.sent.values()[j], code, rounded) && same_bits(rounded, s.sent.values()[j])));
        }
        for (std::size_t i = 0; i < size; ++i)
          REQUIRE(same_bits(T(s.residual.values()[i] + applied[i]), T(s.gradient[i] + s.old_residual[i])));
        sent += s.sent.size();
        const auto [code, bytes] = comm::detail::shorter_index_code<std::uint32_t>(s.sent.indices(), size);
        index_code += bytes;
        // The payload names the code its indices were written in: the shorter one.
        CHECK(comm::header_of(s.payload).index_code == std::uint8_t(code));
        CHECK(bytes <= comm::detail::gap_code_bytes<std::uint32_t>(s.sent.indices()));
        CHECK(bytes <= comm::detail::elias_fano_bytes(s.sent.size(), size));
        REQUIRE(s.sent.size() > 0);
      }
      // On real gradients the index code takes at most 1.5 bytes an entry at 1%; at 10%,
      // Elias-Fano's 5.25 bits (L = 3: 4 bits, and N / 8 unary bits over about N / 10 entries).
      const double per_entry = double(index_code) / double(sent);
      MESSAGE("delta ", delta, ": index code ", per_entry, " bytes per entry");
      CHECK(per_entry <= (delta < 0.05 ? 1.5 : 0.7));
      // Half the plain payload's bytes (+ the header, which both carry); compact8 holds
      // half the compact values' bytes (float: 1 where 2) and the scale.
      CHECK(compact.format().bytes() - 64 <= (plain.format().bytes() - 64) / 2 + 8);
      if (coding == comm::entry_coding::compact8) {
        const auto half = comm::compact_format_for<T, std::uint32_t>(compact.format().capacity, size);
        CHECK(compact.format().bytes() - 64 <=
              half.bytes() - 64 - compact.format().capacity * (half.value_bytes - 1) + 16);
        // On real gradients rounding gives back (whole) almost none of the selection: its
        // values lie within the 16 binades below its largest. (The same selections as the
        // compact coding's run: what either trims beyond it is what rounding gave back.)
        const std::size_t compact_sent = sent_by_compact.at({delta, ranks});
        MESSAGE("compact8: ", compact_sent - sent, " of ", compact_sent, " entries below the scale's range");
        CHECK(sent <= compact_sent);
        CHECK(double(compact_sent - sent) <= 0.001 * double(compact_sent));
      } else {
        sent_by_compact[{delta, ranks}] = sent;
      }
      // The compact decode gives the bits the plain one gives for the same (rounded) entries.
      std::vector<std::vector<std::byte>> compact_payloads, plain_payloads;
      for (auto& s : steps) {
        compact_payloads.push_back(s.payload);
        plain_payloads.emplace_back(plain.format().bytes());
        comm::pack(s.sent, 0, {2, 9, delta, comm::reduction::average}, plain.format(), plain_payloads.back());
      }
      std::vector<T> from_compact(size, T(-1)), from_plain(size, T(-2));
      comm::host_residual<T> none;
      const auto report = compact.decode(views_of(compact_payloads), std::span<T>(from_compact), none);
      comm::decode<T, std::uint32_t>(views_of(plain_payloads), plain.format(), std::span<T>(from_plain));
      CHECK(report.entries == sent);
      CHECK(report.bytes == compact.format().bytes());
      REQUIRE(std::memcmp(from_compact.data(), from_plain.data(), size * sizeof(T)) == 0);
    }
  }
}

TEST_CASE("compact, compact8: a failed step gives back the values before rounding; every rank raises the same "
          "error") {
  constexpr std::size_t size = 50000;
  const double delta = 0.01;
  for (const auto coding : {comm::entry_coding::compact, comm::entry_coding::compact8}) {
    comm::allgather_core<float> core({{0, size}}, delta, 1.25, coding);
    auto steps = encode_ranks<float>(3, core, delta, size);
    // Rank 1 failed (its compress threw): the others' payloads are fine.
    core.encode_failure(sidco::error("compress: the gradient is on fire"), {2, 9, delta, comm::reduction::average},
                        steps[1].payload);
    std::vector<std::vector<std::byte>> payloads;
    for (const auto& s : steps) payloads.push_back(s.payload);
    // Each rank decodes with its own core (rank 0's and 2's sent entries are in theirs).
    for (const std::size_t r : {std::size_t(0), std::size_t(2)}) {
      comm::allgather_core<float> own({{0, size}}, delta, 1.25, coding);
      auto again = encode_ranks<float>(r + 1, own, delta, size);  // this core's packed_ is rank r's
      auto& mine = again[r];
      std::vector<float> dense(size, 7.0f);
      comm::host_residual<float> sink{mine.residual.values()};
      std::string error;
      try {
        own.decode(views_of(payloads), std::span<float>(dense), sink);
      } catch (const sidco::runtime_error& e) {
        error = e.what();
      }
      CHECK(error == "sidco: exchange (tag 2, step 9): rank 1 failed: compress: the gradient is on fire");
      // Given back whole: residual = gradient + old residual, bit for bit (no rounding left).
      for (std::size_t i = 0; i < size; ++i)
        REQUIRE(same_bits(mine.residual.values()[i], float(mine.gradient[i] + mine.old_residual[i])));
      CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 7.0f; }));
    }
  }
}

TEST_CASE("compact: the all-gather core gives each index back once a call (a transport writes after each), what "
          "rounding drops not again") {
  constexpr std::size_t size = 20000;
  const double delta = 0.01;
  sparse_vector<float> original(size);
  for (std::uint32_t j = 0; j < 150; ++j) original.push_back(3 + 97 * j, 0.1f + 0.0123f * float(j));
  original.value_data()[10] = std::numeric_limits<float>::denorm_min();  // rounds to 0 in bfloat16
  original.value_data()[20] = std::numeric_limits<float>::max();         // rounds past bfloat16's range
  for (const bool fail : {false, true}) {
    CAPTURE(fail);
    comm::allgather_core<float> core({{0, size}}, delta, 1.25, comm::entry_coding::compact), other = core;
    std::vector<float> residual(size, 0.0f);
    counted_residual sink{{residual}, {}};
    std::vector<std::vector<std::byte>> payloads(2, std::vector<std::byte>(core.format().bytes()));
    auto sent = original;
    CHECK(core.encode(sent, sink, {1, 4, delta, comm::reduction::sum}, payloads[0]) == 2);
    CHECK(sink.times.size() == original.size());  // kept: what rounding left off; dropped: whole
    CHECK(sink.repeated() == "");
    sink.times.clear();
    if (fail)
      other.encode_failure(sidco::error("compress: out of memory"), {1, 4, delta, comm::reduction::sum}, payloads[1]);
    else
      payloads[1] = payloads[0];  // rank 1 sent the same entries
    std::vector<float> dense(size, 0.0f);
    if (fail) CHECK_THROWS_AS(core.decode(views_of(payloads), std::span<float>(dense), sink), sidco::runtime_error);
    else core.decode(views_of(payloads), std::span<float>(dense), sink);
    CHECK(sink.times.size() == (fail ? original.size() - 2 : 0));  // a failed step: what it sent, whole
    CHECK(sink.repeated() == "");
    // Per index, bitwise: what the residual holds + what this rank's payload carried = what it sent.
    for (std::size_t j = 0; j < original.size(); ++j) {
      const std::uint32_t i = original.indices()[j];
      const float carried = fail ? 0.0f : dense[i] / 2.0f;  // both ranks sent the same
      REQUIRE(same_bits(float(residual[i] + carried), original.values()[j]));
    }
  }
}

namespace {

// Three ranks' compact (or compact8) payloads of 300 entries stride apart, each damaged in
// the ways its index code and values can be, and in the ways any payload can.
template <class T>
void check_damage_refused(std::size_t stride, comm::entry_coding coding) {
  constexpr std::size_t dense = 100000, count = 300;
  const double delta = 0.004;
  comm::allgather_core<T> core({{0, dense}}, delta, 1.25, coding);
  const bool bytes = coding == comm::entry_coding::compact8;
  const auto expected_code = stride == 3 ? comm::index_code::gaps : comm::index_code::elias_fano;
  CAPTURE(stride);
  CAPTURE(bytes);
  std::vector<std::vector<std::byte>> clean(3, std::vector<std::byte>(core.format().bytes()));
  for (std::size_t r = 0; r < 3; ++r) {
    sparse_vector<T, std::uint32_t> sent(dense);
    for (std::size_t j = 0; j < count; ++j) sent.push_back(std::uint32_t(5 + stride * j + r), T(float(j) - 149.5f));
    map_residual<T> sink;
    core.encode(sent, sink, {4, 1, delta, comm::reduction::sum}, clean[r]);
    REQUIRE(comm::header_of(clean[r]).count == count);
    REQUIRE(comm::header_of(clean[r]).index_code == std::uint8_t(expected_code));
  }
  const auto error_of = [&](const std::vector<std::vector<std::byte>>& payloads) {
    std::vector<T> out(dense);
    map_residual<T> sink;
    try {
      core.decode(views_of(payloads), std::span<T>(out), sink);
    } catch (const sidco::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(error_of(clean).empty());
  const auto expect = [&](const std::vector<std::vector<std::byte>>& payloads, const std::string& wanted) {
    const std::string error = error_of(payloads);
    CHECK_MESSAGE(error.find(wanted) != std::string::npos, error, " (wanted: ", wanted, ")");
  };
  const std::size_t value_bytes = core.format().value_bytes, values_at = 64 + core.format().scale_bytes(),
                    codes_at = values_at + (count * value_bytes + 7) / 8 * 8;
  // A non-finite value, first, middle and last (compact8: its marker code, 0 or 0x80).
  for (const std::size_t j : {std::size_t(0), count / 2, count - 1}) {
    auto payloads = clean;
    if (bytes) {
      payloads[2][values_at + j] = std::byte(j % 2 ? 0x80 : 0);
    } else {
      const auto v = comm::compact_value_t<T>(std::numeric_limits<float>::quiet_NaN());
      std::memcpy(payloads[2].data() + values_at + j * sizeof v, &v, sizeof v);
    }
    expect(payloads, "rank 2 sent a non-finite value at position " + std::to_string(j));
  }
  if (bytes) {  // The values' scale: beyond the type's range either way, or its spare bytes set.
    for (const std::int32_t top : {comm::byte_scale<T>::highest_top + 1, comm::byte_scale<T>::lowest_top - 1}) {
      auto payloads = clean;
      std::memcpy(payloads[1].data() + 64, &top, sizeof top);
      expect(payloads, "rank 1 sent a value scale 2^" + std::to_string(top) + " outside [2^");
    }
    auto payloads = clean;
    payloads[0][64 + 6] = std::byte{1};
    expect(payloads, "rank 0 sent a value scale whose spare bytes are not zero");
  }
  if (expected_code == comm::index_code::gaps) {
    {  // The first gap beyond the dense size.
      auto payloads = clean;
      payloads[1][codes_at] = std::byte{0xff};
      payloads[1][codes_at + 1] = std::byte{0xff};
      payloads[1][codes_at + 2] = std::byte{0x7f};
      expect(payloads, "rank 1 sent an index past the dense size 100000 at entry 0");
    }
    {  // A code that never ends.
      auto payloads = clean;
      std::fill(payloads[0].begin() + std::ptrdiff_t(codes_at), payloads[0].end(), std::byte{0x80});
      expect(payloads, "rank 0 sent an index code over 64 bits at entry 0");
    }
  } else {
    // L = 8: entry j's low part is byte j of the codes; the unary part follows at upper_at,
    // entry j's bit at (index >> 8) + j.
    const std::size_t upper_at = codes_at + count;
    {  // No unary bits at all: the code runs out at the first entry.
      auto payloads = clean;
      std::fill(payloads[0].begin() + std::ptrdiff_t(upper_at), payloads[0].end(), std::byte{0});
      expect(payloads, "rank 0 sent an index code that runs past its payload at entry 0");
    }
    {  // A dense size raised to 2^62: 53 low bits an entry, more than the body holds. The
      // headers' comparison names it first; the expansion alone must not read past the body.
      auto payload = clean[1];
      const std::uint64_t huge = std::uint64_t(1) << 62;
      std::memcpy(payload.data() + 16, &huge, sizeof huge);
      const auto plain_format = comm::format_for<T, std::uint32_t>(core.format().capacity);
      std::vector<std::byte> plain(plain_format.bytes());
      const std::string problem =
          comm::expand_compact<T, std::uint32_t>(payload, core.format(), 1, plain_format, plain);
      CHECK_MESSAGE(problem.find("rank 1 sent an index code that runs past its payload at entry 0") != std::string::npos,
                    problem);
    }
    {  // The first entry's bit moved to the body's last: a high part beyond the dense size.
      auto payloads = clean;
      std::fill(payloads[1].begin() + std::ptrdiff_t(upper_at), payloads[1].end(), std::byte{0});
      payloads[1].back() = std::byte{0x80};
      expect(payloads, "rank 1 sent an index past the dense size 100000 at entry 0");
    }
    {  // Rank 0's entries 5, 336, 667, 998 set bits 0, 2, 4, 6: the second's bit moved down
      // to the first's high part (bit 1) and its low part zeroed: index 0 after 5.
      auto payloads = clean;
      REQUIRE(payloads[0][upper_at] == std::byte{0b01010101});
      payloads[0][upper_at] = std::byte{0b01010011};
      payloads[0][codes_at + 1] = std::byte{0};
      expect(payloads, "rank 0 sent indices out of order at entry 1");
    }
  }
  {  // An index code this build does not know; the other code's reading of the bytes.
    auto payloads = clean;
    payloads[2][11] = std::byte{7};
    expect(payloads, "rank 2 sent an index code 7 this rank does not know (gaps 0, Elias-Fano 1)");
    payloads = clean;
    payloads[2][11] = std::byte(std::uint8_t(expected_code) ^ 1);
    expect(payloads, "rank 2 sent ");
  }
  {  // A byte past the count (a count lowered in transit shows so too).
    auto payloads = clean;
    payloads[2].back() = std::byte{1};
    expect(payloads, "rank 2 sent a payload with bytes past its 300 entries");
    auto lowered = clean;
    const std::uint64_t fewer = count - 1;
    std::memcpy(lowered[2].data() + 32, &fewer, sizeof fewer);
    CHECK(!error_of(lowered).empty());
  }
  {  // A rank's failure outranks another's damage: it explains it.
    auto payloads = clean;
    payloads[2].back() = std::byte{1};
    core.encode_failure(sidco::error("out of memory"), {4, 1, delta, comm::reduction::sum}, payloads[1]);
    expect(payloads, "rank 1 failed: out of memory");
  }
  {  // A plain payload among compact ones, or a compact one read as plain.
    auto payloads = clean;
    payloads[1][10] = std::byte{0};
    expect(payloads, std::string("rank 1 sent a payload coded 0 where the ranks agreed on the ") +
                         (bytes ? "compact8" : "compact") + " coding");
    comm::allgather_core<T> plain({{0, dense}}, delta, 1.25);
    std::vector<std::vector<std::byte>> as_plain(3, std::vector<std::byte>(plain.format().bytes()));
    for (std::size_t r = 0; r < 3; ++r) std::copy(clean[r].begin(), clean[r].end(), as_plain[r].begin());
    std::string error;
    try {
      std::vector<T> out(dense);
      comm::decode<T, std::uint32_t>(views_of(as_plain), plain.format(), std::span<T>(out));
    } catch (const sidco::runtime_error& e) {
      error = e.what();
    }
    CHECK_MESSAGE(error.find(std::string("the payloads' entries are coded ") + (bytes ? "2" : "1") +
                             "; this rank decodes coding 0") != std::string::npos, error);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("compact: damage to a payload is refused alike, naming the rank and what is wrong", T, float,
                   float16) {
  // Indices 3 apart: one byte of gap each (300 bytes; Elias-Fano 387); 331 apart: two bytes
  // each (600; Elias-Fano 387: L = 8, 300 bytes of low parts and 87 of unary).
  for (const auto coding : {comm::entry_coding::compact, comm::entry_coding::compact8}) {
    check_damage_refused<T>(3, coding);
    check_damage_refused<T>(331, coding);
  }
}

TEST_CASE("compact: gaps that overflow the body give back the smallest entries whole; what is kept decodes exactly") {
  // 64 entries 20,000 apart (3 bytes of code each: 192) in a body with room for 128 bytes of
  // code: the smallest go back until the rest fits.
  const auto format = comm::compact_format_for<float, std::uint32_t>(64);
  REQUIRE(format.bytes() == 64 + 256);
  constexpr std::size_t dense = 64 * 20000;
  sparse_vector<float> sent(dense);
  for (std::size_t j = 0; j < 64; ++j) sent.push_back(std::uint32_t(j * 20000), float((j * 37) % 64) + 0.5f);
  map_residual<float> sink;
  const std::size_t removed = comm::fit_compact_body(sent, format, sink);
  CHECK(removed == sink.values.size());
  CHECK(removed + sent.size() == 64);
  CHECK(comm::detail::shorter_index_code<std::uint32_t>(sent.indices(), dense).second <=
        256 - (sent.size() * 2 + 7) / 8 * 8);
  CHECK(sent.size() >= 40);  // it stops once the code fits
  const float smallest_kept = *std::min_element(sent.values().begin(), sent.values().end());
  for (const auto& [index, value] : sink.values) {
    CHECK(value < smallest_kept);
    CHECK(value == float((index / 20000 * 37) % 64) + 0.5f);  // given back whole
  }
  std::vector<std::byte> payload(format.bytes()), plain(comm::format_for<float, std::uint32_t>(64).bytes());
  comm::pack_compact<float, std::uint32_t>(sent.indices(), sent.values(), dense, removed, {}, format, payload);
  REQUIRE(comm::expand_compact<float, std::uint32_t>(payload, format, 0, comm::format_for<float, std::uint32_t>(64),
                                                      plain)
              .empty());
  const auto plain_format = comm::format_for<float, std::uint32_t>(64);
  for (std::size_t j = 0; j < sent.size(); ++j) {
    std::uint32_t i;
    float v;
    std::memcpy(&i, plain.data() + plain_format.indices_offset() + 4 * j, 4);
    std::memcpy(&v, plain.data() + plain_format.values_offset(sent.size()) + 4 * j, 4);
    CHECK(i == sent.indices()[j]);
    CHECK(v == sent.values()[j]);  // these values are bfloat16's already
  }
}

TEST_CASE("compact: the index code's room is Elias-Fano's longest at any count up to the capacity") {
  // Against every count, for sizes where the low-bit width changes inside the range.
  for (const std::uint64_t dense : {1ull, 2ull, 7ull, 100ull, 1000ull, 4096ull, 100003ull}) {
    for (const std::size_t capacity : {std::size_t(1), std::size_t(3), std::size_t(64), std::size_t(500),
                                       std::size_t(dense)}) {
      std::size_t longest = 0;
      for (std::uint64_t count = 1; count <= std::min<std::uint64_t>(capacity, dense); ++count)
        longest = std::max(longest, comm::detail::elias_fano_bytes(count, dense));
      CAPTURE(dense);
      CAPTURE(capacity);
      CHECK(comm::compact_index_room(capacity, dense) == longest);
    }
  }
  // A format made with the dense size: capacity values and that room; without, 2 bytes an index.
  const auto tight = comm::compact_format_for<float, std::uint32_t>(1000, 100000);
  CHECK(tight.index_room == comm::compact_index_room(1000, 100000));
  CHECK(tight.bytes() == 64 + 2000 + (tight.index_room + 7) / 8 * 8);
  CHECK(comm::compact_format_for<float, std::uint32_t>(1000).bytes() == 64 + 4000);
  CHECK(comm::compact_format(1000, 4, sizeof(float), 100000).bytes() == tight.bytes());
}

TEST_CASE("compact: a selection of any count up to the capacity fits the fixed payload whole, however it spreads") {
  // The bundled LSTM gradient's size, one segment, at three densities: selections of 1, half
  // and all the capacity's entries, spread evenly (Elias-Fano's longest), clustered at one
  // end, and at random; the core gives none back to fit, and the payload decodes to them.
  const std::size_t dense = 3'713'440;
  std::mt19937_64 rng(7);
  std::vector<std::uint32_t> all(dense);
  for (std::size_t i = 0; i < dense; ++i) all[i] = std::uint32_t(i);
  for (const double delta : {0.001, 0.01, 0.1}) {
    comm::allgather_core<float> core({segment{0, dense}}, delta, 1.25, comm::entry_coding::compact);
    const std::size_t capacity = core.format().capacity;
    CAPTURE(delta);
    // About 2 + log2(1 / (1.25 delta)) bits an index (5 at 0.1, 8.3 at 0.01), against
    // compact_index_budget's 16.
    CHECK(double(core.format().index_room) <= capacity * (3.0 + std::log2(dense / double(capacity))) / 8.0);
    for (const std::size_t count : {std::size_t(1), capacity / 2, capacity}) {
      for (const int spread : {0, 1, 2}) {
        std::vector<std::uint32_t> indices;
        if (spread == 0) {
          for (std::size_t j = 0; j < count; ++j) indices.push_back(std::uint32_t(j * (dense / count)));
        } else if (spread == 1) {
          for (std::size_t j = 0; j < count; ++j) indices.push_back(std::uint32_t(dense - count + j));
        } else {
          std::sample(all.begin(), all.end(), std::back_inserter(indices), count, rng);
        }
        sparse_vector<float> sent(dense);
        for (const std::uint32_t i : indices) sent.push_back(i, 0.5f + float(i % 7));  // bfloat16 holds them
        std::vector<float> residual(dense, 0.0f);
        comm::host_residual<float> sink{residual};
        std::vector<std::byte> payload(core.format().bytes());
        CAPTURE(count);
        CAPTURE(spread);
        CHECK(core.encode(sent, sink, {1, 0, delta, comm::reduction::sum}, payload) == 0);
        REQUIRE(sent.size() == count);
        CHECK(std::all_of(residual.begin(), residual.end(), [](float v) { return v == 0.0f; }));
        std::vector<std::uint32_t> got;
        std::vector<float> values;
        const std::vector<std::span<const std::byte>> one{payload};
        core.decode_into(one, got, values, sink);
        CHECK(got == indices);
      }
    }
  }
}

TEST_CASE_TEMPLATE("compact: rounding keeps non-finite input to be refused, gives back what no narrow value holds, "
                   "and the rest at once or once each entry's fate is known", T, float, double) {
  using N = comm::compact_value_t<T>;
  constexpr std::size_t dense = 100;
  const T huge = std::is_same_v<T, double> ? T(1e300) : std::numeric_limits<T>::max();  // rounds past N's range
  const T tiny = std::numeric_limits<T>::denorm_min();                                   // rounds to 0 in N
  sparse_vector<T> sent(dense);
  sent.push_back(1, T(0.3));
  sent.push_back(2, huge);
  sent.push_back(3, tiny);
  sent.push_back(4, -std::numeric_limits<T>::infinity());
  sent.push_back(5, T(-1.7));
  const sparse_vector<T> unrounded = sent;
  map_residual<T> sink, remainders;
  CHECK(comm::round_for_compact(sent, sink, remainders) == 2);
  REQUIRE(sent.size() == 3);
  CHECK(sent.indices()[0] == 1);
  CHECK(sent.indices()[1] == 4);
  CHECK(std::isinf(double(sent.values()[1])));  // sent on: every rank's agree() refuses it
  CHECK(sent.indices()[2] == 5);
  CHECK(sink.values.size() == 2);  // what it dropped, whole
  CHECK(same_bits(sink.values.at(2), huge));
  CHECK(same_bits(sink.values.at(3), tiny));
  CHECK(same_bits(T(N(T(0.3))), sent.values()[0]));
  CHECK(remainders.values.size() == 2);  // what rounding left off the finite ones it kept, exactly
  CHECK(same_bits(T(remainders.values.at(1) + sent.values()[0]), T(0.3)));
  CHECK(same_bits(T(remainders.values.at(5) + sent.values()[2]), T(-1.7)));

  // Given back once the step's outcome is known instead (the reduce-scatter core): applied,
  // what rounding left off (nothing for the non-finite one), exactly.
  map_residual<T> applied;
  CHECK(comm::give_back_rounded(unrounded, sent, [](std::uint32_t) { return true; }, applied) == 0);
  CHECK(applied.values.size() == 2);
  CHECK(same_bits(T(applied.values.at(1) + sent.values()[0]), T(0.3)));
  CHECK(same_bits(T(applied.values.at(5) + sent.values()[2]), T(-1.7)));
  // Index 5 not applied (the predicate is asked in ascending order): its value whole.
  std::vector<std::uint32_t> asked;
  map_residual<T> mixed;
  CHECK(comm::give_back_rounded(unrounded, sent, [&](std::uint32_t i) { asked.push_back(i); return i != 5; },
                                mixed) == 1);
  CHECK(asked == std::vector<std::uint32_t>{1, 4, 5});
  CHECK(same_bits(mixed.values.at(5), T(-1.7)));
  CHECK(same_bits(T(mixed.values.at(1) + sent.values()[0]), T(0.3)));
  // A failed step: every entry sent whole, the non-finite one too.
  map_residual<T> failed;
  CHECK(comm::give_back_rounded(unrounded, sent, [](std::uint32_t) { return false; }, failed) == 3);
  CHECK(same_bits(failed.values.at(1), T(0.3)));
  CHECK(std::isinf(double(failed.values.at(4))));
  CHECK(same_bits(failed.values.at(5), T(-1.7)));
  // An entry that was never among the unrounded ones is a caller's mistake, named.
  sparse_vector<T> foreign(dense);
  foreign.push_back(7, T(1));
  CHECK_THROWS_WITH(comm::give_back_rounded(unrounded, foreign, [](std::uint32_t) { return true; }, failed),
                    doctest::Contains("index 7 was not among the entries before rounding"));
}

TEST_CASE_TEMPLATE("compact, compact8: an average whose sum overflows is finite, divided first, as in the plain coding",
                   T, float, float16, bfloat16) {
  const double big = std::is_same_v<T, float16> ? 30000.0 : 2e38;
  constexpr std::size_t dense = 2000;
  for (const auto coding : {comm::entry_coding::compact, comm::entry_coding::compact8})
  for (const std::size_t ranks : {std::size_t(2), std::size_t(5)}) {
    comm::allgather_core<T> core({{0, dense}}, 0.02, 1.25, coding);
    std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(core.format().bytes()));
    for (std::size_t r = 0; r < ranks; ++r) {
      sparse_vector<T, std::uint32_t> sent(dense);
      sent.push_back(std::uint32_t(3), T(big * (1.0 - 0.01 * double(r))));
      sent.push_back(std::uint32_t(100 + r), T(1.0));
      map_residual<T> sink;
      core.encode(sent, sink, {0, 1, 0.02, comm::reduction::average}, payloads[r]);
    }
    std::vector<T> out(dense);
    map_residual<T> none;
    core.decode(views_of(payloads), std::span<T>(out), none);
    REQUIRE(std::isfinite(double(to_accumulator(out[3]))));
    CHECK(double(to_accumulator(out[3])) > 0.9 * big);
  }
}

TEST_CASE("setup records: ranks that code their entries differently are refused, naming both") {
  const std::vector<segment> layout{{0, 1000}};
  const auto plan = comm::plan_capacity(layout, 0.01, 1.25);
  const auto plain = comm::setup_of<float, std::uint32_t>(layout, comm::format_for<float, std::uint32_t>(plan.total),
                                                          {1, 0, 0.01, comm::reduction::average}, 1.25);
  const auto compact = comm::setup_of<float, std::uint32_t>(
      layout, comm::compact_format_for<float, std::uint32_t>(plan.total), {1, 0, 0.01, comm::reduction::average}, 1.25);
  const std::vector<comm::exchange_setup> records{plain, compact};
  CHECK_THROWS_WITH_AS(comm::check_setups(records),
                       "sidco: exchange setup (tag 1): rank 1 codes entries compact, rank 0 plain", sidco::runtime_error);
}

TEST_CASE("compact: the reduce core rounds what it packs to bfloat16, the rest into the residual; what it gives "
          "back (trimmed, unkept, a failed step) returns unrounded, each index once a step; a coding it does not know "
          "is refused") {
  const std::size_t n = 100000;
  const std::vector<segment> layout{{0, n}};
  comm::exchange_options options;
  options.coding = comm::entry_coding::compact;
  // Two ranks, k = 1,000: a block holds 625 entries; rank 0 sends 2,000 (about 1,000 a
  // block: some trimmed at pack), rank 1 none, and each owner keeps about half of what it
  // received (its share): the rest goes back to rank 0.
  using core_type = comm::reduce_core<float, std::uint32_t, comm::owner_top_k>;
  std::vector<core_type> cores;
  for (std::size_t rank = 0; rank < 2; ++rank) cores.emplace_back(layout, 0.01, 2, rank, options);
  CHECK(cores[0].coding() == comm::entry_coding::compact);
  sparse_vector<float> original(n);
  for (std::uint32_t j = 0; j < 2000; ++j) original.push_back(7 + 37 * j, 1.0f + 0.123456f * float(j) * (j % 2 ? -1 : 1));
  const std::size_t bytes = cores[0].block_bytes();
  for (const bool fail : {false, true}) {
    std::vector<float> residual(n, 0.0f), other(n, 0.0f);  // the compressor left +0 where it sent
    counted_residual sink{{residual}, {}};
    comm::host_residual<float> other_sink{other};
    auto sent = original;
    sparse_vector<float> nothing(n);
    std::vector<std::vector<std::byte>> blocks(2, std::vector<std::byte>(2 * bytes)),
        selections(2, std::vector<std::byte>(bytes));
    REQUIRE(cores[0].pack(sent, sink, cores[0].fields(1), blocks[0]));
    REQUIRE(cores[1].pack(nothing, other_sink, cores[1].fields(1), blocks[1]));
    for (const float v : sent.values()) CHECK(float(bfloat16(v)) == v);  // what the blocks hold is bfloat16
    const sidco::error problem("sidco: this rank's output is wrong");
    for (std::size_t owner = 0; owner < 2; ++owner) {
      const std::vector<std::span<const std::byte>> received{std::span<const std::byte>(blocks[0]).subspan(owner * bytes, bytes),
                                                              std::span<const std::byte>(blocks[1]).subspan(owner * bytes, bytes)};
      cores[owner].select(received, selections[owner], fail && owner == 1 ? &problem : nullptr);
    }
    const std::vector<std::span<const std::byte>> views{selections[0], selections[1]};
    std::vector<float> applied(n, 0.0f);
    if (fail) {  // every rank raises what owner 1 found
      CHECK_THROWS_AS(cores[1].apply(views, other_sink), sidco::runtime_error);
      CHECK_THROWS_AS(cores[0].apply(views, sink), sidco::runtime_error);
    } else {
      cores[1].apply(views, other_sink);
      const auto report = cores[0].apply(views, sink);
      INFO("trimmed ", report.trimmed, ", returned ", report.returned);
      CHECK(report.trimmed > 0);   // or the trimmed entries' give-back went untested
      CHECK(report.returned > 0);  // or the owners' left-out entries' give-back went untested
      const auto kept = cores[0].global_selection();
      for (std::size_t j = 0; j < kept.size(); ++j) applied[kept[j]] = cores[0].updates()[j] * 2.0f;  // the average of 2
    }
    // Per index, bitwise: residual + applied = what the compressor sent (the residual holds
    // what rounding took off a kept entry, all of an entry given back).
    for (std::size_t j = 0; j < original.size(); ++j) {
      const std::uint32_t i = original.indices()[j];
      CHECK(residual[i] + applied[i] == original.values()[j]);
      if (applied[i] == 0.0f) CHECK(residual[i] == original.values()[j]);
    }
    // Once each, over pack and apply: one write of a step's entries into a device residual
    // (comm/nccl_reduce.cuh) would otherwise race between two values for an index.
    CHECK(sink.times.size() == original.size());
    CHECK(sink.repeated() == "");
  }
  options.coding = comm::entry_coding(7);
  CHECK_THROWS_WITH_AS((comm::reduce_core<float, std::uint32_t, comm::owner_top_k>(layout, 0.01, 2, 0, options)),
                       doctest::Contains("options.coding = 7, neither plain (0), compact (1) nor compact8 (2)"),
                       sidco::error);
}

namespace {

using reduce_top_k = comm::reduce_core<float, std::uint32_t, comm::owner_top_k>;

// Each of ranks' cores packs what rank r sends this step (sent[r]), every owner selects
// from the blocks routed to it (problem: owner `failing` finds one), every rank applies.
// Returns whether the step applied (on every rank alike); the residuals are sinks per rank.
bool reduce_step(std::vector<reduce_top_k>& cores, std::vector<sparse_vector<float>> sent,
                 std::vector<std::vector<float>>& residuals, std::uint64_t step, std::size_t failing = SIZE_MAX) {
  const std::size_t ranks = cores.size(), bytes = cores[0].block_bytes();
  std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(ranks * bytes)),
      selections(ranks, std::vector<std::byte>(bytes));
  std::vector<comm::host_residual<float>> sinks;
  for (auto& residual : residuals) sinks.push_back({residual});
  for (std::size_t r = 0; r < ranks; ++r)  // as a compressor leaves it: +0 where it sends
    for (const auto i : sent[r].indices()) residuals[r][i] = 0.0f;
  for (std::size_t r = 0; r < ranks; ++r) REQUIRE(cores[r].pack(sent[r], sinks[r], cores[r].fields(step), blocks[r]));
  const sidco::error problem("sidco: this rank's output is wrong");
  for (std::size_t owner = 0; owner < ranks; ++owner) {
    views received;
    for (std::size_t r = 0; r < ranks; ++r) received.push_back(std::span<const std::byte>(blocks[r]).subspan(owner * bytes, bytes));
    cores[owner].select(received, selections[owner], owner == failing ? &problem : nullptr);
  }
  bool applied = true;
  for (std::size_t r = 0; r < ranks; ++r) {
    try {
      cores[r].apply(views_of(selections), sinks[r]);
    } catch (const sidco::runtime_error&) {
      applied = false;
    }
  }
  return applied;
}

// What each rank sends at a step: bfloat16 values (the compact pack then rounds nothing,
// so a plain core sees the same blocks), at indices that overlap between ranks.
std::vector<sparse_vector<float>> bfloat16_entries(std::size_t ranks, std::size_t n, std::size_t count,
                                                   std::uint64_t step) {
  std::vector<sparse_vector<float>> sent;
  for (std::size_t r = 0; r < ranks; ++r) {
    std::mt19937_64 rng(1000 * step + r);
    std::normal_distribution<float> value(0.0f, 1.0f);
    std::vector<std::uint32_t> indices;
    for (std::size_t j = 0; j < count; ++j) indices.push_back(std::uint32_t(rng() % (n / 4)));  // overlapping
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    sparse_vector<float> s(n);
    for (const auto i : indices) s.push_back(i, float(bfloat16(value(rng))));
    sent.push_back(std::move(s));
  }
  return sent;
}

// One core per rank of ranks, over one tensor of n values at δ = 0.01, in coding.
std::vector<reduce_top_k> reduce_cores(std::size_t n, std::size_t ranks, comm::entry_coding coding) {
  comm::exchange_options options;
  options.coding = coding;
  std::vector<reduce_top_k> cores;
  for (std::size_t r = 0; r < ranks; ++r) cores.emplace_back(std::vector<segment>{{0, n}}, 0.01, ranks, r, options);
  return cores;
}

}  // namespace

TEST_CASE("compact: an owner's updates travel as bfloat16; what rounding took stays in its carry, exactly, and is "
          "added the next time it keeps the index; a failed step leaves the carry as it was") {
  const std::size_t n = 40000, ranks = 3;
  auto compact = reduce_cores(n, ranks, comm::entry_coding::compact),
       plain = reduce_cores(n, ranks, comm::entry_coding::plain);
  std::vector<std::vector<float>> compact_residuals(ranks, std::vector<float>(n, 0.0f)),
      plain_residuals = compact_residuals;
  std::vector<float> carry(n, 0.0f);  // the oracle: every owner's carry at its own indices
  std::size_t carried = 0, reused = 0;
  for (std::uint64_t step = 1; step <= 6; ++step) {
    const auto sent = bfloat16_entries(ranks, n, 500, step);
    if (step == 4) {  // owner 2 finds a problem: every rank raises, every carry as it was
      std::vector<std::vector<float>> before;
      for (const auto& core : compact) before.emplace_back(core.carry().begin(), core.carry().end());
      CHECK_FALSE(reduce_step(compact, sent, compact_residuals, step, 2));
      CHECK_FALSE(reduce_step(plain, sent, plain_residuals, step, 2));  // alike: every entry back
      for (std::size_t r = 0; r < ranks; ++r)
        CHECK(std::memcmp(before[r].data(), compact[r].carry().data(), n * sizeof(float)) == 0);
      continue;
    }
    REQUIRE(reduce_step(plain, sent, plain_residuals, step));
    REQUIRE(reduce_step(compact, sent, compact_residuals, step));
    // The same selection: the carry is added after the owners chose.
    const auto global = compact[0].global_selection();
    const auto plain_global = plain[0].global_selection();
    REQUIRE(std::equal(global.begin(), global.end(), plain_global.begin(), plain_global.end()));
    for (std::size_t j = 0; j < global.size(); ++j) {
      const std::uint32_t i = global[j];
      const float u = plain[0].updates()[j], t = u + carry[i], sent_value = float(bfloat16(t));
      reused += carry[i] != 0.0f;
      carry[i] = t - sent_value;
      carried += carry[i] != 0.0f;
      CHECK(same_bits(compact[0].updates()[j], sent_value));     // what every rank applies: bfloat16
      CHECK(same_bits(sent_value + carry[i], t));                // nothing lost by the owner
      for (std::size_t r = 1; r < ranks; ++r) CHECK(same_bits(compact[r].updates()[j], sent_value));
    }
    // Each owner holds the carry at its own indices, 0 elsewhere.
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t owner = comm::owner_of(i, ranks);
      for (std::size_t r = 0; r < ranks; ++r) {
        const float held = compact[r].carry().empty() ? 0.0f : compact[r].carry()[i];
        REQUIRE(same_bits(held, r == owner ? carry[i] : 0.0f));
      }
    }
    // Per rank, the residuals are the plain coding's: the owners' rounding is not theirs.
    for (std::size_t r = 0; r < ranks; ++r)
      REQUIRE(std::memcmp(compact_residuals[r].data(), plain_residuals[r].data(), n * sizeof(float)) == 0);
  }
  INFO("carried ", carried, ", reused ", reused);
  CHECK(carried > 100);  // or the carry went untested
  CHECK(reused > 10);    // or adding it back went untested
}

TEST_CASE("compact: an owner's carry is saved with the exchange's state and resumes bit for bit; a version-3 state "
          "(before the carry) loads with none; a carry that does not fit is refused, changing nothing") {
  const std::size_t n = 30000, ranks = 3;  // an average of 3 seldom is a bfloat16: carries
  const auto make = [&] { return reduce_cores(n, ranks, comm::entry_coding::compact); };
  auto whole = make(), resumed = make();
  std::vector<std::vector<float>> residuals(ranks, std::vector<float>(n, 0.0f)), other = residuals;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    REQUIRE(reduce_step(whole, bfloat16_entries(ranks, n, 400, step), residuals, step));
    REQUIRE(reduce_step(resumed, bfloat16_entries(ranks, n, 400, step), other, step));
  }
  // Loaded by compact cores (resumed) and by plain ones (a wire switched mid-run: they add
  // the carry and make none).
  auto loaded = make();
  auto switched = reduce_cores(n, ranks, comm::entry_coding::plain),
       unswitched = reduce_cores(n, ranks, comm::entry_coding::plain);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto bytes = saved_state(resumed[r]);
    CHECK(comm::read_reduce_state_info(bytes).version == 4);
    for (auto* core : {&loaded[r], &switched[r]}) {
      state_reader in(bytes);
      core->load_state(in);
      in.finish();
      REQUIRE(!core->carry().empty());
      CHECK(std::memcmp(core->carry().data(), whole[r].carry().data(), n * sizeof(float)) == 0);
    }
  }
  {
    auto plain_residuals = residuals, unswitched_residuals = residuals;
    REQUIRE(reduce_step(switched, bfloat16_entries(ranks, n, 400, 5), plain_residuals, 5));
    REQUIRE(reduce_step(unswitched, bfloat16_entries(ranks, n, 400, 5), unswitched_residuals, 5));
    const auto global = switched[0].global_selection();
    REQUIRE(global.size() == unswitched[0].global_selection().size());
    std::size_t added = 0;
    for (std::size_t j = 0; j < global.size(); ++j) {
      const std::uint32_t i = global[j];
      const float carried = whole[comm::owner_of(i, ranks)].carry()[i];
      added += carried != 0.0f;
      CHECK(same_bits(switched[0].updates()[j], unswitched[0].updates()[j] + carried));
      CHECK(switched[comm::owner_of(i, ranks)].carry()[i] == 0.0f);
    }
    INFO("added ", added, " of ", global.size());
    CHECK(added > 10);  // or adding a loaded carry went untested
  }
  for (std::uint64_t step = 5; step <= 7; ++step) {
    REQUIRE(reduce_step(whole, bfloat16_entries(ranks, n, 400, step), residuals, step));
    REQUIRE(reduce_step(loaded, bfloat16_entries(ranks, n, 400, step), other, step));
    CHECK(std::equal(whole[0].updates().begin(), whole[0].updates().end(), loaded[0].updates().begin(),
                     loaded[0].updates().end(), [](float a, float b) { return same_bits(a, b); }));
  }
  // A state's head at version: its fields and the owner's name (Top-k keeps no state).
  const auto head = [&](std::uint64_t version) {
    state_writer out;
    out.name(comm::reduce_state_name);
    out.word(version);
    out.word(ranks);
    out.word(n);
    out.name(comm::owner_top_k::name);
    return out;
  };
  {  // Version 3: no carry.
    const auto bytes = head(3).take();
    state_reader in(bytes);
    loaded[0].load_state(in);
    in.finish();
    CHECK(loaded[0].carry().empty());
  }
  // A carried index beyond the dense size: refused, the carry as it was.
  auto bad = head(4);
  bad.word(1);  // one entry
  bad.word(2);  // two words each
  bad.word(n);
  bad.number(0.5);
  const auto bytes = bad.take();
  state_reader in(bytes);
  const std::vector<float> before(whole[1].carry().begin(), whole[1].carry().end());
  CHECK_THROWS_WITH_AS(whole[1].load_state(in),
                       doctest::Contains("carried index 30000 (not ascending, or not below 30000)"), sidco::error);
  CHECK(std::equal(before.begin(), before.end(), whole[1].carry().begin(), whole[1].carry().end()));
  // A layout this sidco does not write.
  auto odd = head(4);
  odd.word(0);
  odd.word(7);
  const auto odd_bytes = odd.take();
  state_reader odd_in(odd_bytes);
  CHECK_THROWS_WITH_AS(whole[1].load_state(odd_in), doctest::Contains("the carry's layout is 7, neither 1 nor 2"),
                       sidco::error);
  // load_whole_state: a state (version 3: no carry) with a byte after it is refused and the
  // core keeps its carry; a core does not copy, so what it held is put back. Without the byte
  // it loads.
  REQUIRE(std::any_of(whole[1].carry().begin(), whole[1].carry().end(), [](float v) { return v != 0.0f; }));
  const std::vector<std::byte> held = saved_state(whole[1]), no_carry = head(3).take();
  std::vector<std::byte> longer = no_carry;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS(load_whole_state(whole[1], longer), doctest::Contains("1 bytes left over"), sidco::error);
  CHECK(saved_state(whole[1]) == held);
  load_whole_state(whole[1], no_carry);
  CHECK(whole[1].carry().empty());
}

TEST_CASE("compact: an owner's update that bfloat16 cannot hold travels as it is, its carry then 0") {
  const std::size_t n = 100;
  const auto format = comm::format_for<float, std::uint32_t>(8);
  std::vector<std::byte> payload(format.bytes());
  // Beyond bfloat16's largest finite value (it rounds to infinity); so small that it rounds
  // to 0 (5 x 2^-149: bfloat16 keeps a float's top 16 bits); a value that narrows with a
  // remainder.
  const float huge = std::numeric_limits<float>::max(), tiny = std::ldexp(1.0f, -149) * 5.0f,
              plain = 1.0f + std::ldexp(1.0f, -20);
  const std::vector<std::uint32_t> indices{3, 5, 7};
  const std::vector<float> values{huge, tiny, plain};
  comm::pack<float, std::uint32_t>(indices, values, n, 0, {1, 1, 0.1, comm::reduction::average}, format, payload);
  comm::owner_carry<float, std::uint32_t> carry;
  carry.apply(payload, format, n, comm::entry_coding::compact);
  float sent[3];
  std::memcpy(sent, payload.data() + format.values_offset(3), sizeof sent);
  CHECK(same_bits(sent[0], huge));  // not narrowed: its frame travels whole
  CHECK(same_bits(sent[1], tiny));
  CHECK(carry.values()[3] == 0.0f);
  CHECK(carry.values()[5] == 0.0f);
  CHECK(same_bits(sent[2], 1.0f));
  CHECK(same_bits(carry.values()[7], std::ldexp(1.0f, -20)));
  carry.restore();  // the step failed: as before
  CHECK(carry.values()[7] == 0.0f);
  // The plain coding makes no carry.
  comm::owner_carry<float, std::uint32_t> none;
  none.apply(payload, format, n, comm::entry_coding::plain);
  CHECK(none.empty());
}

TEST_CASE("compact8: an owner's update takes a byte on the scale of its largest; one below the scale's range is sent "
          "as 0 and carried whole, one beyond it as it is") {
  const std::size_t n = 100;
  const auto format = comm::format_for<float, std::uint32_t>(8);
  std::vector<std::byte> payload(format.bytes());
  // The largest codeable update is 1 (scale 2^0: codes down to 1.125 x 2^-15); FLT_MAX is
  // beyond every scale; 1e-6 lies below this one's codes; 0 has none.
  const float huge = std::numeric_limits<float>::max(), tiny = 1e-6f, one = 1.0f + std::ldexp(1.0f, -20);
  const std::vector<std::uint32_t> indices{3, 5, 7, 9, 11};
  const std::vector<float> values{huge, tiny, 0.0f, one, -0.7f};
  comm::pack<float, std::uint32_t>(indices, values, n, 0, {1, 1, 0.1, comm::reduction::average}, format, payload);
  comm::owner_carry<float, std::uint32_t> carry;
  carry.apply(payload, format, n, comm::entry_coding::compact8);
  float sent[5];
  std::memcpy(sent, payload.data() + format.values_offset(5), sizeof sent);
  CHECK(same_bits(sent[0], huge));  // as it is: its frame travels whole
  CHECK(carry.values()[3] == 0.0f);
  CHECK(same_bits(sent[1], 0.0f));  // sent as 0, carried whole
  CHECK(same_bits(carry.values()[5], tiny));
  CHECK(same_bits(sent[2], 0.0f));
  CHECK(same_bits(carry.values()[7], 0.0f));
  CHECK(same_bits(sent[3], 1.0f));
  CHECK(same_bits(carry.values()[9], std::ldexp(1.0f, -20)));
  CHECK(same_bits(sent[4], -0.6875f));  // 11/16: the nearest 4 significant bits
  CHECK(same_bits(carry.values()[11], -0.7f + 0.6875f));
  CHECK(same_bits(sent[4] + carry.values()[11], -0.7f));
  carry.restore();  // the step failed: as before
  for (const auto i : indices) CHECK(same_bits(carry.values()[i], 0.0f));
}

TEST_CASE_TEMPLATE("compact8: the reduce exchange sends a byte a value; per rank residual + applied = gradient + old "
                   "residual, per owner update + new carry = the rule's update + old carry, bit for bit; a failed "
                   "step keeps every carry; the carries resume bit for bit",
                   T, float, double, float16, bfloat16) {
  using wide = typename comm::byte_scale<T>::wide;
  using A = typename float_traits<T>::accumulator;
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  const std::size_t size = gradient.size(), ranks = 3;
  comm::exchange_options options;
  options.coding = comm::entry_coding::compact8;
  std::vector<comm::reduce_core<T, std::uint32_t, comm::owner_top_k>> cores;
  for (std::size_t r = 0; r < ranks; ++r) cores.emplace_back(std::vector<segment>{{0, size}}, 0.01, ranks, r, options);
  CHECK(cores[0].coding() == comm::entry_coding::compact8);
  const std::size_t bytes = cores[0].block_bytes();
  const comm::wire_format format = cores[0].plan().format;
  // Every payload frames as a byte a value (not whole) and reads back as it was.
  const auto frames_in_bytes = [&](std::span<const std::byte> payload, bool selection, std::uint64_t step) {
    const comm::frame_kind kind = comm::frame_kind_for(selection, comm::entry_coding::compact8);
    std::vector<std::byte> frame, back(bytes);
    comm::append_frame<T, std::uint32_t>(payload, format, kind, frame);
    REQUIRE(comm::frame_length(frame, format, kind) == frame.size());
    REQUIRE((std::uint8_t(frame[0]) & 1) == 0);
    const std::size_t count = std::size_t(comm::header_of(payload).count);
    std::vector<std::byte> whole_values;  // the same frame with each value at T's width
    comm::append_frame<T, std::uint32_t>(payload, format, comm::frame_kind{selection}, whole_values);
    CHECK(frame.size() == whole_values.size() - count * (sizeof(T) - 1) + (count > 0 ? 1 : 0));  // + the scale's byte
    const auto header = comm::detail::header_for<T, std::uint32_t>(cores[0].fields(step), size, format);
    comm::read_frame<T, std::uint32_t>(frame, header, format, kind, back);
    const std::size_t head = sizeof(comm::wire_header);  // a block's trimmed count does not travel
    REQUIRE(std::memcmp(back.data() + head, payload.data() + head, bytes - head) == 0);
  };
  std::vector<std::vector<T>> residuals(ranks, std::vector<T>(size, T(0)));
  std::size_t rounded_off = 0, carried = 0, reused = 0;
  for (std::uint64_t step = 0; step < 5; ++step) {
    CAPTURE(step);
    const bool failing = step == 3;
    std::vector<sparse_vector<T, std::uint32_t>> sent(ranks);
    std::vector<std::vector<T>> inputs(ranks);
    std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(ranks * bytes)),
        selections(ranks, std::vector<std::byte>(bytes));
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<T> g(size);
      for (std::size_t i = 0; i < size; ++i) g[i] = T(gradient[(i + r * 997 + step * 31) % size] * float(1 + r));
      feedback::residual<T> state{std::span<T>(residuals[r])};
      presets::top_k<> compressor({}, {}, backend::cpu(1));
      compressor.compress(std::span<const T>(g), 0.01, sent[r], state);
      inputs[r] = residuals[r];
      for (std::size_t j = 0; j < sent[r].size(); ++j) inputs[r][sent[r].indices()[j]] = sent[r].values()[j];
      comm::host_residual<T> sink{std::span<T>(residuals[r])};
      REQUIRE(cores[r].pack(sent[r], sink, cores[r].fields(step), blocks[r]));
      for (std::size_t j = 0; j < ranks; ++j)
        frames_in_bytes(std::span<const std::byte>(blocks[r]).subspan(j * bytes, bytes), false, step);
    }
    std::vector<std::vector<T>> carry_before;
    for (const auto& core : cores) carry_before.emplace_back(core.carry().begin(), core.carry().end());
    const auto carried_at = [&](const std::vector<T>& c, std::size_t i) { return c.empty() ? T(0) : c[i]; };
    const sidco::error problem("sidco: this rank's output is wrong");
    for (std::size_t owner = 0; owner < ranks; ++owner) {
      views received;
      for (std::size_t r = 0; r < ranks; ++r)
        received.push_back(std::span<const std::byte>(blocks[r]).subspan(owner * bytes, bytes));
      cores[owner].select(received, selections[owner], failing && owner == 1 ? &problem : nullptr);
      if (!failing) frames_in_bytes(selections[owner], true, step);
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      comm::host_residual<T> sink{std::span<T>(residuals[r])};
      if (failing) {
        CHECK_THROWS_AS(cores[r].apply(views_of(selections), sink), sidco::runtime_error);
      } else {
        cores[r].apply(views_of(selections), sink);
      }
    }
    if (failing) {  // every entry back whole, every carry as it was
      for (std::size_t r = 0; r < ranks; ++r) {
        REQUIRE(std::memcmp(residuals[r].data(), inputs[r].data(), size * sizeof(T)) == 0);
        const std::vector<T> now(cores[r].carry().begin(), cores[r].carry().end());
        REQUIRE(now.size() == carry_before[r].size());
        REQUIRE(std::memcmp(now.data(), carry_before[r].data(), now.size() * sizeof(T)) == 0);
      }
      continue;
    }
    const auto global = cores[0].global_selection();
    const auto updates = cores[0].updates();
    for (std::size_t r = 1; r < ranks; ++r) {
      REQUIRE(std::ranges::equal(cores[r].global_selection(), global));
      REQUIRE(std::memcmp(cores[r].updates().data(), updates.data(), updates.size() * sizeof(T)) == 0);
    }
    // The owner's side: the rule over what the blocks held (rank order), plus its old carry,
    // is what it sent plus its new carry.
    for (std::size_t j = 0; j < global.size(); ++j) {
      const std::uint32_t i = global[j];
      const std::size_t owner = comm::owner_of(i, ranks);
      A sum = A(0);
      for (std::size_t r = 0; r < ranks; ++r) {
        const auto at = std::lower_bound(sent[r].indices().begin(), sent[r].indices().end(), i);
        if (at != sent[r].indices().end() && *at == i)
          sum = A(sum + to_accumulator(sent[r].values()[std::size_t(at - sent[r].indices().begin())]));
      }
      const T rule = from_accumulator<T>(A(sum / A(double(ranks))));
      const T old = carried_at(carry_before[owner], i), now = cores[owner].carry()[i];
      const T t = T(wide(rule) + wide(old));
      REQUIRE(wide(updates[j]) + wide(now) == wide(t));
      carried += double(now) != 0;
      reused += double(old) != 0;
    }
    // Each rank's side: an applied entry leaves what rounding took off in the residual, an
    // entry given back (trimmed, below the scale, unkept) all of it.
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto kept = sent[r].indices();
      std::size_t unconserved = 0, k = 0, g = 0;
      for (std::size_t i = 0; i < size; ++i) {
        while (k < kept.size() && kept[k] < i) ++k;
        while (g < global.size() && global[g] < i) ++g;
        if (k < kept.size() && kept[k] == i && g < global.size() && global[g] == i) {
          unconserved += wide(residuals[r][i]) + wide(sent[r].values()[k]) != wide(inputs[r][i]);
          rounded_off += double(residuals[r][i]) != 0;
        } else {
          unconserved += std::memcmp(&residuals[r][i], &inputs[r][i], sizeof(T)) != 0;
        }
      }
      REQUIRE(unconserved == 0);
    }
  }
  // The carries resume bit for bit (16-bit values carry too in compact8).
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto bytes = saved_state(cores[r]);
    comm::reduce_core<T, std::uint32_t, comm::owner_top_k> resumed(std::vector<segment>{{0, size}}, 0.01, ranks, r,
                                                                    options);
    state_reader in(bytes);
    resumed.load_state(in);
    in.finish();
    REQUIRE(resumed.carry().size() == cores[r].carry().size());
    CHECK(std::memcmp(resumed.carry().data(), cores[r].carry().data(), size * sizeof(T)) == 0);
  }
  INFO("rounded off ", rounded_off, ", carried ", carried, ", reused ", reused);
  CHECK(rounded_off > 100);  // or the ranks' rounding went untested
  CHECK(carried > 100);      // or the owners' went untested
  CHECK(reused > 0);         // or adding a carry back went untested
}

namespace {

// The 8-bit code's rounding, written independently of comm/byte_values.hpp: |v| to the
// nearest number of 4 significant bits (ties to even), by frexp and nearbyint.
long double four_bits(long double v) {
  int exponent;
  const long double mantissa = std::frexp(std::fabs(v), &exponent);  // [0.5, 1)
  return std::ldexp(std::nearbyint(mantissa * 16), exponent - 4);
}

// encode(v) against the reference: sent exactly when some code of v's sign stands for v's
// 4-bit rounding (that code then), and what is left off is exact.
template <class T>
void check_codes(const comm::byte_scale<T>& scale, T v, std::size_t& sent, std::size_t& refused) {
  using wide = typename comm::byte_scale<T>::wide;
  const long double target = four_bits((long double)(wide(v)));
  int expected = -1;  // the code whose exact value is the target, where T holds it exactly
  const bool normal = std::fabs(wide(v)) >= std::numeric_limits<wide>::min();  // subnormal (wide) ones: not sent
  for (int code = 1; code < 256 && normal; ++code) {
    const int magnitude = code & 0x7f;
    if (magnitude == 0 || bool(code & 0x80) != std::signbit(wide(v))) continue;
    const long double exact = std::ldexp((long double)(8 + magnitude % 8), scale.top() - 15 + magnitude / 8 - 3);
    if (exact == target && std::fabs((long double)(wide(scale.decode(std::uint8_t(code))))) == exact) expected = code;
  }
  std::uint8_t code = 0;
  T rounded{};
  const bool encoded = scale.encode(v, code, rounded);
  CAPTURE(double(wide(v)));
  CAPTURE(scale.top());
  REQUIRE(encoded == (expected >= 0));
  if (!encoded) {
    ++refused;
    return;
  }
  ++sent;
  REQUIRE(int(code) == expected);
  REQUIRE(same_bits(rounded, scale.decode(code)));
  // The remainder is exact: rounded + (v - rounded) gives v back, bit for bit.
  const T remainder = T(wide(v) - wide(rounded));
  REQUIRE(same_bits(T(wide(rounded) + wide(remainder)), v));
}

}  // namespace

TEST_CASE_TEMPLATE("compact8: a value's code is its 4-bit rounding where the scale holds it, and nothing else", T,
                   float16, bfloat16, float, double) {
  using wide = typename comm::byte_scale<T>::wide;
  using scale_t = comm::byte_scale<T>;
  std::vector<scale_t> scales;
  for (const double largest : {1.0, 0.0123, 3e-4, 1000.0})
    scales.push_back(scale_t::of(std::vector<T>{T(wide(largest)), T(wide(-largest / 7))}));
  scales.push_back(*scale_t::named(scale_t::lowest_top));
  scales.push_back(*scale_t::named(scale_t::highest_top));
  CHECK(!scale_t::named(scale_t::lowest_top - 1));
  CHECK(!scale_t::named(scale_t::highest_top + 1));
  // Every code is finite in T at the highest scale; the marker decodes to NaN.
  for (int code = 0; code < 256; ++code)
    CHECK(std::isnan(double(wide(scales.back().decode(std::uint8_t(code))))) == ((code & 0x7f) == 0));
  std::size_t sent = 0, refused = 0;
  for (const auto& scale : scales) {
    if constexpr (sizeof(T) == 2) {  // every finite value
      for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const T v = T::from_bits(std::uint16_t(bits));
        if (std::isfinite(double(wide(v)))) check_codes(scale, v, sent, refused);
      }
    } else {  // random values around the scale's range and across the whole type
      std::mt19937_64 rng(7);
      std::uniform_real_distribution<double> log2_near(scale.top() - 18.0, scale.top() + 2.0);
      using key = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;
      for (int j = 0; j < 100000; ++j) {
        T v = T(std::exp2(log2_near(rng)) * (j % 2 ? -1 : 1));
        if (j % 4 == 3) v = std::bit_cast<T>(key(rng()));
        if (j % 16 == 15) v = T(std::ldexp(double(9 + 2 * (j % 4)) / 16, scale.top() - 14 + j % 17));  // ties
        if (std::isfinite(double(v))) check_codes(scale, v, sent, refused);
      }
    }
  }
  MESSAGE(sent, " values coded, ", refused, " refused");
  CHECK(sent > 0);
  CHECK(refused > 0);
}

TEST_CASE("compact8: the scale is the largest value's the code holds, so what rounding sends keeps it") {
  // 65504 rounds to 65536, beyond every float16 code (the highest scale's largest is
  // 61440): it goes back whole and 3 sets the scale (2^1), which the values sent keep.
  sparse_vector<float16> sent(10);
  sent.push_back(1, float16(65504.0f));
  sent.push_back(2, float16(3.1f));
  sent.push_back(3, float16(-1e-3f));
  sent.push_back(4, float16(1e-5f));  // 2^-17: below 2^(1 - 15), gone back whole
  const auto scale = comm::byte_scale<float16>::of(sent.values());
  CHECK(scale.top() == 1);
  map_residual<float16> sink, remainders;
  CHECK(comm::round_for_compact(sent, sink, remainders, comm::entry_coding::compact8) == 2);
  CHECK(sent.size() == 2);
  CHECK(sink.values.size() == 2);
  CHECK(same_bits(sink.values.at(1), float16(65504.0f)));
  CHECK(comm::byte_scale<float16>::of(sent.values()).top() == 1);
  CHECK(float(sent.values()[0]) == 3.0f);  // 3.1 to 4 significant bits
  CHECK(float(remainders.values.at(2)) == float(float16(3.1f)) - 3.0f);
  // Nothing finite and nonzero: the lowest scale.
  CHECK(comm::byte_scale<float>::of(std::vector<float>{0.0f, std::numeric_limits<float>::infinity()}).top() ==
        comm::byte_scale<float>::lowest_top);
  // pack_compact refuses a value the scale of the values does not hold exactly.
  const auto format = comm::compact_format_for<float, std::uint32_t>(8, 100, comm::entry_coding::compact8);
  std::vector<std::byte> payload(format.bytes());
  const std::vector<std::uint32_t> indices{1, 2};
  const std::vector<float> values{1.0f, 0.3f};
  const auto pack = [&] {
    comm::pack_compact<float, std::uint32_t>(indices, values, 100, 0, comm::wire_fields{}, format, payload);
  };
  CHECK_THROWS_WITH(pack(), doctest::Contains("entry 1's value 0.3"));
}

}  // namespace compact_test
