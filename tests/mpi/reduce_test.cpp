// Run under mpirun with 2, 3 and 5 ranks: the reduce-scatter exchange (comm/reduce_exchange.hpp)
// gives every rank the same update, bit for bit, equal to the rank-order sum of what each
// rank sent for the indices the owners kept, divided by P; per rank, residual + applied
// contribution = gradient + old residual, bitwise; a failing rank makes every rank throw the
// same error with nothing lost, and so does a rank whose own wait() finds a problem or whose
// exchange is destroyed mid-step, after which the next steps work on every rank (and owners
// whose compressors fitted in a step that failed are put back as they were); an average
// whose sum overflows is finite; a resumed exchange repeats an uninterrupted one, and a state
// saved among other ranks is refused.
#include "../doctest.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <sidco/comm/reduce_exchange.hpp>
#include <sidco/sidco.hpp>

#include "ranks.hpp"
#include "wait_error.hpp"

using namespace sidco;

namespace {

// Each rank its own values; 30% exact zeros; mass concentrated in [0, n/4) when skewed.
std::vector<float> gradient_for(int rank, std::uint64_t step, std::size_t n, bool skewed = false) {
  std::vector<float> g(n);
  std::mt19937_64 rng(1000 * step + std::uint64_t(rank) + 17);
  std::uniform_real_distribution<double> u(0, 1);
  std::exponential_distribution<double> magnitude(1.0);
  for (std::size_t i = 0; i < n; ++i) {
    const double scale = skewed && i >= n / 4 ? 1e-3 : 1.0;
    g[i] = u(rng) < 0.3 ? 0.0f : float((u(rng) < 0.5 ? -1 : 1) * magnitude(rng) * scale);
  }
  return g;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every rank's copy of v, rank-major.
std::vector<float> gather_all(const std::vector<float>& v, MPI_Comm comm) {
  std::vector<float> all(v.size() * std::size_t(size_of(comm)));
  MPI_Allgather(v.data(), int(v.size()), MPI_FLOAT, all.data(), int(v.size()), MPI_FLOAT, comm);
  return all;
}

// Whether every rank of MPI_COMM_WORLD holds this text (its first 511 bytes).
bool same_on_every_rank(const std::string& message) {
  const int ranks = size_of(MPI_COMM_WORLD);
  std::vector<char> text(512, 0), texts(512 * std::size_t(ranks));
  std::copy_n(message.begin(), std::min<std::size_t>(message.size(), 511), text.begin());
  MPI_Allgather(text.data(), 512, MPI_CHAR, texts.data(), 512, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 1; r < ranks; ++r)
    if (std::memcmp(texts.data(), texts.data() + 512 * r, 512) != 0) return false;
  return true;
}

// An owner that fits SIDCo-E to every share. At these rank counts an owner's share is over
// direct_share (0.1) of what it receives, so the default owner runs the exact Top-k itself
// and its compressor never runs; at 2.0 it always fits (a share is at most the whole).
comm::owner_sidco_e fitting_owner() {
  comm::owner_sidco_e owner;
  owner.direct_share = 2.0;
  return owner;
}

// Steps 1 and 2 at density 0.01, so that the owners' compressors (fitting_owner()) and the
// compact codings' carry hold a state to keep; then the residual zeroed, and what the
// exchange saves.
template <class Exchange>
std::vector<std::byte> warm_up(Exchange& exchange, presets::sidco_e<>& compressor, feedback::residual<float>& residual) {
  const std::size_t n = residual.values().size();
  sparse_vector<float> sent;
  std::vector<float> dense(n);
  for (std::uint64_t step = 1; step <= 2; ++step) {
    compressor.compress(gradient_for(rank_in(MPI_COMM_WORLD), 10 + step, n), 0.01, sent, residual);
    exchange.start(sent, residual.values(), step);
    exchange.wait(dense);
  }
  residual.reset();
  return saved_state(exchange);
}

// How the blocks travel: flat at the fixed size, flat at the agreed head, in two hops, or in
// two hops in the compact coding (values rounded to bfloat16, sent narrowed) or compact8
// (values rounded to 8-bit codes, sent a byte each).
enum class transfer { fixed, exact, two_hop, two_hop_compact, two_hop_compact8 };

comm::exchange_options options_for(transfer how) {
  comm::exchange_options options;
  options.exact_sizes = how == transfer::exact;
  const bool hops = how == transfer::two_hop || how == transfer::two_hop_compact || how == transfer::two_hop_compact8;
  options.schedule = hops ? comm::reduce_schedule::two_hop : comm::reduce_schedule::flat;
  if (how == transfer::two_hop_compact) options.coding = comm::entry_coding::compact;
  if (how == transfer::two_hop_compact8) options.coding = comm::entry_coding::compact8;
  return options;
}

// What the two-hop schedule puts in messages: an 8-byte digest a message, a frame a payload
// (the count's code, a selection's trimmed count's code, 4 bytes a value (2 in the compact
// coding; 1 in compact8, after the scale's code), the indices' gap code); what passes through
// an intermediate travels twice.
// blocks[s][d]: the indices rank s sent rank d; owned[d]: those of d's selection.
std::size_t frame_bytes(const std::vector<std::uint32_t>& indices, std::size_t trimmed, bool selection,
                        std::size_t value_bytes = 4) {
  return comm::detail::varint_bytes(2 * indices.size()) + (selection ? comm::detail::varint_bytes(trimmed) : 0) +
         value_bytes * indices.size() + (value_bytes == 1 && !indices.empty() ? 1 : 0) +
         comm::detail::gap_code_bytes<std::uint32_t>(std::span<const std::uint32_t>(indices));
}

std::size_t two_hop_bytes(std::size_t me, const std::vector<std::vector<std::vector<std::uint32_t>>>& blocks,
                          const std::vector<std::vector<std::uint32_t>>& owned, std::size_t block_value_bytes) {
  const std::size_t ranks = owned.size();
  // An owner's selection carries what it left out of the union of the blocks it received.
  std::vector<std::size_t> left_out(ranks);
  for (std::size_t d = 0; d < ranks; ++d) {
    std::set<std::uint32_t> received;
    for (std::size_t s = 0; s < ranks; ++s) received.insert(blocks[s][d].begin(), blocks[s][d].end());
    left_out[d] = received.size() - owned[d].size();
  }
  // The compact coding narrows the owners' updates as it does the blocks' values.
  const auto selection_bytes = [&](std::size_t d) {
    return frame_bytes(owned[d], left_out[d], true, block_value_bytes);
  };
  const comm::grid_routes routes(ranks);
  std::size_t bytes = 0;
  for (const std::size_t peer : routes.neighbours(me)) {
    const auto through = routes.destinations(me, peer);  // phase 1, both rounds
    if (!through.empty()) bytes += 2 * 8 + selection_bytes(me);
    for (const std::size_t d : through) bytes += frame_bytes(blocks[me][d], 0, false, block_value_bytes);
    const auto from = routes.senders(me, peer);  // phase 2, both rounds
    if (!from.empty()) bytes += 2 * 8;
    for (const std::size_t s : from)
      bytes += frame_bytes(blocks[s][peer], 0, false, block_value_bytes) + selection_bytes(s);
  }
  return bytes;
}

// Runs steps of SIDCo-E + error feedback + the exchange on comm and checks every promise.
// skewed: the mass in a quarter of the tensor, and every rank compressing at 3 delta, so
// that blocks overflow. Returns the densities the global selection achieved.
template <class Policy>
std::vector<double> run_and_check(MPI_Comm comm, std::size_t n, double delta, int steps, bool skewed,
                                  transfer how = transfer::fixed, Policy policy = {}) {
  const int rank = rank_in(comm), ranks = size_of(comm);
  const comm::exchange_options options = options_for(how);
  comm::sparse_reduce_exchange<float, std::uint32_t, Policy> exchange(comm, std::vector<segment>{{0, n}}, delta, options,
                                                                      policy);
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  std::vector<double> densities;
  std::size_t trimmed = 0, returned = 0;
  std::vector<float> carry(n, 0.0f);  // the compact coding's: each index's owner's (comm/reduce/carry.hpp)
  for (int step = 0; step < steps; ++step) {
    const auto g = gradient_for(rank, std::uint64_t(step), n, skewed);
    const std::vector<float> old(residual.values().begin(), residual.values().end());
    sparse_vector<float> sent;
    compressor.compress(g, skewed ? 3 * delta : delta, sent, residual);
    exchange.start(sent, residual.values(), std::uint64_t(step));
    std::vector<float> dense(n, -1.0f);
    const auto report = exchange.wait(dense);
    trimmed += report.trimmed;
    returned += report.returned;
    // Every rank holds the same update.
    const auto all = gather_all(dense, comm);
    for (int r = 1; r < ranks; ++r)
      REQUIRE(std::memcmp(all.data(), all.data() + std::size_t(r) * n, n * sizeof(float)) == 0);
    // The update: for each index of the global selection, the rank-order sum of what every
    // rank's blocks held there, divided by P; 0 elsewhere.
    std::vector<float> mine(n, std::numeric_limits<float>::quiet_NaN());  // NaN: not sent
    for (std::size_t j = 0; j < sent.size(); ++j) mine[sent.indices()[j]] = sent.values()[j];
    const auto contributions = gather_all(mine, comm);
    const auto global = exchange.global_selection();
    REQUIRE(std::is_sorted(global.begin(), global.end()));
    std::vector<char> kept(n, 0);
    for (auto i : global) kept[i] = 1;
    std::vector<float> expected(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      if (!kept[i]) continue;
      float sum = 0.0f;
      for (int r = 0; r < ranks; ++r) {
        const float v = contributions[std::size_t(r) * n + i];
        if (!std::isnan(v)) sum = sum + v;
      }
      expected[i] = sum / float(ranks);
      if (options.coding == comm::entry_coding::compact) {  // narrowed, the rest carried by the owner
        const float t = expected[i] + carry[i];
        expected[i] = float(bfloat16(t));
        carry[i] = t - expected[i];
      }
    }
    if (options.coding == comm::entry_coding::compact8) {  // codes on the scale of the owner's largest update
      const std::size_t p = std::size_t(ranks);
      std::vector<std::vector<float>> totals(p);
      for (const auto i : global) totals[comm::owner_of(i, p)].push_back(expected[i] + carry[i]);
      std::vector<std::size_t> next(p, 0);
      for (const auto i : global) {
        const std::size_t owner = comm::owner_of(i, p);
        const auto scale = comm::byte_scale<float>::of(totals[owner]);
        const float t = totals[owner][next[owner]++];
        std::uint8_t code;
        float rounded;
        expected[i] = scale.encode(t, code, rounded) ? rounded : std::fabs(t) < scale.decode(1) ? 0.0f : t;
        carry[i] = t - expected[i];
      }
    }
    for (std::size_t i = 0; i < n; ++i) REQUIRE(std::memcmp(&dense[i], &expected[i], sizeof(float)) == 0);
    // Per rank, bitwise: residual + applied contribution = gradient + old residual.
    for (std::size_t i = 0; i < n; ++i) {
      const float applied = kept[i] && !std::isnan(mine[i]) ? mine[i] : 0.0f;
      REQUIRE(residual.values()[i] + applied == g[i] + old[i]);
    }
    densities.push_back(double(global.size()) / double(n));
    // On the wire: whole blocks and selections; or (exact sizes) every block and selection
    // at the size the longest block of any rank uses (64 + padded indices + values), and the
    // selections again at the longest one's if that is longer. Nothing to this rank.
    const comm::wire_format& format = exchange.plan().format;
    if (how == transfer::fixed) {
      CHECK(report.bytes_sent == 2 * std::size_t(ranks - 1) * format.bytes());
      continue;
    }
    std::size_t longest_block = 0;
    const std::size_t p = static_cast<std::size_t>(ranks);
    std::vector<std::vector<std::vector<std::uint32_t>>> blocks(p, std::vector<std::vector<std::uint32_t>>(p));
    for (int r = 0; r < ranks; ++r) {
      auto& to = blocks[std::size_t(r)];
      for (std::size_t i = 0; i < n; ++i)
        if (!std::isnan(contributions[std::size_t(r) * n + i]))
          to[comm::owner_of(i, std::size_t(ranks))].push_back(std::uint32_t(i));
      for (const auto& block : to) longest_block = std::max(longest_block, format.plain_bytes(block.size()));
    }
    std::vector<std::vector<std::uint32_t>> owners_indices(p);
    for (const auto i : global) owners_indices[comm::owner_of(i, p)].push_back(i);
    if (how == transfer::two_hop || how == transfer::two_hop_compact || how == transfer::two_hop_compact8) {
      const bool compact = how == transfer::two_hop_compact, bytes = how == transfer::two_hop_compact8;
      CHECK(report.bytes_sent == two_hop_bytes(std::size_t(rank), blocks, owners_indices, bytes ? 1 : compact ? 2 : 4));
      if (compact)  // what this rank sent was rounded to bfloat16 (the rest is in its residual)
        for (const float v : sent.values()) REQUIRE(float(bfloat16(v)) == v);
      if (bytes)  // ... or to 4 significant bits
        for (const float v : sent.values()) REQUIRE((std::bit_cast<std::uint32_t>(v) & 0xfffffu) == 0);
      continue;
    }
    std::vector<std::size_t> owned(p, 0);
    for (std::size_t d = 0; d < p; ++d) owned[d] = owners_indices[d].size();
    const std::size_t longest_selection = format.plain_bytes(*std::max_element(owned.begin(), owned.end()));
    const std::size_t selections = longest_selection <= longest_block ? longest_block : longest_block + longest_selection;
    CHECK(report.bytes_sent == std::size_t(ranks - 1) * (longest_block + selections));
    CHECK(report.bytes_sent <= 2 * std::size_t(ranks - 1) * format.bytes());
  }
  if (skewed && ranks > 1) CHECK(trimmed > 0);  // or the overflow path went untested
  (void)returned;
  return densities;
}

}  // namespace

TEST_CASE("the same update on every rank, the owners' rank-order sums; nothing lost per rank (SIDCo owners)") {
  const auto densities = run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 6, false);
  // At exact sizes (heads agreed by an all-reduce), and in two hops: the same selections,
  // step by step.
  CHECK(run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 6, false, transfer::exact) == densities);
  CHECK(run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 6, false, transfer::two_hop) == densities);
  // Rounded to bfloat16 and sent narrowed: other values, so other selections; every promise kept.
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 6, false, transfer::two_hop_compact);
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 6, false, transfer::two_hop_compact8);
  // The global selection aims at k = 400 (a few steps to adapt).
  std::vector<double> sorted(densities.begin() + 2, densities.end());
  std::sort(sorted.begin(), sorted.end());
  INFO("global density / target, steps 2-5: ", sorted.front() / 0.01, " ... ", sorted.back() / 0.01);
  CHECK(sorted.front() / 0.01 >= 0.8);
  CHECK(sorted.back() / 0.01 <= 1.25);
}

TEST_CASE("owners that fit SIDCo-E to every share (never the direct Top-k): every promise kept; a step failed in "
          "round 3 puts their compressors' state back") {
  const comm::owner_sidco_e fitting = fitting_owner();
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 4, false, transfer::fixed, fitting);
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 40000, 0.01, 4, false, transfer::two_hop, fitting);
  // Two exchanges over the same steps, one of them with a step between that fails in round 3
  // (the last rank's dense is short: every owner has selected, and its compressor has fitted).
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float> failing(MPI_COMM_WORLD, n, 0.01, options_for(transfer::two_hop), fitting),
      plain(MPI_COMM_WORLD, n, 0.01, options_for(transfer::two_hop), fitting);
  const std::vector<std::byte> fresh = saved_state(failing);
  presets::top_k<> top_k;  // the same sent entries for both exchanges, whatever the step
  sparse_vector<float> sent;
  std::vector<float> dense(n), plain_dense(n);
  const auto step = [&](comm::sparse_reduce_exchange<float>& exchange, std::uint64_t at, std::vector<float>& into) {
    top_k.compress(gradient_for(rank, at, n), 0.01, sent);
    exchange.start(sent, {}, at);
    return exchange.wait(into);
  };
  for (std::uint64_t at = 1; at <= 2; ++at) {
    step(failing, at, dense);
    step(plain, at, plain_dense);
  }
  const std::vector<std::byte> before = saved_state(failing);
  CHECK(before != fresh);  // the owners' compressors ran
  CHECK(saved_state(plain) == before);
  top_k.compress(gradient_for(rank, 3, n), 0.01, sent);
  failing.start(sent, {}, 3);
  std::vector<float> short_dense(rank == ranks - 1 ? n - 1 : n, 5.0f);
  const std::string message = wait_error(failing, short_dense);
  CHECK_MESSAGE(message.find("sparse_reduce_exchange: rank " + std::to_string(ranks - 1) + "'s dense: size " +
                             std::to_string(n - 1)) != std::string::npos,
                message);
  CHECK(saved_state(failing) == before);
  // The next steps: the same updates as the exchange that never met the failed step.
  for (std::uint64_t at = 4; at <= 5; ++at) {
    step(failing, at, dense);
    step(plain, at, plain_dense);
    CHECK(bits_equal(dense, plain_dense));
  }
  CHECK(saved_state(failing) == saved_state(plain));
}

TEST_CASE("exact Top-k owners; ranks selecting 3x the agreed density: blocks over capacity go back to the senders") {
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 30011, 0.02, 4, true);
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 30011, 0.02, 4, true, transfer::exact);
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 30011, 0.02, 4, true, transfer::two_hop);
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 30011, 0.02, 4, true, transfer::two_hop_compact);
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 30011, 0.02, 4, true, transfer::two_hop_compact8);
}

TEST_CASE("one rank alone, and tensors smaller than the rank count") {
  if (rank_in(MPI_COMM_WORLD) == 0) run_and_check<comm::owner_top_k>(MPI_COMM_SELF, 5000, 0.01, 3, false);
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 2, 0.5, 3, false);
  run_and_check<comm::owner_top_k>(MPI_COMM_WORLD, 1, 1.0, 2, false);
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 2, 0.5, 3, false, transfer::exact);
  run_and_check<comm::owner_sidco_e>(MPI_COMM_WORLD, 2, 0.5, 3, false, transfer::two_hop);
  if (rank_in(MPI_COMM_WORLD) == 0)
    run_and_check<comm::owner_top_k>(MPI_COMM_SELF, 5000, 0.01, 3, false, transfer::two_hop);
}

using fixed_size = std::integral_constant<transfer, transfer::fixed>;
using exact_size = std::integral_constant<transfer, transfer::exact>;
using two_hops = std::integral_constant<transfer, transfer::two_hop>;
using compact_two_hops = std::integral_constant<transfer, transfer::two_hop_compact>;
using compact8_two_hops = std::integral_constant<transfer, transfer::two_hop_compact8>;

// At exact sizes the failure's selections outgrow the blocks' head (the relayed message is
// longer than the failed rank's reason): the second all-gather carries them whole.
TEST_CASE_TEMPLATE("a rank whose compress fails: every rank throws naming it; every rank's sent entries go back", How,
                   fixed_size, exact_size, two_hops, compact_two_hops, compact8_two_hops) {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options_for(How::value), fitting_owner());
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const std::vector<std::byte> before = warm_up(exchange, compressor, residual);
  sparse_vector<float> sent;
  auto g = gradient_for(rank, 0, n);
  if (rank == 1) g[7] = std::numeric_limits<float>::infinity();
  try {
    compressor.compress(g, 0.01, sent, residual);
    exchange.start(sent, residual.values(), 3);
  } catch (const std::exception& e) {
    exchange.start_failed(e, 3);
  }
  std::vector<float> dense(n, 5.0f);
  std::string message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("exchange (tag 0, step 3): rank 1 failed: gradient + residual contains 1 non-finite") !=
                    std::string::npos,
                message);
  CHECK(dense == std::vector<float>(n, 5.0f));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == (rank == 1 ? 0.0f : g[i]));
  CHECK(saved_state(exchange) == before);  // the owners' state and carry as before the step
  // The exchange goes on.
  const auto fresh = gradient_for(rank, 1, n);
  compressor.compress(fresh, 0.01, sent, residual);
  exchange.start(sent, residual.values(), 4);
  CHECK(exchange.wait(dense).selected > 0);
}

TEST_CASE_TEMPLATE("a rank that hands start() a residual or a sparse vector of another size: every rank throws naming "
                   "it; the others' sent entries go back", How, fixed_size, two_hops) {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options_for(How::value), fitting_owner());
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const std::vector<std::byte> before = warm_up(exchange, compressor, residual);
  sparse_vector<float> sent;
  std::vector<float> short_residual(n - 1, 0.0f);
  const auto g = gradient_for(rank, 0, n);
  compressor.compress(g, 0.01, sent, residual);
  exchange.start(sent, rank == 1 ? std::span<float>(short_residual) : residual.values(), 3);
  std::vector<float> dense(n, 5.0f);
  std::string message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("exchange (tag 0, step 3): rank 1 failed: sparse_reduce_exchange: residual: size 19999 "
                             "is not the exchange's 20000") != std::string::npos,
                message);
  CHECK(same_on_every_rank(message));
  CHECK(dense == std::vector<float>(n, 5.0f));
  if (rank != 1)
    for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == g[i]);  // every entry back
  CHECK(short_residual == std::vector<float>(n - 1, 0.0f));                       // not the exchange's: untouched
  CHECK(saved_state(exchange) == before);
  // The next step: rank 1's sparse vector is of n + 1 values; refused alike, by name.
  const std::vector<float> longer(n + 1, 1.0f);
  presets::top_k<>{}.compress(rank == 1 ? std::span<const float>(longer) : std::span<const float>(g), 0.01, sent);
  exchange.start(sent, {}, 4);
  message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("exchange (tag 0, step 4): rank 1 failed: reduce-scatter exchange: the sparse vector's "
                             "dense size 20001 is not the exchange's 20000") != std::string::npos,
                message);
  CHECK(dense == std::vector<float>(n, 5.0f));
  CHECK(saved_state(exchange) == before);
  // The exchange goes on.
  compressor.compress(gradient_for(rank, 1, n), 0.01, sent, residual);
  exchange.start(sent, residual.values(), 5);
  CHECK(exchange.wait(dense).selected > 0);
}

TEST_CASE("a rank that trims more than exchange_options::trim_limit fails the step on every rank, loudly") {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD);
  comm::exchange_options options;
  options.trim_limit = 0.1;
  comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options);
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const auto g = gradient_for(rank, 0, n);
  sparse_vector<float> sent;
  compressor.compress(g, rank == 1 ? 0.05 : 0.01, sent, residual);  // rank 1 at 5x the agreed density
  exchange.start(sent, residual.values(), 0);
  std::vector<float> dense(n, 5.0f);
  std::string message = wait_error(exchange, dense);
  CHECK_MESSAGE(message.find("rank 1 failed: exchange: ") != std::string::npos, message);
  CHECK_MESSAGE(message.find("exceed the capacity, over exchange_options::trim_limit 0.1: compress at the exchange's "
                             "density 0.01, or raise exchange_options::slack") != std::string::npos,
                message);
  CHECK(dense == std::vector<float>(n, 5.0f));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == g[i]);  // every entry back
  comm::exchange_options bad;
  bad.trim_limit = 1.5;
  CHECK_THROWS_WITH_AS(comm::sparse_reduce_exchange<float>(MPI_COMM_WORLD, n, 0.01, bad),
                       doctest::Contains("exchange_options::trim_limit = 1.5 is outside [0, 1]"), runtime_error);
}

// At exact sizes and a density whose blocks are shorter than the error message, the failed
// selection outgrows the blocks' head: the message arrives whole by the second all-gather.
TEST_CASE_TEMPLATE("a dense of the wrong size on one rank's wait(): every rank raises it; the next steps work on every "
                   "rank", How, fixed_size, exact_size, two_hops, compact_two_hops, compact8_two_hops) {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  const double delta = How::value == transfer::exact ? 0.0005 : 0.01;
  comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, delta, options_for(How::value));
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const std::vector<std::byte> before = saved_state(exchange);
  const auto g = gradient_for(rank, 0, n);
  const std::vector<float> old(residual.values().begin(), residual.values().end());
  sparse_vector<float> sent;
  compressor.compress(g, delta, sent, residual);
  exchange.start(sent, residual.values(), 0);
  std::vector<float> dense(rank == ranks - 1 ? n - 1 : n, 5.0f);
  std::string message = wait_error(exchange, dense);
  const std::string expected = "rank " + std::to_string(ranks - 1) + " failed: sparse_reduce_exchange: rank " +
                               std::to_string(ranks - 1) + "'s dense: size " + std::to_string(n - 1);
  CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
  // The same error everywhere, nothing written, every entry back, the state as before.
  CHECK(same_on_every_rank(message));
  CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 5.0f; }));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == g[i] + old[i]);
  CHECK(saved_state(exchange) == before);
  // Three more steps: every rank applies the same update.
  dense.assign(n, 0.0f);
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const auto next = gradient_for(rank, step, n);
    compressor.compress(next, delta, sent, residual);
    exchange.start(sent, residual.values(), step);
    const auto report = exchange.wait(dense);
    CHECK(report.selected > 0);
    const auto all = gather_all(dense, MPI_COMM_WORLD);
    for (int r = 1; r < ranks; ++r)
      REQUIRE(std::memcmp(all.data(), all.data() + std::size_t(r) * n, n * sizeof(float)) == 0);
  }
}

TEST_CASE_TEMPLATE("an exchange destroyed between start() and wait() on one rank: every other rank's wait() raises, "
                   "none hangs", How, fixed_size, exact_size, two_hops, compact_two_hops, compact8_two_hops) {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const auto g = gradient_for(rank, 0, n);
  std::string message;
  try {
    comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options_for(How::value));
    sparse_vector<float> sent;
    compressor.compress(g, 0.01, sent, residual);
    exchange.start(sent, residual.values(), 0);
    if (rank == 0) throw std::runtime_error("the training loop threw");  // the exchange goes out of scope
    std::vector<float> dense(n);
    exchange.wait(dense);
  } catch (const std::exception& e) {
    message = e.what();
  }
  // Every rank is free again: a peer still in round 2 would never reach this barrier.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    CHECK(message == "the training loop threw");
  else
    CHECK_MESSAGE(message.find("rank 0 failed: sparse_reduce_exchange: rank 0's exchange was destroyed between start() "
                               "and wait()") != std::string::npos,
                  message);
  (void)ranks;
}

TEST_CASE("two hops: a rank at another step fails it on every rank with one message; every entry back; the next "
          "step works") {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options_for(transfer::two_hop));
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  const auto g = gradient_for(rank, 0, n);
  sparse_vector<float> sent;
  compressor.compress(g, 0.01, sent, residual);
  exchange.start(sent, residual.values(), rank == ranks - 1 ? 8 : 7);
  std::vector<float> dense(n, 5.0f);
  std::string message = wait_error(exchange, dense);
  if (ranks > 1) {
    CHECK_MESSAGE(message.find("than this rank's (ranks out of step?)") != std::string::npos, message);
    CHECK(same_on_every_rank(message));
    CHECK(dense == std::vector<float>(n, 5.0f));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(residual.values()[i] == g[i]);
  }
  const auto next = gradient_for(rank, 1, n);
  compressor.compress(next, 0.01, sent, residual);
  exchange.start(sent, residual.values(), 9);
  CHECK(exchange.wait(dense).selected > 0);
  const auto all = gather_all(dense, MPI_COMM_WORLD);
  for (int r = 1; r < ranks; ++r) REQUIRE(std::memcmp(all.data(), all.data() + std::size_t(r) * n, n * sizeof(float)) == 0);
}

TEST_CASE("an average whose sum overflows float is finite, the same on every rank") {
  const std::size_t n = 4000;
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float, std::uint32_t, comm::owner_top_k> exchange(MPI_COMM_WORLD, n, 0.01);
  sparse_vector<float> sent(n);
  sent.push_back(3, 2e38f);
  sent.push_back(std::uint32_t(100 + rank), 1.0f);
  exchange.start(sent, {}, 0);
  std::vector<float> dense(n, -1.0f);
  exchange.wait(dense);
  float expected = 0.0f;  // each divided first: the sum overflows
  for (int r = 0; r < ranks; ++r) expected = expected + 2e38f / float(ranks);
  CHECK(std::isfinite(dense[3]));
  CHECK(dense[3] == (ranks == 1 ? 2e38f : expected));
  const auto all = gather_all(dense, MPI_COMM_WORLD);
  for (int r = 1; r < ranks; ++r) REQUIRE(std::memcmp(all.data(), all.data() + std::size_t(r) * n, n * sizeof(float)) == 0);
}

TEST_CASE("a state saved among these ranks is refused by an exchange among others, with a sentence") {
  const int ranks = size_of(MPI_COMM_WORLD);
  comm::sparse_reduce_exchange<float> everyone(MPI_COMM_WORLD, 10000, 0.01);
  const std::vector<std::byte> saved = saved_state(everyone);
  comm::sparse_reduce_exchange<float> alone(MPI_COMM_SELF, 10000, 0.01);
  state_reader in(saved);
  std::string message;
  try {
    alone.load_state(in);
  } catch (const sidco::error& e) {
    message = e.what();
  }
  if (ranks > 1)
    CHECK_MESSAGE(message.find("saved for " + std::to_string(ranks) + " ranks and 10000 values; this exchange has 1 ranks") !=
                      std::string::npos,
                  message);
  else
    CHECK(message.empty());
}

// Three steps of SIDCo-E on this rank's gradients, each step's selection and residual given
// to every exchange alike; check(what each applied, its residual after, its report) per step.
template <class Check>
void run_alike(std::vector<comm::sparse_reduce_exchange<float>*> exchanges, std::size_t n, Check check) {
  const int rank = rank_in(MPI_COMM_WORLD);
  presets::sidco_e<> compressor;
  feedback::residual<float> residual(n);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto g = gradient_for(rank, step, n);
    sparse_vector<float> sent;
    compressor.compress(g, 0.01, sent, residual);
    std::vector<std::vector<float>> dense, residuals;
    std::vector<comm::reduce_report> reports;
    for (auto* exchange : exchanges) {
      auto mine = sent;
      residuals.emplace_back(residual.values().begin(), residual.values().end());
      dense.emplace_back(n);
      exchange->start(mine, residuals.back(), step);
      reports.push_back(exchange->wait(dense.back()));
    }
    check(dense, residuals, reports);
    std::copy(residuals[0].begin(), residuals[0].end(), residual.values().begin());
  }
}

TEST_CASE("blocking collectives (overlap = false) and two hops (the default) apply the non-blocking flat update, "
          "bit for bit") {
  const std::size_t n = 20000;
  comm::exchange_options blocking = options_for(transfer::fixed);
  blocking.overlap = false;
  comm::sparse_reduce_exchange<float> overlapped(MPI_COMM_WORLD, n, 0.01, options_for(transfer::fixed)),
      serial(MPI_COMM_WORLD, n, 0.01, blocking), hops(MPI_COMM_WORLD, n, 0.01);
  run_alike({&overlapped, &serial, &hops}, n, [](const auto& dense, const auto& residuals, const auto&) {
    for (const std::size_t other : {1, 2}) {
      REQUIRE(bits_equal(dense[0], dense[other]));
      REQUIRE(bits_equal(residuals[0], residuals[other]));
    }
  });
}

TEST_CASE("the compact codings: flat (values at full width) and two hops (narrowed) apply the same bits; a rank "
          "in another coding is refused by every rank's constructor") {
  const std::size_t n = 20000;
  const int rank = rank_in(MPI_COMM_WORLD);
  // Flat and two hops apply the same bits; the narrower coding sends fewer bytes: compact
  // against plain (4-byte values), compact8 against compact (a byte a value against two).
  for (const auto& [coding, narrow, wider] :
       {std::tuple{comm::entry_coding::compact, transfer::two_hop_compact, transfer::two_hop},
        std::tuple{comm::entry_coding::compact8, transfer::two_hop_compact8, transfer::two_hop_compact}}) {
    comm::exchange_options flat = options_for(transfer::fixed);
    flat.coding = coding;
    comm::sparse_reduce_exchange<float> wide(MPI_COMM_WORLD, n, 0.01, flat),
        hops(MPI_COMM_WORLD, n, 0.01, options_for(narrow)), other(MPI_COMM_WORLD, n, 0.01, options_for(wider));
    run_alike({&wide, &hops, &other}, n, [](const auto& dense, const auto& residuals, const auto& reports) {
      REQUIRE(bits_equal(dense[0], dense[1]));
      REQUIRE(bits_equal(residuals[0], residuals[1]));
      if (size_of(MPI_COMM_WORLD) > 1) CHECK(reports[1].bytes_sent < reports[2].bytes_sent);
    });
  }
  std::string message;
  try {
    comm::exchange_options mixed = options_for(transfer::two_hop);
    if (rank == 0) mixed.coding = comm::entry_coding::compact;
    comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, mixed);
  } catch (const std::exception& e) {
    message = e.what();
  }
  CHECK(same_on_every_rank(message));
  if (size_of(MPI_COMM_WORLD) > 1)
    CHECK_MESSAGE(message.find("compact") != std::string::npos, message);
  else
    CHECK(message.empty());
}

TEST_CASE("ranks whose densities or options differ are refused by every rank's constructor") {
  const auto refused = [](double delta, const comm::exchange_options& options) {
    try {
      comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, 10000, delta, options);
    } catch (const runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const bool last = rank_in(MPI_COMM_WORLD) == size_of(MPI_COMM_WORLD) - 1;
  std::string message = refused(last ? 0.02 : 0.01, {});
  CHECK_MESSAGE(message.find("has density 0.02, rank 0 has 0.01") != std::string::npos, message);
  // Options that would move payloads otherwise: refused the same way, each by name.
  const std::string rank = "rank " + std::to_string(size_of(MPI_COMM_WORLD) - 1);
  const std::pair<comm::exchange_options, std::string> differing[] = {
      {options_for(last ? transfer::exact : transfer::fixed),
       rank + " sends payloads at their exact size, rank 0 does not (exchange_options::exact_sizes)"},
      {options_for(last ? transfer::fixed : transfer::two_hop),
       rank + " moves its payloads flat, rank 0 in two hops (exchange_options::schedule)"}};
  for (const auto& [options, expected] : differing) {
    message = refused(0.01, options);
    CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
  }
}

TEST_CASE_TEMPLATE("resumed from saved state (owner policy and carry, compressor, residual): bit-identical", How,
                   fixed_size, compact_two_hops) {
  const std::size_t n = 25000;
  const int rank = rank_in(MPI_COMM_WORLD);
  const comm::exchange_options options = options_for(How::value);
  const auto run = [&](int from, int to, comm::sparse_reduce_exchange<float>& exchange, presets::sidco_e<>& compressor,
                       feedback::residual<float>& residual, std::vector<float>& last) {
    for (int step = from; step < to; ++step) {
      const auto g = gradient_for(rank, std::uint64_t(step), n);
      sparse_vector<float> sent;
      compressor.compress(g, 0.01, sent, residual);
      exchange.start(sent, residual.values(), std::uint64_t(step));
      last.assign(n, 0.0f);
      exchange.wait(last);
    }
  };
  // The default owners (at these rank counts the direct Top-k: their compressors never
  // run), and owners that fit every share, whose compressors' adaptive state must resume.
  for (const comm::owner_sidco_e& owner : {comm::owner_sidco_e{}, fitting_owner()}) {
    INFO("direct_share ", owner.direct_share);
    std::vector<float> whole, resumed;
    std::vector<std::byte> whole_state;
    {
      comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options, owner);
      presets::sidco_e<> compressor;
      feedback::residual<float> residual(n);
      run(0, 6, exchange, compressor, residual, whole);
      whole_state = saved_state(exchange);
    }
    state_writer saved;
    std::vector<float> saved_residual;
    {
      comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options, owner);
      presets::sidco_e<> compressor;
      feedback::residual<float> residual(n);
      run(0, 3, exchange, compressor, residual, resumed);
      exchange.save_state(saved);
      compressor.save_state(saved);
      saved_residual.assign(residual.values().begin(), residual.values().end());
    }
    comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, 0.01, options, owner);
    presets::sidco_e<> compressor;
    feedback::residual<float> residual(n);
    const auto bytes = saved.take();
    state_reader in(bytes);
    exchange.load_state(in);
    compressor.load_state(in);
    in.finish();
    std::copy(saved_residual.begin(), saved_residual.end(), residual.values().begin());
    run(3, 6, exchange, compressor, residual, resumed);
    CHECK(bits_equal(whole, resumed));
    // The owners' selections are exact Top-k whatever their state: their state shows in what
    // the exchange saves.
    CHECK(saved_state(exchange) == whole_state);
  }
}
