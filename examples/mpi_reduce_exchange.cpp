// The reduce-scatter exchange in a training loop: each rank compresses its gradient with
// SIDCo-E and error feedback, and every rank applies the same sparse update.
//   mpirun -np 4 build/examples/mpi-reduce-exchange
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include <sidco/comm/reduce_exchange.hpp>
#include <sidco/sidco.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::size_t n = 1 << 20;  // one tensor; a layout of segments for several
  const double delta = 0.01;
  sidco::comm::exchange_options options;
  options.trim_limit = 0.1;  // a rank that trims over 10% of what it sends fails the step
  sidco::comm::sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, n, delta, options);  // collective
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
      exchange.start(sent, residual.values(), step);  // what the owners cannot hold goes back to residual
    } catch (const std::exception& e) {
      exchange.start_failed(e, step);  // every rank's wait() raises it, naming this rank
    }
    try {
      const auto report = exchange.wait(update);  // update: the average of the global selection
      if (rank == 0)
        std::printf("step %llu: applied %zu of %zu entries, trimmed %zu, returned %zu, sent %zu bytes\n",
                    static_cast<unsigned long long>(step), report.selected, n, report.trimmed, report.returned,
                    report.bytes_sent);
      // Your optimizer applies update here: the same bits on every rank.
    } catch (const sidco::runtime_error& e) {  // the same error on every rank; the next step works
      if (rank == 0) std::printf("step %llu failed: %s\n", static_cast<unsigned long long>(step), e.what());
    }
  }
  MPI_Finalize();
}
