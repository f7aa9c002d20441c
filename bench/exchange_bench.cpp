// Google Benchmark suite for the exchanges' CPU work: the reduce-scatter exchange's owner side
// (comm/reduce/steps.hpp) and the all-gather's encode and decode in either entry coding
// (comm/allgather/core.hpp), the reduce exchange's frames (comm/reduce/frames.hpp), against
// their baseline in the same run: the local compress
// every rank runs before them.
// P ranks' gradients come from the bundled real LSTM gradient (3.69M values; see
// rank_gradient); every rank compresses with SIDCo-E at delta = 0.01 on one thread and packs
// its blocks by owner (comm/ownership.hpp).
// owner_select/P times every owner's select_owned over the blocks it received (checks,
// reduction in rank order, the default owner policy: SIDCo-E with exact_k), on one thread:
//
//   per_owner_ms          one owner's selection of the indices it owns
//   compress_ms           one rank's local compress (median of 5 calls, same run)
//   owner_over_compress   the two's ratio (issue 36's goal: <= 0.10)
//   received_over_k, union_over_k   entries the owners received, and their distinct
//                         indices (the union), summed over owners, over k
//
//   build/bench/sidco-exchange-bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <benchmark/benchmark.h>
#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/reduce/carry.hpp>
#include <sidco/comm/reduce/frames.hpp>
#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>

#include "bundled_gradients.hpp"

namespace {

using namespace sidco;
using local_compressor = presets::sidco_e<>;
using local_owner_compressor = presets::sidco_e_exact<>;
constexpr double delta = 0.01;

// Rank r's gradient: the real gradient scaled elementwise by noise (1 + 0.3 e), plus the
// same gradient rotated by a random offset (each rank's batch-specific part, drawn from the
// real values). The union of the ranks' selections fills in as on real shards: 1.3 k at 2
// ranks to 7.0 k at 32, where the WikiText-2 LSTM's shards give 1.5 k to 9.4 k
// (docs/RESULTS.md, fill-in).
std::vector<float> rank_gradient(const std::vector<float>& gradient, std::uint64_t rank) {
  std::mt19937_64 rng(rank + 1);
  std::normal_distribution<float> noise(1.0f, 0.3f);
  const std::size_t n = gradient.size(), shift = std::size_t(rng() % n);
  std::vector<float> g(gradient);
  for (std::size_t i = 0; i < n; ++i) g[i] = g[i] * noise(rng) + gradient[(i + shift) % n];
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Ranks 0 .. count - 1's selections of their gradients (rank_gradient) at density, SIDCo-E on
// one thread each; compress_seconds: the median of 5 timed compresses of rank 0's, the
// benches' baseline.
std::vector<sparse_vector<float>> compress_ranks(const std::vector<float>& gradient, std::size_t count,
                                                 double density, double& compress_seconds) {
  std::vector<sparse_vector<float>> local(count);
  std::vector<double> seconds;
  for (std::size_t r = 0; r < count; ++r) {
    const auto g = rank_gradient(gradient, r);
    local_compressor compressor({}, {}, backend::cpu(1));
    compressor.compress(std::span<const float>(g), density, local[r]);  // warm
    for (int c = 0; c < (r == 0 ? 5 : 0); ++c) {
      const auto start = std::chrono::steady_clock::now();
      compressor.compress(std::span<const float>(g), density, local[r]);
      seconds.push_back(seconds_since(start));
    }
  }
  std::sort(seconds.begin(), seconds.end());
  compress_seconds = seconds[seconds.size() / 2];
  return local;
}

// Every rank's blocks for one step, routed to their owners.
struct step_blocks {
  std::vector<std::vector<std::byte>> sent;  // per rank: P blocks
  std::vector<std::vector<std::span<const std::byte>>> received;  // per owner: P blocks in rank order
};

step_blocks pack_all(std::vector<sparse_vector<float>> selections, const comm::reduce_plan& plan) {
  const std::size_t ranks = plan.ranks, bytes = plan.format.bytes();
  step_blocks s;
  s.sent.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    s.sent[r].resize(bytes * ranks);
    comm::host_residual<float> none;
    comm::pack_blocks(selections[r], plan, comm::wire_fields{}, none, std::span<std::byte>(s.sent[r]));
  }
  s.received.assign(ranks, std::vector<std::span<const std::byte>>(ranks));
  for (std::size_t o = 0; o < ranks; ++o)
    for (std::size_t r = 0; r < ranks; ++r) s.received[o][r] = std::span<const std::byte>(s.sent[r]).subspan(o * bytes, bytes);
  return s;
}

void owner_select(benchmark::State& state) {
  static const auto gradient = io::load_npy<float>(std::string(bundled::gradients_dir()) + "/lstm_it10.npy");
  const std::size_t ranks = std::size_t(state.range(0)), n = gradient.size();
  const std::vector<segment> layout{{0, n}};
  const auto plan = comm::plan_reduce<float, std::uint32_t>(layout, delta, 1.25, ranks);

  double compress = 0;
  const auto local = compress_ranks(gradient, ranks, delta, compress);

  std::vector<comm::owner_sidco_e> policies(ranks, comm::owner_sidco_e{local_owner_compressor({}, {}, backend::cpu(1))});
  std::vector<comm::owner_scratch<float, std::uint32_t>> workspaces(ranks);  // each owner's, kept as the exchange keeps it
  const std::size_t bytes = plan.format.bytes();
  std::vector<std::byte> selections(bytes * ranks);
  std::vector<std::span<const std::byte>> selection_views(ranks);
  for (std::size_t o = 0; o < ranks; ++o) selection_views[o] = std::span<const std::byte>(selections).subspan(o * bytes, bytes);
  // Every owner selects from the blocks it received; returns how many entries they received.
  const auto select_all = [&](const step_blocks& blocks) {
    std::size_t received = 0;
    for (std::size_t o = 0; o < ranks; ++o) {
      comm::reduce_report mine;
      comm::select_owned<float, std::uint32_t>(blocks.received[o], o, plan, comm::wire_fields{}, policies[o],
                                                std::span<std::byte>(selections).subspan(o * bytes, bytes), mine,
                                                workspaces[o]);
      received += mine.received;
    }
    return received;
  };
  // A rank's decode of the owners' selections: the global selection's indices and the report.
  const auto apply_all = [&](std::vector<std::uint32_t>& global) {
    comm::reduce_report report;
    std::vector<float> updates;
    comm::check_selections<float, std::uint32_t>(selection_views, plan);
    comm::read_selections<float, std::uint32_t>(selection_views, plan, global, updates, report);
    return report;
  };

  std::vector<std::uint32_t> global;
  const auto blocks = pack_all(local, plan);

  double owner_seconds = 0;
  std::size_t received = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    received = select_all(blocks);
    owner_seconds += seconds_since(start);
    benchmark::ClobberMemory();
  }
  const std::size_t union_size = apply_all(global).union_size;
  const double per_owner = owner_seconds / double(state.iterations()) / double(ranks);
  state.counters["per_owner_ms"] = per_owner * 1e3;
  state.counters["compress_ms"] = compress * 1e3;
  state.counters["owner_over_compress"] = per_owner / compress;
  state.counters["received_over_k"] = double(received) / double(plan.target);
  state.counters["union_over_k"] = double(union_size) / double(plan.target);
}

// allgather_codec/C/P/D: one rank's all-gather encode of its selection plus the decode of P
// ranks' payloads (the whole exchange's CPU work on one rank, the collective aside), plain
// (C = 0), compact (C = 1, comm/compact.hpp) or compact8 (C = 2: 8-bit values), at density
// D / 1000 (10: the indices' gaps code; 100: Elias-Fano), on one thread, against the local
// compress in the same run:
//
//   codec_ms              encode + decode
//   compress_ms           one rank's local compress (median of 5 calls, same run)
//   codec_over_compress   the two's ratio (issue 56's goal for compact: <= 0.15)
//   payload_bytes         the payload's size (used_bytes: what its entries take)
//   index_code            what the compact payload coded its indices in (0 gaps, 1 Elias-Fano)
void allgather_codec(benchmark::State& state) {
  static const auto gradient = io::load_npy<float>(std::string(bundled::gradients_dir()) + "/lstm_it10.npy");
  const auto coding = comm::entry_coding(state.range(0));
  const std::size_t ranks = std::size_t(state.range(1)), n = gradient.size();
  const double density = double(state.range(2)) / 1000;
  comm::allgather_core<float> core({{0, n}}, density, 1.25, coding);
  double compress = 0;
  const auto local = compress_ranks(gradient, ranks, density, compress);
  const std::size_t bytes = core.format().bytes();
  std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(bytes));
  comm::host_residual<float> none;
  for (std::size_t r = 0; r < ranks; ++r) {
    auto copy = local[r];
    core.encode(copy, none, {}, payloads[r]);
  }
  const std::vector<std::span<const std::byte>> views(payloads.begin(), payloads.end());
  std::vector<float> dense(n);
  sparse_vector<float> sent(n);
  double codec_seconds = 0;
  for (auto _ : state) {
    sent = local[0];  // outside the timing: encode trims and rounds in place
    const auto start = std::chrono::steady_clock::now();
    core.encode(sent, none, {}, payloads[0]);
    core.decode(views, std::span<float>(dense), none);
    codec_seconds += seconds_since(start);
    benchmark::ClobberMemory();
  }
  const double codec = codec_seconds / double(state.iterations());
  state.counters["codec_ms"] = codec * 1e3;
  state.counters["compress_ms"] = compress * 1e3;
  state.counters["codec_over_compress"] = codec / compress;
  state.counters["payload_bytes"] = double(bytes);
  state.counters["used_bytes"] = double(core.used_bytes());
  state.counters["index_code"] = comm::header_of(payloads[0]).index_code;  // compact: 0 gaps, 1 Elias-Fano
}

// reduce_frames/C/P: one rank's round-1 framing of its P blocks (comm/reduce/frames.hpp:
// counts, values, gap-coded indices) plus the reading back of P frames as payloads, plain
// (C = 0), compact (C = 1: the values rounded to bfloat16 before packing, outside the
// timing, and sent narrowed) or compact8 (C = 2: rounded to 8-bit codes, sent a byte each
// after each frame's scale), on one thread, against the local compress in the same run:
//
//   codec_ms              framing + reading back
//   compress_ms           one rank's local compress (median of 5 calls, same run)
//   codec_over_compress   the two's ratio (issue 56's goal: <= 0.15)
//   frame_bytes_per_entry the frames' bytes over the entries they carry
void reduce_frames(benchmark::State& state) {
  static const auto gradient = io::load_npy<float>(std::string(bundled::gradients_dir()) + "/lstm_it10.npy");
  const auto coding = comm::entry_coding(state.range(0));
  const std::size_t ranks = std::size_t(state.range(1)), n = gradient.size();
  const std::vector<segment> layout{{0, n}};
  const auto plan = comm::plan_reduce<float, std::uint32_t>(layout, delta, 1.25, ranks);
  const auto g = rank_gradient(gradient, 0);
  local_compressor compressor({}, {}, backend::cpu(1));
  sparse_vector<float> sent;
  compressor.compress(std::span<const float>(g), delta, sent);  // warm
  std::vector<double> compress_seconds;
  for (int c = 0; c < 5; ++c) {
    const auto start = std::chrono::steady_clock::now();
    compressor.compress(std::span<const float>(g), delta, sent);
    compress_seconds.push_back(seconds_since(start));
  }
  std::sort(compress_seconds.begin(), compress_seconds.end());
  comm::host_residual<float> none;
  if (comm::is_compact(coding)) comm::round_for_compact(sent, none, none, coding);
  const std::size_t bytes = plan.format.bytes();
  std::vector<std::byte> blocks(bytes * ranks), back(bytes * ranks), frames;
  comm::pack_blocks(sent, plan, comm::wire_fields{}, none, std::span<std::byte>(blocks));
  const comm::frame_kind kind = comm::frame_kind_for(false, coding);
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>({}, n, plan.format);
  std::vector<std::size_t> ends(ranks);
  double codec_seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    frames.clear();
    for (std::size_t d = 0; d < ranks; ++d) {
      comm::append_frame<float, std::uint32_t>(std::span<const std::byte>(blocks).subspan(d * bytes, bytes),
                                               plan.format, kind, frames);
      ends[d] = frames.size();
    }
    for (std::size_t d = 0, begin = 0; d < ranks; begin = ends[d++])
      comm::read_frame<float, std::uint32_t>(std::span<const std::byte>(frames).subspan(begin, ends[d] - begin), header,
                                             plan.format, kind, std::span<std::byte>(back).subspan(d * bytes, bytes));
    codec_seconds += seconds_since(start);
    benchmark::ClobberMemory();
  }
  if (back != blocks) state.SkipWithError("frames did not read back as the blocks");
  const double codec = codec_seconds / double(state.iterations());
  const double compress = compress_seconds[compress_seconds.size() / 2];
  state.counters["codec_ms"] = codec * 1e3;
  state.counters["compress_ms"] = compress * 1e3;
  state.counters["codec_over_compress"] = codec / compress;
  state.counters["frame_bytes_per_entry"] = double(frames.size()) / double(std::max<std::size_t>(1, sent.size()));
}


// sum_runs/W/P/R: the fold of P ascending runs over N = 2^20 indices (comm/sum.hpp), as an
// owner adds the blocks it received and every rank merges the owners' selections: R = 0,
// P runs of k / P entries each (k = 0.01 N, the reduce exchange's shapes); R = 1, P runs of
// k each (the all-gather's). W: 0 the windowed walk, 1 the grouped one, 2 what sum_runs
// chooses. Indices are drawn from a hash-like spread, values uniform:
//
//   ns_per_entry          the fold's time over the entries it read
void sum_runs(benchmark::State& state) {
  constexpr std::size_t n = std::size_t(1) << 20, k = n / 100;
  const int walk = int(state.range(0));
  const std::size_t ranks = std::size_t(state.range(1));
  const std::size_t per_run = state.range(2) == 0 ? (k + ranks - 1) / ranks : k;
  std::mt19937_64 rng(ranks * 7 + per_run);
  std::uniform_int_distribution<std::uint32_t> index(0, n - 1);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<std::vector<std::uint32_t>> indices(ranks);
  std::vector<std::vector<float>> values(ranks);
  std::vector<comm::entry_run<float, std::uint32_t>> runs(ranks);
  std::size_t entries = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t e = 0; e < per_run; ++e) indices[r].push_back(index(rng));
    std::sort(indices[r].begin(), indices[r].end());
    indices[r].erase(std::unique(indices[r].begin(), indices[r].end()), indices[r].end());
    for (std::size_t e = 0; e < indices[r].size(); ++e) values[r].push_back(value(rng));
    runs[r] = {reinterpret_cast<const std::byte*>(indices[r].data()), reinterpret_cast<const std::byte*>(values[r].data()),
               indices[r].size()};
    entries += indices[r].size();
  }
  const std::span<const comm::entry_run<float, std::uint32_t>> view(runs);
  std::vector<std::uint32_t> out_index(entries);
  std::vector<float> out_value(entries);
  using writer = comm::detail::entry_writer<std::uint32_t, float>;
  const comm::detail::accumulate<float> add;
  for (auto _ : state) {
    const writer w{out_index.data(), out_value.data(), 0};
    std::size_t written = 0;
    if (walk == 0) written = comm::detail::fold_runs_windowed<float, std::uint32_t, float>(view, 0, n, add, w).count;
    else if (walk == 1) written = comm::detail::fold_runs_grouped<float, std::uint32_t, float>(view, 0, n, add, w).count;
    else written = comm::sum_runs<float, std::uint32_t>(view, 0, n, w).count;
    benchmark::DoNotOptimize(written);
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_entry"] =
      benchmark::Counter(double(entries) * double(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["grouped_chosen"] = comm::detail::fold_grouped(view, 0, n) ? 1 : 0;
}

// reduce_rank/P: one rank's whole CPU share of a reduce-exchange step at P ranks, the
// collectives aside, on the bundled LSTM gradient (delta = 0.01, SIDCo-E locally, the default
// owner policy): its pack into P blocks, the frames of the two-hop schedule (its P blocks
// framed, P frames read back), its owner's selection over the P blocks it received, and the
// decode of the P owners' selections. 16 ranks' selections are compressed from their
// gradients; rank r >= 16 sends rank r % 16's selection rotated by a rank-specific offset
// (so the owners receive P distinct selections without P compresses). Counters: each part's
// ms, their sum, and the sum over the local compress (median of 5, same run):
//
//   pack_ms frames_ms select_ms apply_ms step_ms compress_ms step_over_compress
//
// reduce_rank_coded/compact/P: the same in the compact coding (values rounded at pack, what
// rounding left off given back in apply, frames with narrowed values, the owner's carry);
// reduce_rank_coded/compact8/P: in compact8 (8-bit codes on each rank's and owner's scale).
void reduce_rank_coded(benchmark::State& state, comm::entry_coding coding) {
  static const auto gradient = io::load_npy<float>(std::string(bundled::gradients_dir()) + "/lstm_it10.npy");
  const std::size_t ranks = std::size_t(state.range(0)), n = gradient.size();
  const std::vector<segment> layout{{0, n}};
  constexpr std::size_t distinct = 16;
  double compress = 0;
  const auto base = compress_ranks(gradient, std::min(ranks, distinct), delta, compress);
  std::vector<sparse_vector<float>> local(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& from = base[r % distinct];
    if (r < distinct) {
      local[r] = from;
      continue;
    }
    const std::size_t offset = (r / distinct) * 2654435761u % n;
    std::vector<std::pair<std::uint32_t, float>> moved;
    for (std::size_t e = 0; e < from.size(); ++e)
      moved.emplace_back(std::uint32_t((from.indices()[e] + offset) % n), from.values()[e]);
    std::sort(moved.begin(), moved.end());
    local[r] = sparse_vector<float>(n);
    for (const auto& [i, v] : moved) local[r].push_back(i, v);
  }
  comm::exchange_options options;
  options.coding = coding;
  comm::reduce_core<float, std::uint32_t, comm::owner_sidco_e> core(layout, delta, ranks, 0, options);
  const auto& plan = core.plan();
  const std::size_t bytes = plan.format.bytes();
  // Every owner's selection of this step (untimed): the decode's input.
  std::vector<std::byte> selections(bytes * ranks);
  std::vector<std::byte> owned;  // the blocks rank 0 owns, one per rank
  {
    const auto blocks = pack_all(local, plan);
    owned.resize(bytes * ranks);
    for (std::size_t r = 0; r < ranks; ++r) std::copy_n(blocks.received[0][r].data(), bytes, owned.data() + r * bytes);
    for (std::size_t o = 0; o < ranks; ++o) {
      comm::owner_sidco_e policy{local_owner_compressor({}, {}, backend::cpu(1))};
      comm::owner_scratch<float, std::uint32_t> scratch;
      comm::reduce_report report;
      comm::select_owned<float, std::uint32_t>(blocks.received[o], o, plan, comm::wire_fields{}, policy,
                                                std::span<std::byte>(selections).subspan(o * bytes, bytes), report,
                                                scratch);
    }
  }
  std::vector<std::span<const std::byte>> owned_views(ranks), selection_views(ranks), frames;
  for (std::size_t r = 0; r < ranks; ++r) {
    owned_views[r] = std::span<const std::byte>(owned).subspan(r * bytes, bytes);
    selection_views[r] = std::span<const std::byte>(selections).subspan(r * bytes, bytes);
  }
  std::vector<std::byte> blocks(bytes * ranks), back(bytes * ranks), frame_bytes, selection(bytes);
  std::vector<float> residual(n);
  comm::host_residual<float> sink{std::span<float>(residual)};
  const comm::frame_kind kind = comm::frame_kind_for(false, core.coding());
  const comm::wire_header header = comm::detail::header_for<float, std::uint32_t>({}, n, plan.format);
  sparse_vector<float> sent;
  double pack = 0, framing = 0, select = 0, apply = 0;
  for (auto _ : state) {
    sent = local[0];  // pack trims in place
    auto start = std::chrono::steady_clock::now();
    core.pack(sent, sink, comm::wire_fields{}, std::span<std::byte>(blocks));
    pack += seconds_since(start);
    start = std::chrono::steady_clock::now();
    comm::append_frames<float, std::uint32_t>(blocks, ranks, plan.format, kind, frame_bytes, frames);
    comm::read_frames<float, std::uint32_t>(frames, header, plan.format, kind,
                                            [&](std::size_t r) { return std::span<std::byte>(back).subspan(r * bytes, bytes); });
    framing += seconds_since(start);
    start = std::chrono::steady_clock::now();
    core.select(owned_views, std::span<std::byte>(selection));
    select += seconds_since(start);
    start = std::chrono::steady_clock::now();
    core.apply(selection_views, sink);
    apply += seconds_since(start);
    benchmark::ClobberMemory();
  }
  const double iterations = double(state.iterations());
  const double step = (pack + framing + select + apply) / iterations;
  state.counters["pack_ms"] = pack / iterations * 1e3;
  state.counters["frames_ms"] = framing / iterations * 1e3;
  state.counters["select_ms"] = select / iterations * 1e3;
  state.counters["apply_ms"] = apply / iterations * 1e3;
  state.counters["step_ms"] = step * 1e3;
  state.counters["compress_ms"] = compress * 1e3;
  state.counters["step_over_compress"] = step / compress;
}

void reduce_rank(benchmark::State& state) { reduce_rank_coded(state, comm::entry_coding::plain); }

// owner_carry/CODING/P: the owner carry of a compact coding (comm/reduce/carry.hpp) on owner 0
// of P ranks, against the local compress in the same run: its pass over a selection of k / P
// updates (each plus its carry, rounded to bfloat16 or, in compact8, to an 8-bit code on the
// scale of the largest, the rest kept), and the snapshot of the
// exchange's state that checkpoints and the hook's nonfinite="skip" take, in the worst case:
// every index the owner owns carrying.
//
//   apply_ms              the pass over one selection (commit included)
//   save_ms               the carry's part of save_state (a scan of the dense size, 8 bytes
//                         a carried index)
//   compress_ms           one rank's local compress (median of 5 calls, same run)
//   apply_over_compress, save_over_compress   the ratios
void owner_carry(benchmark::State& state, comm::entry_coding coding) {
  static const auto gradient = io::load_npy<float>(std::string(bundled::gradients_dir()) + "/lstm_it10.npy");
  const std::size_t ranks = std::size_t(state.range(0)), n = gradient.size();
  double compress = 0;
  const auto local = compress_ranks(gradient, 1, delta, compress);
  // Owner 0's selection: the entries of rank 0's that it owns, at the plan's capacity.
  std::vector<std::uint32_t> indices;
  std::vector<float> values;
  for (std::size_t e = 0; e < local[0].size(); ++e)
    if (comm::owner_of(local[0].indices()[e], ranks) == 0) {
      indices.push_back(local[0].indices()[e]);
      values.push_back(local[0].values()[e] / float(ranks));
    }
  const auto format = comm::format_for<float, std::uint32_t>(indices.size());
  std::vector<std::byte> selection(format.bytes()), packed(format.bytes());
  comm::pack<float, std::uint32_t>(indices, values, n, 0, {}, format, packed);
  comm::owner_carry<float, std::uint32_t> carry;
  double apply_seconds = 0;
  for (auto _ : state) {
    selection = packed;  // outside the timing: apply rounds in place
    const auto start = std::chrono::steady_clock::now();
    carry.apply(selection, format, n, coding);
    carry.commit();
    apply_seconds += seconds_since(start);
    benchmark::ClobberMemory();
  }
  // The worst case for the snapshot: every index owner 0 owns carrying.
  state_writer every;
  std::size_t owned = 0;
  for (std::size_t i = 0; i < n; ++i) owned += comm::owner_of(i, ranks) == 0;
  every.word(owned);
  every.word(2);  // layout: index and value, a word each
  for (std::size_t i = 0; i < n; ++i)
    if (comm::owner_of(i, ranks) == 0) {
      every.word(i);
      every.number(std::ldexp(1.0, -20));
    }
  {
    const auto bytes = every.take();
    state_reader in(bytes);
    carry.load(in, n);
  }
  std::vector<double> saves;
  for (int c = 0; c < 5; ++c) {
    state_writer out;
    const auto start = std::chrono::steady_clock::now();
    carry.save(out);
    saves.push_back(seconds_since(start));
    benchmark::DoNotOptimize(out.bytes().data());
  }
  std::sort(saves.begin(), saves.end());
  const double apply = apply_seconds / double(state.iterations()), save = saves[saves.size() / 2];
  state.counters["apply_ms"] = apply * 1e3;
  state.counters["save_ms"] = save * 1e3;
  state.counters["compress_ms"] = compress * 1e3;
  state.counters["apply_over_compress"] = apply / compress;
  state.counters["save_over_compress"] = save / compress;
}

}  // namespace

BENCHMARK(owner_select)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond);
BENCHMARK(allgather_codec)->ArgsProduct({{0, 1, 2}, {1, 4, 16}, {10, 100}})->Unit(benchmark::kMillisecond);
BENCHMARK(reduce_frames)->ArgsProduct({{0, 1, 2}, {4, 16, 64}})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(owner_carry, compact, comm::entry_coding::compact)->Arg(4)->Arg(16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(owner_carry, compact8, comm::entry_coding::compact8)->Arg(4)->Arg(16)->Unit(benchmark::kMillisecond);
BENCHMARK(reduce_rank)->Arg(4)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(reduce_rank_coded, compact, comm::entry_coding::compact)
    ->Arg(4)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(reduce_rank_coded, compact8, comm::entry_coding::compact8)
    ->Arg(4)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(sum_runs)->ArgsProduct({{0, 1, 2}, {4, 16, 64, 256, 1024}, {0}})->Unit(benchmark::kMicrosecond);
BENCHMARK(sum_runs)->ArgsProduct({{0, 1, 2}, {2, 4, 16, 64}, {1}})->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
