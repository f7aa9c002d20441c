// The NCCL sparse all-reduce in one process over every visible GPU (one rank each): the
// result equals the rank-order sum of what each rank sent, on every rank, bit for bit;
// uneven and empty counts; the dense fallback; mismatched sizes and a failing rank make
// every rank throw the same error. Then the all-gather exchange over NCCL (nccl_exchange) on
// a real gradient in two layers with a capacity that trims, float, __half and
// __nv_bfloat16, plain, plain at exact sizes, compact and compact8: every rank's dense update and
// residual have the bits the host core gives (as the MPI exchange and the hook run it); a
// failing rank and a short output on one rank make every rank throw the same error with its
// entries back in its residual. With one GPU the ranks are one (the multi-rank checks say so
// and are skipped); without a GPU the program exits 77 (skipped).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sidco/backend/cuda.cuh>
#include <sidco/comm/nccl.cuh>
#include <sidco/comm/nccl_exchange.cuh>
#include <sidco/sidco.hpp>

#include "../support.hpp"
#include "device.hpp"
#include "exchange_checks.hpp"
#include "ranks.hpp"

using namespace sidco;

using test::download;
using test::expect;
using test::on_every_rank;
using test::same_bits;

namespace {

// One step of nccl_exchange<D> on every rank against the host core's bits: the gradient in
// two layers, capacity slack 1 (Top-k over the whole gradient sends more than a layer's k to one of
// them: what is trimmed goes back; about 4,000 of 9,000 entries on rank 0).
template <class D>
void exchange_step(const std::vector<ncclComm_t>& comms, const std::vector<float>& gradient, const char* type,
                   comm::entry_coding coding, bool exact_sizes) {
  using H = host_value_t<D>;
  const int ranks = int(comms.size());
  const std::size_t n = gradient.size();
  const double delta = 0.01;
  const std::vector<segment> layout{{0, n / 3}, {n / 3, n - n / 3}};
  comm::exchange_options options;
  options.slack = 1.0;
  options.coding = coding;
  options.exact_sizes = exact_sizes;
  std::vector<test::rank_input<H>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(test::input_of<H>(gradient, r, delta));
  // The host core's step, every rank simulated here.
  std::vector<comm::allgather_core<H>> cores;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::vector<H>> residual_ref(static_cast<std::size_t>(ranks)), dense_ref(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    cores.emplace_back(layout, delta, options.slack, coding);
    payloads.emplace_back(cores.back().format().bytes());
    auto sent = inputs[std::size_t(r)].sent;
    residual_ref[std::size_t(r)] = inputs[std::size_t(r)].residual;
    comm::host_residual<H> sink{std::span<H>(residual_ref[std::size_t(r)])};
    cores.back().encode(sent, sink, comm::wire_fields{options.tag, 0, delta, options.op},
                        std::span<std::byte>(payloads.back()));
  }
  const std::vector<std::span<const std::byte>> views(payloads.begin(), payloads.end());
  std::size_t trimmed = 0;
  for (int r = 0; r < ranks; ++r) {
    dense_ref[std::size_t(r)].assign(n, H(0.f));
    comm::host_residual<H> sink{std::span<H>(residual_ref[std::size_t(r)])};
    trimmed = cores[std::size_t(r)].decode(views, std::span<H>(dense_ref[std::size_t(r)]), sink).trimmed;
  }
  expect(trimmed > 0, std::string(type) + ": the capacity trims (the test checks what it says)");
  const std::string name = std::string(type) + ", " + comm::coding_name(std::uint8_t(coding)) +
                           (exact_sizes ? ", exact sizes" : "");
  std::vector<test::raised> raised(static_cast<std::size_t>(ranks));
  on_every_rank(ranks, [&](int r) {
    const std::string who = name + ", rank " + std::to_string(r) + ": ";
    const test::rank_input<H>& in = inputs[std::size_t(r)];
    sparse_vector<D, std::uint32_t, memory::device> sent;
    memory::device_buffer<D> residual, dense(n);
    comm::nccl_exchange<D> exchange(comms[std::size_t(r)], layout, delta, options);
    test::upload(in, n, sent, residual);
    const comm::exchange_report report = exchange.exchange(sent, residual.view(), dense.view(), 0);
    expect(same_bits(download(dense), dense_ref[std::size_t(r)]), who + "dense has the host core's bits");
    expect(same_bits(download(residual), residual_ref[std::size_t(r)]), who + "residual has the host core's bits");
    expect(report.ranks == ranks && report.trimmed > 0, who + "report");
    if (comm::is_compact(coding) || exact_sizes)
      expect(report.bytes < exchange.format().bytes(), who + "payloads sent at the head they use");
    raised[std::size_t(r)] = test::failing_steps<comm::nccl_exchange<D>, D>(exchange, in, r, ranks, 1, who);
  });
  test::expect_raised_alike(raised, "nccl_exchange: dense", name + ": ");
}

}  // namespace

int main() {
  if (!sidco::test::cuda_device_present()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const int ranks = sidco::test::cuda_device_count();
  std::vector<ncclComm_t> comms = test::one_rank_per_gpu(ranks);
  if (comms.empty()) return 1;
  std::printf("%d rank(s), one per GPU%s\n", ranks, ranks < 2 ? " (multi-rank checks skipped: one GPU)" : "");

  const std::size_t n = 100000;
  // Rank r sends entries at a rank-dependent density (rank 1 none at all when there is one).
  std::vector<std::vector<std::uint32_t>> sent_indices(static_cast<std::size_t>(ranks));
  std::vector<std::vector<float>> sent_values(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::mt19937 rng(unsigned(r + 1));
    for (std::uint32_t i = 0; i < n; ++i)
      if (r != 1 && rng() % (50 + 10 * unsigned(r)) == 0) {
        sent_indices[std::size_t(r)].push_back(i);
        sent_values[std::size_t(r)].push_back(float(int(rng() % 2001) - 1000) * 1e-3f);
      }
  }
  std::vector<float> expected(n, 0.f);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t j = 0; j < sent_indices[std::size_t(r)].size(); ++j)
      expected[sent_indices[std::size_t(r)][j]] += sent_values[std::size_t(r)][j];
  for (auto& v : expected) v *= 1.0f / float(ranks);

  std::vector<std::vector<float>> results(static_cast<std::size_t>(ranks));
  std::vector<comm::allreduce_report> reports(static_cast<std::size_t>(ranks));
  on_every_rank(ranks, [&](int r) {
    comm::nccl_allreducer<float> reducer(comms[std::size_t(r)]);
    sparse_vector<float, std::uint32_t, memory::device> mine(n);
    mine.resize(sent_indices[std::size_t(r)].size());
    memory::device::copy_from_host(std::span<const std::uint32_t>(sent_indices[std::size_t(r)]), mine.mutable_indices());
    memory::device::copy_from_host(std::span<const float>(sent_values[std::size_t(r)]), mine.mutable_values());
    memory::device_buffer<float> dense(n);
    reports[std::size_t(r)] = reducer.allreduce(mine, 0.02, dense.view());
    results[std::size_t(r)].resize(n);
    memory::device::copy_to_host(std::as_const(dense).view(), std::span<float>(results[std::size_t(r)]));
  });
  for (int r = 0; r < ranks; ++r) {
    expect(reports[std::size_t(r)].taken == comm::path::sparse, "sparse path taken on rank " + std::to_string(r));
    // The rank-order sum, then the average: within float rounding of the host's, and every
    // rank's bits the same as rank 0's.
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(results[std::size_t(r)][i] - expected[i])));
    expect(worst <= 1e-6, "average matches on rank " + std::to_string(r));
    expect(std::memcmp(results[std::size_t(r)].data(), results[0].data(), n * sizeof(float)) == 0,
          "rank " + std::to_string(r) + " has rank 0's bits");
  }

  // Dense fallback: every rank sends everything.
  on_every_rank(ranks, [&](int r) {
    comm::nccl_allreducer<float> reducer(comms[std::size_t(r)]);
    sparse_vector<float, std::uint32_t, memory::device> mine(1000);
    std::vector<std::uint32_t> all(1000);
    std::vector<float> ones(1000, 1.f);
    for (std::uint32_t i = 0; i < 1000; ++i) all[i] = i;
    mine.resize(1000);
    memory::device::copy_from_host(std::span<const std::uint32_t>(all), mine.mutable_indices());
    memory::device::copy_from_host(std::span<const float>(ones), mine.mutable_values());
    memory::device_buffer<float> dense(1000);
    const auto report = reducer.allreduce(mine, 1.0, dense.view(), comm::reduction::sum);
    std::vector<float> out(1000);
    memory::device::copy_to_host(std::as_const(dense).view(), std::span<float>(out));
    expect(report.taken == comm::path::dense, "dense path for a full vector");
    expect(out[0] == float(ranks) && out[999] == float(ranks), "dense sum");
  });

  // Streams: compress on a non-blocking stream (as PyTorch's are), all-reduce on the legacy
  // one; the allreducer orders itself after the compressor's stream. The gradient is written
  // on that stream just before compress (NaN first, then the values), so an unordered read
  // would see NaN or a half-written selection. And a bad index leaves the caller's output
  // as it was.
  on_every_rank(ranks, [&](int r) {
    cudaStream_t side = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    {
      using top = presets::top_k<backend::cuda>;
      top compressor({}, {}, backend::cuda(side));
      std::vector<float> g(n);
      std::mt19937 rng(unsigned(r + 7));
      for (auto& v : g) v = float(int(rng() % 20001) - 10000) * 1e-4f;
      float* pinned = nullptr;
      cudaMallocHost(&pinned, n * sizeof(float));
      std::copy(g.begin(), g.end(), pinned);
      memory::device_buffer<float> gradient(n);
      sparse_vector<float, std::uint32_t, memory::device> mine;
      memory::device_buffer<float> dense(n);
      comm::nccl_allreducer<float> reducer(comms[std::size_t(r)]);  // the legacy stream
      for (int call = 0; call < 3; ++call) {
        cudaMemsetAsync(gradient.data(), 0xff, n * sizeof(float), side);
        cudaMemcpyAsync(gradient.data(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, side);
        compressor.compress<float>(gradient.view(), 0.01, mine);
        reducer.allreduce(mine, 0.01, dense.view(), comm::reduction::sum);
        std::vector<float> out(n);
        memory::device::copy_to_host(std::as_const(dense).view(), std::span<float>(out));
        std::size_t nonzero = 0, nan = 0;
        for (float v : out) nonzero += v != 0, nan += std::isnan(v);
        expect(nan == 0 && nonzero >= n / 100 && nonzero <= std::size_t(ranks) * (n / 100),
               "rank " + std::to_string(r) + " call " + std::to_string(call) + ": the reduced top-k of a " +
                   "non-blocking stream's compress (" + std::to_string(nonzero) + " non-zero, " +
                   std::to_string(nan) + " NaN)");
      }
      // An index beyond the dense size: every rank throws, and the output keeps its values.
      std::vector<float> before(n), after(n);
      memory::device::copy_to_host(std::as_const(dense).view(), std::span<float>(before));
      const std::vector<std::uint32_t> bad = {std::uint32_t(n + 5)};
      const std::vector<float> one = {1.f};
      sparse_vector<float, std::uint32_t, memory::device> wrong(n);
      wrong.resize(1);
      memory::device::copy_from_host(std::span<const std::uint32_t>(bad), wrong.mutable_indices());
      memory::device::copy_from_host(std::span<const float>(one), wrong.mutable_values());
      bool threw = false;
      try {
        reducer.allreduce(wrong, 1e-5, dense.view(), comm::reduction::sum);
      } catch (const sidco::error&) {
        threw = true;
      }
      memory::device::copy_to_host(std::as_const(dense).view(), std::span<float>(after));
      expect(threw, "an index beyond the dense size throws");
      expect(before == after, "the caller's output is unchanged by a rejected exchange");
      cudaFreeHost(pinned);
    }
    cudaStreamDestroy(side);
  });

  // Errors: a mismatched density (multi-rank only), and a rank that fails.
  if (ranks >= 2) {
    std::vector<std::string> messages(static_cast<std::size_t>(ranks));
    on_every_rank(ranks, [&](int r) {
      comm::nccl_allreducer<float> reducer(comms[std::size_t(r)]);
      sparse_vector<float, std::uint32_t, memory::device> mine(10);
      memory::device_buffer<float> dense(10);
      try {
        if (r == 1) reducer.allreduce_failed(std::runtime_error("gradient contains NaN"), 10, 0.1);
        reducer.allreduce(mine, 0.1, dense.view());
      } catch (const sidco::error& e) {
        messages[std::size_t(r)] = e.what();
      }
    });
    for (int r = 0; r < ranks; ++r)
      expect(messages[std::size_t(r)].find("rank 1 failed: gradient contains NaN") != std::string::npos,
            "rank " + std::to_string(r) + " names the failing rank: '" + messages[std::size_t(r)] + "'");
  }
  // The all-gather exchange over NCCL against the host core.
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  for (const auto& [coding, exact_sizes] : {std::pair{comm::entry_coding::plain, false},
                                             std::pair{comm::entry_coding::plain, true},
                                             std::pair{comm::entry_coding::compact, false},
                                             std::pair{comm::entry_coding::compact8, false}}) {
    exchange_step<float>(comms, gradient, "float", coding, exact_sizes);
    exchange_step<__half>(comms, gradient, "__half", coding, exact_sizes);
    exchange_step<__nv_bfloat16>(comms, gradient, "__nv_bfloat16", coding, exact_sizes);
  }
  for (auto c : comms) ncclCommDestroy(c);
  std::printf("%s\n", test::failures ? "FAILED" : "NCCL sparse all-reduce and exchange checks passed");
  return test::failures ? 1 : 0;
}
