// Times the reduce-scatter exchange's sender and apply steps (pack_blocks over 8 simulated
// ranks, then one rank's round 3: check, update, give back) on the bundled real LSTM gradient, medians of 30:
// for before/after checks of changes to comm/reduce/, compiled by hand against
// each tree's include/ and run alternately (bench/BEFORE_AFTER.md):
//
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -fopenmp -DSIDCO_HIGHWAY=1 -DHWY_COMPILE_ONLY_STATIC=1
//     -DHWY_SHARED_DEFINE -ITREE/include bench/reduce_steps_timing.cpp -o steps -lhwy -lpthread   (one line)
//   ./steps examples/data/gradients/lstm_it10.npy
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>
using namespace sidco;
int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s GRADIENT.npy\n", argv[0]);
    return 2;
  }
  const auto g0 = io::load_npy<float>(argv[1]);
  const std::size_t n = g0.size(), ranks = 8;
  const auto plan = comm::plan_reduce<float, std::uint32_t>(std::vector<segment>{{0, n}}, 0.01, 1.25, ranks);
  std::vector<sparse_vector<float>> sent(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = g0[(i + r * 997) % n];
    presets::top_k<> c;
    c.compress(std::span<const float>(g), 0.01, sent[r]);
  }
  const std::size_t bytes = plan.format.bytes();
  std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(bytes * ranks));
  std::vector<float> residual(n, 0.f), dense(n);
  std::vector<double> pack_t, apply_t;
  for (int rep = 0; rep < 30; ++rep) {
    std::vector<sparse_vector<float>> copy = sent;
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t r = 0; r < ranks; ++r) {
      comm::host_residual<float> sink{std::span<float>(residual)};
      comm::pack_blocks(copy[r], plan, comm::wire_fields{}, sink, std::span<std::byte>(blocks[r]));
    }
    auto t1 = std::chrono::steady_clock::now();
    pack_t.push_back(std::chrono::duration<double>(t1 - t0).count());
    std::vector<std::vector<std::byte>> sel(ranks, std::vector<std::byte>(bytes));
    for (std::size_t j = 0; j < ranks; ++j) {
      std::vector<std::span<const std::byte>> rec;
      for (auto& b : blocks) rec.push_back(std::span<const std::byte>(b).subspan(j * bytes, bytes));
      comm::owner_top_k p;
      comm::reduce_report rep2;
      comm::owner_scratch<float, std::uint32_t> scratch;
      comm::select_owned<float, std::uint32_t>(rec, j, plan, comm::wire_fields{}, p, sel[j], rep2, scratch);
    }
    std::vector<std::span<const std::byte>> views(sel.begin(), sel.end());
    std::vector<std::uint32_t> global;
    std::vector<float> updates;
    comm::reduce_report report;
    auto t2 = std::chrono::steady_clock::now();
    // Round 3 as the MPI transport runs it: the check, the update, what goes back.
    comm::check_selections<float, std::uint32_t>(views, plan);
    comm::read_selections<float, std::uint32_t>(views, plan, global, updates, report);
    comm::host_residual<float> sink{std::span<float>(residual)};
    comm::give_back_unkept<float, std::uint32_t>(copy[0].indices(), copy[0].values(), global, sink);
    std::fill(dense.begin(), dense.end(), 0.0f);
    for (std::size_t j = 0; j < global.size(); ++j) dense[global[j]] = updates[j];
    auto t3 = std::chrono::steady_clock::now();
    apply_t.push_back(std::chrono::duration<double>(t3 - t2).count());
  }
  std::sort(pack_t.begin(), pack_t.end());
  std::sort(apply_t.begin(), apply_t.end());
  std::printf("n=%zu pack(8 ranks) median %.3f ms, apply median %.3f ms\n", n, pack_t[15] * 1e3, apply_t[15] * 1e3);
}
