// Times the all-gather exchange's decode (every rank's payload added in rank order into the
// dense update) at 2 to 16 ranks on the bundled real LSTM gradient (each rank's SIDCo-E
// selection at δ = 0.01 of the gradient rotated and scaled), medians of 30, with a checksum
// of the update: for before/after checks of changes to it, compiled by hand against each
// tree's include/ (either layout: comm/wire.hpp's decode or comm/allgather/core.hpp's) and
// run alternately (bench/BEFORE_AFTER.md):
//
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -fopenmp -DSIDCO_HIGHWAY=1 -DHWY_COMPILE_ONLY_STATIC=1
//     -DHWY_SHARED_DEFINE -ITREE/include bench/decode_timing.cpp -o decode -lhwy -lpthread   (one line)
//   ./decode examples/data/gradients/lstm_it10.npy
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#if __has_include(<sidco/comm/allgather/core.hpp>)
#include <sidco/comm/allgather/core.hpp>
#endif
#include <sidco/comm/capacity.hpp>
#include <sidco/comm/wire.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>
using namespace sidco;
int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s GRADIENT.npy\n", argv[0]);
    return 2;
  }
  const auto g0 = io::load_npy<float>(argv[1]);
  const std::size_t n = g0.size();
  for (std::size_t ranks : {2, 4, 8, 16}) {
    const auto plan = comm::plan_capacity(std::vector<segment>{{0, n}}, 0.01, 1.25);
    const auto format = comm::format_for<float, std::uint32_t>(plan.total);
    std::vector<std::vector<std::byte>> payloads(ranks, std::vector<std::byte>(format.bytes()));
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = g0[(i + r * 997) % n] * (1.0f + 0.1f * float(r));
      sparse_vector<float> sent;
      presets::sidco_e<> c;
      c.compress(std::span<const float>(g), 0.01, sent);
      if (sent.size() > plan.total) sent.truncate(plan.total);
      comm::pack(sent, 0, comm::wire_fields{0, 0, 0.01, comm::reduction::average}, format, payloads[r]);
    }
    std::vector<std::span<const std::byte>> views(payloads.begin(), payloads.end());
    std::vector<float> dense(n);
    std::vector<double> t;
    for (int rep = 0; rep < 30; ++rep) {
      const auto a = std::chrono::steady_clock::now();
      comm::decode<float, std::uint32_t>(views, format, std::span<float>(dense));
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    double check = 0;
    for (float v : dense) check += v;
    std::printf("P=%zu decode median %.3f ms (checksum %.9g)\n", ranks, t[15] * 1e3, check);
  }
}
