// Run under mpirun with 2 and 3 ranks: the sparse all-reduce equals the dense sum of what
// each rank selected, for unequal counts, empty selections and the dense fallback, blocking
// and not; mismatched inputs are an error on every rank.
#include "../doctest.hpp"

#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sidco/comm/sparse_allreduce.hpp>
#include <sidco/sidco.hpp>

#include "ranks.hpp"

using namespace sidco;

namespace {

// A different gradient on every rank (so counts differ); rank `empty_rank` sends nothing.
template <class T>
std::vector<T> gradient_for(int rank, std::size_t n, int empty_rank) {
  std::vector<T> g(n, T(0));
  if (rank == empty_rank) return g;
  std::mt19937_64 rng(1000 + std::uint64_t(rank));
  std::exponential_distribution<double> magnitude(100.0 * (rank + 1));
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& v : g) v = u(rng) < 0.3 ? T(0) : T((u(rng) < 0.5 ? -1 : 1) * magnitude(rng));
  return g;
}

// The reference: every rank's selection made dense, gathered, summed in rank order.
template <class T, class Index>
std::vector<T> dense_sum_of_selections(const sparse_vector<T, Index>& mine, std::size_t n) {
  std::vector<T> local(n, T(0));
  scatter_add(mine, std::span<T>(local));
  std::vector<T> all(n * std::size_t(size_of()));
  MPI_Allgather(local.data(), int(n), comm::detail::mpi_type<T>(), all.data(), int(n),
                comm::detail::mpi_type<T>(), MPI_COMM_WORLD);
  std::vector<T> sum(n, T(0));
  for (int r = 0; r < size_of(); ++r)
    for (std::size_t i = 0; i < n; ++i) sum[i] += all[std::size_t(r) * n + i];
  return sum;
}

template <class T, class Index>
void check_allreduce(double delta, int empty_rank, comm::path expected_path, bool blocking) {
  const std::size_t n = 20000;
  const auto g = gradient_for<T>(rank_in(), n, empty_rank);
  presets::sidco_e<> compressor;
  sparse_vector<T, Index> mine;
  compressor.template compress<T>(g, delta, mine);
  const auto expected = dense_sum_of_selections(mine, n);

  comm::sparse_allreducer<T, Index> allreducer(MPI_COMM_WORLD);
  std::vector<T> dense(n, T(-1));
  comm::allreduce_report report;
  if (blocking) {
    report = allreducer.allreduce(mine, delta, std::span<T>(dense), comm::reduction::sum);
  } else {
    allreducer.start(mine, delta, std::span<T>(dense), comm::reduction::sum);
    report = allreducer.wait();
  }
  CHECK(report.taken == expected_path);
  CHECK(report.ranks == size_of());
  CHECK(dense == expected);  // same additions in the same rank order: exactly equal

  std::vector<T> average(n);
  allreducer.allreduce(mine, delta, std::span<T>(average), comm::reduction::average);
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(average[i] == doctest::Approx(double(expected[i]) / size_of()).epsilon(1e-6));
}

}  // namespace

TEST_CASE_TEMPLATE("sparse all-reduce equals the dense sum of every rank's selection", T, float,
                   double) {
  for (bool blocking : {true, false}) {
    INFO("blocking ", blocking);
    check_allreduce<T, std::uint32_t>(0.01, -1, comm::path::sparse, blocking);
    check_allreduce<T, std::uint64_t>(0.01, -1, comm::path::sparse, blocking);
    check_allreduce<T, std::uint32_t>(0.01, 1, comm::path::sparse, blocking);  // rank 1 empty
  }
}

TEST_CASE("when the gathered entries would outweigh the dense vector, it reduces densely") {
  // delta 0.5 on every rank: P * 0.5 * (4 + 4) bytes per value > 4 bytes per value.
  check_allreduce<float, std::uint32_t>(0.5, -1, comm::path::dense, true);
  check_allreduce<float, std::uint32_t>(0.5, -1, comm::path::dense, false);
}

TEST_CASE("every rank sends nothing: the result is zero, not an error") {
  const std::size_t n = 1000;
  sparse_vector<float> mine(n);
  comm::sparse_allreducer<float> allreducer(MPI_COMM_WORLD);
  std::vector<float> dense(n, 3.f);
  const auto report = allreducer.allreduce(mine, 0.01, std::span<float>(dense));
  CHECK(report.gathered == 0);
  CHECK(dense == std::vector<float>(n, 0.f));
}

TEST_CASE("an allreducer destroyed with its gathers in flight completes them; the next call is exact") {
  const std::size_t n = 1 << 18;
  for (int round = 0; round < 3; ++round) {
    sparse_vector<float> mine(n);
    for (std::size_t i = std::size_t(rank_in()); i < n; i += 97) mine.push_back(std::uint32_t(i), 1.f);
    std::vector<float> dense(n);
    try {
      comm::sparse_allreducer<float> allreducer(MPI_COMM_WORLD);
      allreducer.start(mine, 0.01, std::span<float>(dense), comm::reduction::sum);
      throw std::runtime_error("between start and wait");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "between start and wait");
    }
    comm::sparse_allreducer<float> next(MPI_COMM_WORLD);
    std::vector<float> sum(n);
    next.allreduce(mine, 0.01, std::span<float>(sum), comm::reduction::sum);
    double total = 0;
    for (float v : sum) total += v;
    long expected = 0;
    for (int r = 0; r < size_of(); ++r) expected += long((n - std::size_t(r) + 96) / 97);
    CHECK(total == double(expected));
  }
}

TEST_CASE("mismatched inputs are a clear error on every rank, not a hang") {
  const int rank = rank_in();
  comm::sparse_allreducer<float> allreducer(MPI_COMM_WORLD);
  // Rank 1 has a longer vector.
  const std::size_t n = rank == 1 ? 101 : 100;
  sparse_vector<float> mine(n);
  mine.push_back(3, 1.f);
  std::vector<float> dense(n, 7.f);
  std::string message;
  try {
    allreducer.allreduce(mine, 0.01, std::span<float>(dense));
  } catch (const sidco::error& e) {
    message = e.what();
  }
  CHECK(message.find("rank 1 has dense size 101, rank 0 has 100") != std::string::npos);
  CHECK(dense == std::vector<float>(n, 7.f));  // untouched

  // Rank 1 asks for another density.
  sparse_vector<float> same(100);
  std::vector<float> out(100);
  message.clear();
  try {
    allreducer.allreduce(same, rank == 1 ? 0.02 : 0.01, std::span<float>(out));
  } catch (const sidco::error& e) {
    message = e.what();
  }
  CHECK(message.find("rank 1 has density 0.02, rank 0 has 0.01") != std::string::npos);

  // A dense buffer of the wrong size on one rank is an error everywhere too.
  std::vector<float> wrong(rank == 0 ? 99 : 100);
  message.clear();
  try {
    allreducer.allreduce(same, 0.01, std::span<float>(wrong));
  } catch (const sidco::error& e) {
    message = e.what();
  }
  CHECK(message.find("rank 0 passed a dense buffer") != std::string::npos);

  // Rank 1 sums where the others average: the header carries the reduction.
  message.clear();
  try {
    allreducer.allreduce(same, 0.01, std::span<float>(out), rank == 1 ? comm::reduction::sum : comm::reduction::average);
  } catch (const sidco::error& e) {
    message = e.what();
  }
  CHECK(message.find("rank 1 reduces by sum, rank 0 by average") != std::string::npos);

  // An index out of range on rank 1 where the dense path is taken (δ = 0.5): checked before
  // the headers, so every rank raises it instead of waiting in MPI_Iallreduce.
  sparse_vector<float> bad(100);
  bad.push_back(rank == 1 ? 150 : 5, 1.f);
  std::vector<float> kept(100, 7.f);
  message.clear();
  try {
    allreducer.allreduce(bad, 0.5, std::span<float>(kept));
  } catch (const sidco::error& e) {
    message = e.what();
  }
  CHECK(message.find("rank 1 failed: ") != std::string::npos);
  CHECK(message.find("this rank's sparse vector: index 150 at position 0 is out of range for dense size 100") !=
        std::string::npos);
  CHECK(kept == std::vector<float>(100, 7.f));

  // And the communicator still works afterwards.
  std::vector<float> fine(100);
  CHECK(allreducer.allreduce(same, 0.01, std::span<float>(fine)).gathered == 0);
}

TEST_CASE("a rank whose compress throws joins the exchange: every rank throws the same error") {
  // Rank 1's gradient holds a NaN (with one rank, rank 0's); the others' are fine, and
  // rank 2 (when there is one) selects nothing at all.
  const int rank = rank_in(), failing = size_of() > 1 ? 1 : 0;
  const std::size_t n = 5000;
  std::vector<float> g = gradient_for<float>(rank, n, 2);
  if (rank == failing) g[1234] = std::numeric_limits<float>::quiet_NaN();
  presets::sidco_e<> compressor;
  comm::sparse_allreducer<float> allreducer(MPI_COMM_WORLD);
  sparse_vector<float> mine;
  std::vector<float> dense(n, 5.f);
  std::string message;
  try {
    try {
      compressor.compress<float>(g, 0.01, mine);
    } catch (const sidco::error& e) {
      allreducer.allreduce_failed(e, n, 0.01);
    }
    allreducer.allreduce(mine, 0.01, std::span<float>(dense));
  } catch (const sidco::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("sparse_allreduce: rank " + std::to_string(failing) +
                     " failed: sidco: gradient contains 1 non-finite value(s); the first is nan at index 1234") !=
        std::string::npos);
  CHECK(dense == std::vector<float>(n, 5.f));  // untouched
  // The next exchange works.
  g[1234] = 0.f;
  compressor.compress<float>(g, 0.01, mine);
  CHECK(allreducer.allreduce(mine, 0.01, std::span<float>(dense)).ranks == size_of());
}
