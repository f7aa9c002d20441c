// The MPI exchanges at many ranks, under SimGrid's SMPI (a simulated platform, every rank a
// thread of one process): a dense MPI_Allreduce, the all-gather (comm/exchange.hpp) and the
// reduce-scatter exchange (comm/reduce_exchange.hpp; --mode reduce-exact: at the head the
// longest block uses, exchange_options::exact_sizes; --mode reduce-two-hop: through an
// intermediate of a sqrt(P) grid, exchange_options::schedule; reduce-two-hop-compact: its
// values rounded to bfloat16 and sent narrowed, exchange_options::coding (-compact8: to 8-bit
// codes, a byte each); allgather-compact
// and allgather-compact8: the all-gather's entries coded, bfloat16 or 8-bit values at the
// fixed size), step after step on synthetic gradients, each rank with SIDCo-E (or, --method
// top-k, exact Top-k, which keeps the exchange's losses apart from the estimate's) and error
// feedback. Per run it prints one JSON line:
//
//   sim_ms        simulated time per step (median over the timed steps of the time from
//                 the last rank's start to the last rank's end: MPI_Wtime is the
//                 simulation's clock, the same on every rank), communication only under
//                 --cfg=smpi/simulate-computation:no, with the ranks' compute otherwise
//   bytes_per_rank  what each rank hands its collectives per step, counted by wrapping them
//                 (MPI_Ialltoall, MPI_Allgather, ...: the bytes it sends to the other P - 1
//                 ranks; an allreduce counts a ring's 2 (P - 1) / P of its buffer; MPI_Isend
//                 its message), mean
//                 over ranks and steps; and that over 8k (k = delta N)
//   applied       entries the step applied (the global selection, the all-gather's union of
//                 selections, N for dense) over k: p5, median and p95 over the timed steps
//   identical     whether every rank applied the same update, bit for bit, at every step
//   phases        the two-hop schedule's phases in the last timed step (what a rank posted
//                 between two MPI_Waitall calls): [most messages a rank posted, most bytes,
//                 mean message bytes] each; bench/smpi_model.py predicts the time from them
//
// --fail-step S makes step S fail on one rank (--fail-rank, the last by default): its
// compress throws (--fail-how compress: it calls start_failed) or its wait() gets a dense one
// value short (--fail-how dense, the reduce modes: the all-gather has no round after its
// payloads to tell the others). The step is not timed, and the line adds failed_step,
// failing_rank, how, raised (how many ranks' wait() threw sidco::runtime_error), same_error
// (every rank's sentence the same), dense_kept (no rank's dense written) and error (rank 0's
// sentence); identical then covers the steps after it.
//
// The exchanges run their blocking collectives (exchange_options::overlap false; --overlap 1
// for the non-blocking ones, which SMPI runs as P^2 flat messages: a run at 256 ranks did not
// end in 15 minutes). Gradients (--gradient): iid (heavy-tailed magnitudes, 30% exact zeros, each rank and step
// its own draw) or hot (iid plus 32 rows of 64 values 50x larger, at rows every rank shares
// that move every step: an embedding's rows for this batch's tokens).
//
//   smpicxx -std=c++20 -O2 -I include bench/smpi_exchange.cpp -o smpi-exchange
//   smpirun -np 64 -platform bench/smpi/cluster-10gbps.xml -hostfile HOSTS
//     --cfg=smpi/coll-selector:ompi --cfg=smpi/simulate-computation:no ./smpi-exchange
//     --mode reduce --n 262144 --density 0.01 --gradient hot        (bench/smpi_exchange.sh runs a sweep)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <sidco/comm/exchange.hpp>
#include <sidco/comm/reduce_exchange.hpp>
#include <sidco/sidco.hpp>

// ----- what each rank hands its collectives (globals are per rank under SMPI)

namespace {
double sent_bytes = 0;

// The two-hop schedule's phases as this rank saw them: the messages it posted between one
// MPI_Waitall and the next (bench/smpi_model.py predicts a phase's time from them).
struct phase {
  double messages = 0, bytes = 0;
};
std::vector<phase> phases;
bool phase_open = false;

int peers() {
  int p = 1;
  PMPI_Comm_size(MPI_COMM_WORLD, &p);
  return p - 1;
}
double type_bytes(MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return double(size);
}
}  // namespace

extern "C" {
int MPI_Ialltoall(const void* send, int count, MPI_Datatype type, void* receive, int receive_count,
                  MPI_Datatype receive_type, MPI_Comm comm, MPI_Request* request) {
  sent_bytes += double(count) * type_bytes(type) * peers();
  return PMPI_Ialltoall(send, count, type, receive, receive_count, receive_type, comm, request);
}
int MPI_Alltoall(const void* send, int count, MPI_Datatype type, void* receive, int receive_count,
                 MPI_Datatype receive_type, MPI_Comm comm) {
  sent_bytes += double(count) * type_bytes(type) * peers();
  return PMPI_Alltoall(send, count, type, receive, receive_count, receive_type, comm);
}
int MPI_Iallgather(const void* send, int count, MPI_Datatype type, void* receive, int receive_count,
                   MPI_Datatype receive_type, MPI_Comm comm, MPI_Request* request) {
  sent_bytes += double(count) * type_bytes(type) * peers();
  return PMPI_Iallgather(send, count, type, receive, receive_count, receive_type, comm, request);
}
int MPI_Allgather(const void* send, int count, MPI_Datatype type, void* receive, int receive_count,
                  MPI_Datatype receive_type, MPI_Comm comm) {
  sent_bytes += double(count) * type_bytes(type) * peers();
  return PMPI_Allgather(send, count, type, receive, receive_count, receive_type, comm);
}
// The two-hop schedule's messages (exchange_options::schedule = two_hop).
int MPI_Isend(const void* send, int count, MPI_Datatype type, int to, int tag, MPI_Comm comm, MPI_Request* request) {
  sent_bytes += double(count) * type_bytes(type);
  if (!phase_open) phases.emplace_back();
  phase_open = true;
  phases.back().messages += 1;
  phases.back().bytes += double(count) * type_bytes(type);
  return PMPI_Isend(send, count, type, to, tag, comm, request);
}
int MPI_Waitall(int count, MPI_Request* requests, MPI_Status* statuses) {
  phase_open = false;
  return PMPI_Waitall(count, requests, statuses);
}
int MPI_Allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const int p = peers() + 1;
  sent_bytes += 2.0 * double(p - 1) / double(p) * double(count) * type_bytes(type);
  return PMPI_Allreduce(send, receive, count, type, op, comm);
}
}

namespace {

struct options {
  std::string mode = "reduce", gradient = "iid", method = "sidco-e";
  std::size_t n = std::size_t(1) << 18;
  double delta = 0.01;
  int warmup = 2, steps = 5;
  bool overlap = false;  // SMPI simulates non-blocking collectives as P^2 flat messages: slow past ~128 ranks
  int fail_step = -1, fail_rank = -1;  // -1: no step fails; the last rank
  std::string fail_how = "compress";
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--mode") o.mode = value;
    else if (flag == "--gradient") o.gradient = value;
    else if (flag == "--method") o.method = value;
    else if (flag == "--n") o.n = std::size_t(std::stoull(value));
    else if (flag == "--density") o.delta = std::stod(value);
    else if (flag == "--warmup") o.warmup = std::stoi(value);
    else if (flag == "--steps") o.steps = std::stoi(value);
    else if (flag == "--overlap") o.overlap = value == "1" || value == "yes";
    else if (flag == "--fail-step") o.fail_step = std::stoi(value);
    else if (flag == "--fail-rank") o.fail_rank = std::stoi(value);
    else if (flag == "--fail-how") o.fail_how = value;
    else throw std::invalid_argument("unknown option " + flag);
  }
  if (o.mode != "reduce" && o.mode != "reduce-exact" && o.mode != "reduce-two-hop" &&
      o.mode != "reduce-two-hop-compact" && o.mode != "reduce-two-hop-compact8" && o.mode != "allgather" &&
      o.mode != "allgather-compact" && o.mode != "allgather-compact8" && o.mode != "dense")
    throw std::invalid_argument("--mode " + o.mode +
                                " is not reduce, reduce-exact, reduce-two-hop, reduce-two-hop-compact, "
                                "reduce-two-hop-compact8, allgather, allgather-compact, allgather-compact8 or dense");
  if (o.method != "sidco-e" && o.method != "top-k")
    throw std::invalid_argument("--method " + o.method + " is not sidco-e or top-k");
  if (o.gradient != "iid" && o.gradient != "hot")
    throw std::invalid_argument("--gradient " + o.gradient + " is not iid or hot");
  if (o.steps < 1 || o.warmup < 0 || o.n < 64) throw std::invalid_argument("--steps, --warmup or --n out of range");
  if (o.fail_step >= o.warmup + o.steps)
    throw std::invalid_argument("--fail-step " + std::to_string(o.fail_step) + " is past the run's steps");
  if (o.fail_step >= o.warmup && o.steps < 2)
    throw std::invalid_argument("--fail-step at a timed step needs --steps 2 or more (the failed step is not timed)");
  if (o.fail_how != "compress" && o.fail_how != "dense")
    throw std::invalid_argument("--fail-how " + o.fail_how + " is not compress or dense");
  if (o.fail_step >= 0 && o.mode == "dense") throw std::invalid_argument("--fail-step needs an exchange, not --mode dense");
  // The all-gather has no round after its payloads: a dense of the wrong size fails on its rank alone.
  if (o.fail_step >= 0 && o.fail_how == "dense" && !o.mode.starts_with("reduce"))
    throw std::invalid_argument("--fail-how dense needs a reduce mode, not " + o.mode);
  return o;
}

// Rank r's gradient at step t (see the top of this file).
void gradient_at(std::vector<float>& g, const options& o, int rank, int step) {
  std::mt19937_64 rng(std::uint64_t(step) * 1000003u + std::uint64_t(rank) + 1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> spread(0.0f, 1.5f);
  for (auto& v : g) {
    const float keep = u(rng);
    v = keep < 0.3f ? 0.0f : (u(rng) < 0.5f ? -1.0f : 1.0f) * std::exp(spread(rng)) * 1e-3f;
  }
  if (o.gradient != "hot") return;
  constexpr std::size_t rows = 32, width = 64;
  std::mt19937_64 shared(std::uint64_t(step) * 7919u + 17);  // every rank's batch holds these rows
  const std::size_t row_count = o.n / width;
  for (std::size_t j = 0; j < rows; ++j) {
    const std::size_t row = std::size_t(shared() % row_count);
    for (std::size_t i = row * width; i < (row + 1) * width; ++i) g[i] = g[i] * 50.0f + 0.05f * (u(rng) - 0.5f);
  }
}

// FNV-1a over a buffer's bytes: a float vector's bits, a sentence's characters.
template <class Range>
std::uint64_t checksum(const Range& r) {
  std::uint64_t sum = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(std::data(r));
  for (std::size_t i = 0; i < std::size(r) * sizeof(*std::data(r)); ++i) sum = (sum ^ bytes[i]) * 0x100000001b3ull;
  return sum;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Every rank parses the same arguments, so every rank refuses them alike: no abort, which
  // SMPI reports as a deadlock of the ranks left.
  options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "smpi-exchange: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  if (o.fail_step >= 0 && o.fail_rank >= ranks) {
    if (rank == 0) std::fprintf(stderr, "smpi-exchange: --fail-rank %d is not one of the %d ranks\n", o.fail_rank, ranks);
    MPI_Finalize();
    return 2;
  }
  const int failing_rank = o.fail_rank >= 0 ? o.fail_rank : ranks - 1;
  int status = 0;
  try {
    const std::size_t n = o.n;
    const double k = double(sidco::target_count(o.delta, n));
    std::vector<float> gradient(n), dense(n);
    sidco::presets::sidco_e<> sidco_e;
    sidco::presets::top_k<> top_k;
    sidco::feedback::residual<float> residual(n);
    sidco::comm::exchange_options options;
    options.overlap = o.overlap;  // the blocking collectives: the library's algorithm for their size and P
    // reduce-exact: blocks and selections at the head the longest one uses (exchange_options::exact_sizes)
    // reduce-two-hop: both rounds through an intermediate of a sqrt(P) grid (exchange_options::schedule)
    const bool reducing = o.mode.starts_with("reduce");
    options.exact_sizes = o.mode == "reduce-exact";
    if (o.mode.ends_with("-compact")) options.coding = sidco::comm::entry_coding::compact;
    if (o.mode.ends_with("-compact8")) options.coding = sidco::comm::entry_coding::compact8;
    options.schedule = o.mode.starts_with("reduce-two-hop") ? sidco::comm::reduce_schedule::two_hop
                                                   : sidco::comm::reduce_schedule::flat;
    // Only the mode's exchange: the all-gather's receive buffer is P payloads a rank (27 GB in
    // all at 1,024 ranks and 2^18 values).
    std::optional<sidco::comm::sparse_exchange<float>> gather;
    std::optional<sidco::comm::sparse_reduce_exchange<float>> reduce;
    if (o.mode.starts_with("allgather")) gather.emplace(MPI_COMM_WORLD, n, o.delta, options);
    if (reducing) reduce.emplace(MPI_COMM_WORLD, n, o.delta, options);
    std::vector<double> times, applied;
    std::string phase_json;  // the last timed step's phases, over ranks
    double counted = 0;
    bool identical = true;
    // --fail-step: how many ranks raised there, whether the same sentence, whether every
    // rank's dense was left as it was, and rank 0's sentence.
    int raised_ranks = 0;
    bool same_error = false, dense_kept = false;
    std::string failure;
    for (int step = 0; step < o.warmup + o.steps; ++step) {
      gradient_at(gradient, o, rank, step);
      MPI_Barrier(MPI_COMM_WORLD);
      const double bytes_before = sent_bytes;
      phases.clear();
      phase_open = false;
      const double start = MPI_Wtime();
      double entries = double(n);
      if (o.mode == "dense") {
        MPI_Allreduce(gradient.data(), dense.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else {
        // --fail-step: on the failing rank its compress throws (before it changed anything),
        // or (--fail-how dense) its wait() gets a dense one value short.
        const bool failing = step == o.fail_step && rank == failing_rank;
        const std::uint64_t before = step == o.fail_step ? checksum(dense) : 0;  // only the failed step reads it
        sidco::sparse_vector<float> sent;
        try {
          if (failing && o.fail_how == "compress") {
            const sidco::runtime_error injected("smpi-exchange: this rank's compress failed (injected)");
            if (reducing) reduce->start_failed(injected, std::uint64_t(step));
            else gather->start_failed(injected, std::uint64_t(step));
          } else {
            if (o.method == "top-k") top_k.compress(gradient, o.delta, sent, residual);
            else sidco_e.compress(gradient, o.delta, sent, residual);
            if (reducing) reduce->start(sent, residual.values(), std::uint64_t(step));
            else gather->start(sent, residual.values(), std::uint64_t(step));
          }
          const std::span<float> into = failing && o.fail_how == "dense" ? std::span<float>(dense).first(n - 1)
                                                                         : std::span<float>(dense);
          entries = reducing ? double(reduce->wait(into).selected) : double(gather->wait(into).distinct);
        } catch (const sidco::runtime_error& e) {
          if (step != o.fail_step) throw;
          failure = e.what();
        }
        if (step == o.fail_step) {  // every rank raised the same sentence and wrote nothing
          int mine = failure.empty() ? 0 : 1;
          PMPI_Allreduce(&mine, &raised_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
          unsigned long long said = checksum(failure), low = said, high = said;
          PMPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
          PMPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
          same_error = low == high;
          int kept = checksum(dense) == before ? 1 : 0, all_kept = 0;
          PMPI_Allreduce(&kept, &all_kept, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
          dense_kept = all_kept == 1;
          continue;  // not timed
        }
      }
      const double end = MPI_Wtime(), step_bytes = sent_bytes - bytes_before;
      // SMPI's clock is the simulation's, one for every rank: the step lasts from the last
      // rank's start to the last rank's end. (Each rank's own end - start would add the
      // barrier's skew: at 256 ranks Open MPI's barrier lets ranks go 0.18 ms apart.)
      double span[2] = {start, end}, latest[2] = {0, 0};
      PMPI_Allreduce(span, latest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // not counted
      const double slowest = latest[1] - latest[0];
      // Every rank's update alike: the checksum's bits, their smallest and largest.
      unsigned long long low = checksum(dense), high = low;
      PMPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
      PMPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
      identical = identical && low == high;
      if (step < o.warmup) continue;
      times.push_back(slowest);
      applied.push_back(entries / k);
      double all_bytes = 0;
      PMPI_Allreduce(&step_bytes, &all_bytes, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      counted += all_bytes / double(ranks);
      // Each phase: the most messages and bytes a rank posted in it, and the mean message size.
      int count = int(phases.size()), most = 0;
      PMPI_Allreduce(&count, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      phases.resize(std::size_t(most));
      phase_json.clear();
      for (const phase& ph : phases) {
        double mine[2] = {ph.messages, ph.bytes}, largest[2] = {0, 0}, total[2] = {0, 0};
        PMPI_Allreduce(mine, largest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        PMPI_Allreduce(mine, total, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        char item[128];
        std::snprintf(item, sizeof item, "%s[%.0f, %.0f, %.1f]", phase_json.empty() ? "" : ", ", largest[0],
                      largest[1], total[0] > 0 ? total[1] / total[0] : 0.0);
        phase_json += item;
      }
    }
    if (rank == 0) {
      std::string failed;  // --fail-step: the failed step's fields
      if (o.fail_step >= 0) {
        std::string said;
        for (char c : failure) said += c == '"' || c == '\\' || c == '\n' ? ' ' : c;
        char fields[256];
        std::snprintf(fields, sizeof fields,
                      ", \"failed_step\": %d, \"failing_rank\": %d, \"how\": \"%s\", \"raised\": %d, "
                      "\"same_error\": %s, \"dense_kept\": %s, \"error\": \"",
                      o.fail_step, failing_rank, o.fail_how.c_str(), raised_ranks, same_error ? "true" : "false",
                      dense_kept ? "true" : "false");
        failed = fields + said + "\"";
      }
      const double per_rank = counted / double(times.size());
      std::printf("{\"mode\": \"%s\", \"gradient\": \"%s\", \"ranks\": %d, \"n\": %zu, \"delta\": %g, \"steps\": %d, "
                  "\"sim_ms\": %.4f, \"bytes_per_rank\": %.0f, \"bytes_over_8k\": %.3f, \"applied_p5\": %.3f, "
                  "\"applied_median\": %.3f, \"applied_p95\": %.3f, \"identical\": %s, \"method\": \"%s\", "
                  "\"phases\": [%s]%s}\n",
                  o.mode.c_str(), o.gradient.c_str(), ranks, n, o.delta, o.steps, quantile(times, 0.5) * 1e3, per_rank,
                  per_rank / (8.0 * k), quantile(applied, 0.05), quantile(applied, 0.5), quantile(applied, 0.95),
                  identical ? "true" : "false", o.method.c_str(), phase_json.c_str(), failed.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    status = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
