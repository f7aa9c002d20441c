// The reduce-scatter exchange over NCCL, in one process over every visible GPU (one rank
// each; NCCL takes one rank per GPU, so one GPU gives one rank): on a real gradient, in
// float, __half and __nv_bfloat16, plain entries in fixed blocks and in frames (exact
// sizes) and compact ones (two steps, so that the owners' carry enters the second), every rank's dense update and residual
// have the bits the host transports' code gives (the exchange core's pack, select and apply,
// as MPI and gloo run them), so every rank's update is rank 0's; a rank whose compress threw, or whose arguments are wrong, makes
// every rank throw the same error with its entries back in its residual; the default owner
// (SIDCo) runs; the state resumes. Without a GPU the program exits 77 (skipped).
#include <sidco/comm/nccl_reduce.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sidco/sidco.hpp>

#include "../support.hpp"
#include "device.hpp"
#include "exchange_checks.hpp"
#include "ranks.hpp"

using namespace sidco;

using test::download;
using test::expect;
using test::input_of;
using test::on_every_rank;
using test::rank_input;
using test::same_bits;
using test::upload;

namespace {

constexpr double delta = 0.01;

// The host transports' result of one exact step (owner Top-k) of cores (one per rank, kept
// between steps: the compact coding's carry lives in them), every rank simulated here:
// each rank's dense update and residual.
template <class H>
void host_step(std::vector<comm::reduce_core<H, std::uint32_t, comm::owner_top_k>>& cores,
               const std::vector<rank_input<H>>& inputs, std::size_t n, std::uint64_t step,
               std::vector<std::vector<H>>& dense_ref, std::vector<std::vector<H>>& residual_ref) {
  const std::size_t ranks = inputs.size();
  const std::size_t bytes = cores[0].block_bytes();
  residual_ref.assign(ranks, {});
  dense_ref.assign(ranks, std::vector<H>(n, H(0.f)));
  std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(bytes * ranks));
  for (std::size_t r = 0; r < ranks; ++r) {
    auto kept = inputs[r].sent;
    residual_ref[r] = inputs[r].residual;
    comm::host_residual<H> sink{std::span<H>(residual_ref[r])};
    cores[r].pack(kept, sink, cores[r].fields(step), std::span<std::byte>(blocks[r]));
  }
  std::vector<std::vector<std::byte>> selections(ranks, std::vector<std::byte>(bytes));
  for (std::size_t j = 0; j < ranks; ++j) {
    std::vector<std::span<const std::byte>> received;
    for (const auto& b : blocks) received.push_back(std::span<const std::byte>(b).subspan(j * bytes, bytes));
    cores[j].select(received, selections[j]);
  }
  const std::vector<std::span<const std::byte>> selection_views(selections.begin(), selections.end());
  for (std::size_t r = 0; r < ranks; ++r) {
    comm::host_residual<H> sink{std::span<H>(residual_ref[r])};
    cores[r].apply(selection_views, sink);
    const auto global = cores[r].global_selection();
    for (std::size_t j = 0; j < global.size(); ++j) dense_ref[r][global[j]] = cores[r].updates()[j];
  }
}

// Two exact steps of nccl_reduce_exchange<D> on every rank, in the given entry coding,
// against the host transports' bits (step 1's inputs are rank r + 3's gradient: other
// entries, some at indices step 0 kept, where an owner's carry adds in).
template <class D>
void exact_steps(const std::vector<ncclComm_t>& comms, const std::vector<float>& gradient, const char* type,
                 comm::entry_coding coding, bool exact_sizes) {
  using H = host_value_t<D>;
  const int ranks = int(comms.size());
  const std::size_t n = gradient.size();
  comm::exchange_options options;
  options.coding = coding;
  options.exact_sizes = exact_sizes;
  const std::vector<segment> layout{{0, n}};
  std::vector<comm::reduce_core<H, std::uint32_t, comm::owner_top_k>> cores;
  for (int r = 0; r < ranks; ++r) cores.emplace_back(layout, delta, std::size_t(ranks), std::size_t(r), options);
  std::vector<std::vector<rank_input<H>>> inputs(2);
  std::vector<std::vector<std::vector<H>>> dense_ref(2), residual_ref(2);
  for (std::uint64_t step = 0; step < 2; ++step) {
    for (int r = 0; r < ranks; ++r) inputs[step].push_back(input_of<H>(gradient, r + 3 * int(step), delta));
    host_step(cores, inputs[step], n, step, dense_ref[step], residual_ref[step]);
  }
  const std::string name = std::string(type) + ", " + comm::coding_name(std::uint8_t(coding)) +
                           (exact_sizes ? ", exact sizes" : "");
  on_every_rank(ranks, [&](int r) {
    const std::string who = name + ", rank " + std::to_string(r) + ": ";
    sparse_vector<D, std::uint32_t, memory::device> sent;
    memory::device_buffer<D> residual, dense(n);
    comm::nccl_reduce_exchange<D, std::uint32_t, comm::owner_top_k> exchange(comms[std::size_t(r)], n, delta, options);
    for (std::uint64_t step = 0; step < 2; ++step) {
      const std::string when = who + "step " + std::to_string(step) + ": ";
      upload(inputs[step][std::size_t(r)], n, sent, residual);
      const comm::reduce_report report = exchange.exchange(sent, residual.view(), dense.view(), step);
      expect(same_bits(download(dense), dense_ref[step][std::size_t(r)]), when + "dense has the host transports' bits");
      expect(same_bits(download(residual), residual_ref[step][std::size_t(r)]),
             when + "residual has the host transports' bits");
      const auto plan = comm::plan_reduce<H, std::uint32_t>(layout, delta, 1.25, std::size_t(ranks));
      expect(report.ranks == ranks && report.target == plan.target && report.selected > 0, when + "report");
      if ((comm::is_compact(coding) || exact_sizes) && ranks > 1)
        expect(report.bytes_sent < 2 * std::size_t(ranks - 1) * plan.format.bytes(), when + "messages shorter than blocks");
    }
  });
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
  std::printf("%d rank(s), one per GPU\n", ranks);
  const auto gradient = test::load_gradient<float>("cnn_it200.npy");
  const std::size_t n = gradient.size();
  for (const auto& [coding, exact_sizes] : {std::pair{comm::entry_coding::plain, false},
                                             std::pair{comm::entry_coding::plain, true},
                                             std::pair{comm::entry_coding::compact, false},
                                             std::pair{comm::entry_coding::compact8, false}}) {
    exact_steps<float>(comms, gradient, "float", coding, exact_sizes);
    exact_steps<__half>(comms, gradient, "__half", coding, exact_sizes);
    exact_steps<__nv_bfloat16>(comms, gradient, "__nv_bfloat16", coding, exact_sizes);
  }
  std::vector<rank_input<>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(input_of(gradient, r, delta));
  const std::vector<segment> layout{{0, n}};
  const auto plan = comm::plan_reduce<float, std::uint32_t>(layout, delta, 1.25, std::size_t(ranks));

  // A failing rank, wrong arguments, the default owner, and a resumed exchange, each on
  // every rank.
  std::vector<test::raised> raised(static_cast<std::size_t>(ranks));
  on_every_rank(ranks, [&](int r) {
    const rank_input<>& in = inputs[std::size_t(r)];
    sparse_vector<float, std::uint32_t, memory::device> sent;
    memory::device_buffer<float> residual, dense(n);
    const std::string who = "rank " + std::to_string(r) + ": ";
    comm::nccl_reduce_exchange<float, std::uint32_t, comm::owner_top_k> exchange(comms[std::size_t(r)], n, delta);
    raised[std::size_t(r)] = test::failing_steps<decltype(exchange), float>(exchange, in, r, ranks, 1, who);

    // The default owner (SIDCo-E on the reduced values) over two steps, then resumed.
    comm::nccl_reduce_exchange<float> sidco_exchange(comms[std::size_t(r)], n, delta);
    std::vector<float> second;
    for (std::uint64_t step = 0; step < 2; ++step) {
      upload(in, n, sent, residual);
      const auto r2 = sidco_exchange.exchange(sent, residual.view(), dense.view(), step);
      expect(r2.selected > 0 && r2.selected <= std::size_t(ranks) * plan.capacity, who + "SIDCo owner selects");
      if (step == 0) {
        const std::vector<std::byte> saved = saved_state(sidco_exchange);
        comm::nccl_reduce_exchange<float> resumed(comms[std::size_t(r)], n, delta);
        state_reader reader(saved);
        resumed.load_state(reader);
        expect(saved_state(resumed) == saved, who + "the owner's state resumes");
      }
    }
  });
  test::expect_raised_alike(raised, "nccl_reduce_exchange: dense", "");
  for (auto comm : comms) ncclCommDestroy(comm);
  std::printf("%s\n", test::failures ? "FAILED" : "ok");
  return test::failures ? 1 : 0;
}
