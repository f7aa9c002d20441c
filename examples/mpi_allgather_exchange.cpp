// The one-round all-gather exchange in a training loop: each rank compresses its gradient
// with SIDCo-E and error feedback; every rank applies the rank-order average of every rank's
// entries.
//   mpirun -np 2 build/examples/mpi-allgather-exchange
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include <sidco/comm/exchange.hpp>
#include <sidco/sidco.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::size_t n = 1 << 20;
  const double delta = 0.01;
  sidco::comm::exchange_options options;
  options.coding = sidco::comm::entry_coding::compact;  // bfloat16 values, coded indices
  options.exact_sizes = true;                           // payloads at the size they use
  options.trim_limit = 0.1;
  sidco::comm::sparse_exchange<float> exchange(MPI_COMM_WORLD, n, delta, options);  // collective
  sidco::presets::sidco_e<> compressor;
  sidco::feedback::residual<float> residual(n);
  std::vector<float> gradient(n), update(n);
  for (std::uint64_t step = 0; step < 5; ++step) {
    std::mt19937 draw(unsigned(1000 * rank + step));  // your backward pass here
    std::exponential_distribution<float> magnitude(100.0f);
    for (float& g : gradient) g = (draw() & 1 ? 1.0f : -1.0f) * magnitude(draw);
    sidco::sparse_vector<float> sent;
    try {
      compressor.compress(gradient, delta, sent, residual);
      exchange.start(sent, residual.values(), step);  // trims to capacity, rounds to bfloat16: back to residual
    } catch (const std::exception& e) {
      exchange.start_failed(e, step);
    }
    try {
      const auto report = exchange.wait(update);
      if (rank == 0)
        std::printf("step %llu: %zu entries from %d ranks, %zu indices written, trimmed %zu, sent %zu bytes\n",
                    static_cast<unsigned long long>(step), report.entries, report.ranks, report.distinct,
                    report.trimmed, report.bytes);
    } catch (const sidco::runtime_error& e) {
      if (rank == 0) std::printf("step %llu failed: %s\n", static_cast<unsigned long long>(step), e.what());
    }
  }
  MPI_Finalize();
}
