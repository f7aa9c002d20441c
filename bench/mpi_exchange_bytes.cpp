// Bytes on the wire per rank per step of the MPI exchanges, counted by the kernel: every rank
// compresses a real gradient (the bundled LSTM gradient, each rank's copy scaled elementwise
// by its own noise so that the selections differ) with SIDCo-E and error feedback, and
// exchanges it with the one-round all-gather (comm/exchange.hpp; plain or compact entries,
// allgather-exact: compact payloads at their exact size; allgather-compact8 and
// allgather-compact8-exact: 8-bit values, fixed or exact sizes), the reduce-scatter
// exchange (comm/reduce_exchange.hpp; reduce-exact: at the head the longest block uses;
// reduce-two-hop: through an intermediate of a sqrt(P) grid, gap-coded frames;
// reduce-two-hop-compact: its values rounded to bfloat16 and sent narrowed; -compact8: to
// 8-bit codes, a byte each) or a dense MPI_Allreduce. Rank 0 reads the `lo` line
// of /proc/self/net/dev before and after the timed steps (between barriers): run it alone
// in a private network namespace with MPI's TCP transport, as scripts/mpi_exchange_bytes.sh
// does, so that the loopback carries these ranks' traffic and nothing else.
//
//   mpirun -np 8 --mca btl self,tcp sidco-mpi-exchange-bytes --mode reduce
//
// Prints one JSON line: mode, ranks, n, k, bytes per rank per step, that over 8k, and bytes
// per entry sent (all-gather: over P - 1 receivers).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <sidco/comm/exchange.hpp>
#include <sidco/comm/reduce_exchange.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>

#include "bundled_gradients.hpp"

namespace {

// Bytes the loopback transmitted, as the kernel counts them for this namespace (each byte a
// rank sends crosses it once).
std::uint64_t loopback_bytes() {
  std::ifstream dev("/proc/self/net/dev");
  std::string line;
  while (std::getline(dev, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.substr(0, colon).find("lo") == std::string::npos) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::uint64_t skip = 0, tx = 0;
    for (int i = 0; i < 8; ++i) fields >> skip;  // the receive side's eight counters
    fields >> tx;
    return tx;
  }
  throw std::runtime_error("/proc/self/net/dev has no lo line");
}

struct options {
  std::string mode = "reduce";
  std::string gradient = std::string(sidco::bundled::gradients_dir()) + "/lstm_it10.npy";
  double delta = 0.01;
  int warmup = 3;
  int steps = 5;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--mode") o.mode = value;
    else if (flag == "--gradient") o.gradient = value;
    else if (flag == "--density") o.delta = std::stod(value);
    else if (flag == "--warmup") o.warmup = std::stoi(value);
    else if (flag == "--steps") o.steps = std::stoi(value);
    else throw std::invalid_argument("unknown option " + flag);
  }
  if (o.mode != "reduce" && o.mode != "reduce-exact" && o.mode != "reduce-two-hop" &&
      o.mode != "reduce-two-hop-compact" && o.mode != "reduce-two-hop-compact8" && o.mode != "allgather" &&
      o.mode != "allgather-compact" && o.mode != "allgather-exact" && o.mode != "allgather-compact8" &&
      o.mode != "allgather-compact8-exact" && o.mode != "dense")
    throw std::invalid_argument("--mode " + o.mode +
                                " is not reduce, reduce-exact, reduce-two-hop, reduce-two-hop-compact, "
                                "reduce-two-hop-compact8, allgather, allgather-compact, allgather-exact, "
                                "allgather-compact8, allgather-compact8-exact or dense");
  return o;
}

// A rank's compressor and residual, kept across the warm-up and the counted steps.
struct sender {
  sidco::presets::sidco_e<> compressor;
  sidco::feedback::residual<float> residual;
};

// Returns the entries this rank sent (after trimming and, compact, rounding).
template <class Exchange>
std::size_t run_sparse(Exchange& exchange, sender& me, const std::vector<float>& gradient, double delta, int steps,
                       int first_step) {
  auto& [compressor, residual] = me;
  std::vector<float> dense(gradient.size());
  std::size_t entries = 0;
  for (int step = first_step; step < first_step + steps; ++step) {
    sidco::sparse_vector<float> sent;
    compressor.compress(gradient, delta, sent, residual);
    exchange.start(sent, residual.values(), std::uint64_t(step));
    exchange.wait(dense);
    entries += sent.size();
  }
  return entries;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    const auto o = parse(argc, argv);
    auto gradient = sidco::io::load_npy<float>(o.gradient);
    std::mt19937_64 rng(std::uint64_t(rank) + 1);
    std::normal_distribution<float> noise(1.0f, 0.3f);
    for (auto& g : gradient) g *= noise(rng);
    const std::size_t n = gradient.size();
    const std::vector<sidco::segment> layout{{0, n}};
    sender me{{}, sidco::feedback::residual<float>(n)};
    std::uint64_t before = 0, after = 0;
    std::size_t entries = 0;  // this rank's, in the counted steps
    const auto timed = [&](auto&& step_range) {
      step_range(0, o.warmup);
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) before = loopback_bytes();
      MPI_Barrier(MPI_COMM_WORLD);
      entries = step_range(o.warmup, o.steps);
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) after = loopback_bytes();
    };
    if (o.mode.starts_with("reduce")) {
      sidco::comm::exchange_options options;
      options.exact_sizes = o.mode == "reduce-exact";
      options.schedule = o.mode.starts_with("reduce-two-hop") ? sidco::comm::reduce_schedule::two_hop
                                                               : sidco::comm::reduce_schedule::flat;
      if (o.mode.ends_with("-compact")) options.coding = sidco::comm::entry_coding::compact;
      if (o.mode.ends_with("-compact8")) options.coding = sidco::comm::entry_coding::compact8;
      sidco::comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, layout, o.delta, options);
      timed([&](int first, int steps) { return run_sparse(exchange, me, gradient, o.delta, steps, first); });
    } else if (o.mode.starts_with("allgather")) {
      sidco::comm::exchange_options options;
      if (o.mode != "allgather") options.coding = sidco::comm::entry_coding::compact;
      if (o.mode.starts_with("allgather-compact8")) options.coding = sidco::comm::entry_coding::compact8;
      options.exact_sizes = o.mode == "allgather-exact" || o.mode == "allgather-compact8-exact";
      sidco::comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, layout, o.delta, options);
      timed([&](int first, int steps) { return run_sparse(exchange, me, gradient, o.delta, steps, first); });
    } else {
      std::vector<float> sum(n);
      timed([&](int, int steps) {
        for (int s = 0; s < steps; ++s)
          MPI_Allreduce(gradient.data(), sum.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return std::size_t(0);
      });
    }
    unsigned long long sent = entries, all_sent = 0;
    MPI_Reduce(&sent, &all_sent, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double per_rank = double(after - before) / double(o.steps) / double(ranks);
      const double k = double(std::size_t(o.delta * double(n)));
      // The all-gather carries each rank's entries to P - 1 others: bytes per entry sent
      // and delivered, headers and padding included (the reduce exchange moves owners'
      // sums too: its figure is per entry a rank sent, not per entry on the wire).
      const double entries_per_rank = double(all_sent) / double(o.steps) / double(ranks);
      const double per_entry = entries_per_rank > 0 && ranks > 1
                                   ? per_rank / (double(ranks - 1) * entries_per_rank) : 0.0;
      std::printf("{\"mode\": \"%s\", \"ranks\": %d, \"n\": %zu, \"k\": %.0f, \"bytes_per_rank\": %.0f, "
                  "\"over_8k\": %.3f, \"over_4n\": %.4f, \"entries_per_rank\": %.0f, \"bytes_per_entry\": %.3f}\n",
                  o.mode.c_str(), ranks, n, k, per_rank, per_rank / (8 * k), per_rank / (4.0 * double(n)),
                  entries_per_rank, per_entry);
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    status = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
