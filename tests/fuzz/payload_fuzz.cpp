// libFuzzer target for what a peer puts on the wire: the all-gather's payloads, plain, compact8 and
// compact (both index codes). From the input it builds three ranks' valid payloads (a dense
// size, a count, gaps clustered or spread, values), then damages rank 1's with the input's
// remaining bytes (offset, xor) pairs. The decode must either throw sidco::runtime_error,
// with every rank's sent entries back in its residual, or succeed; undamaged, it must give
// the bits the plain payloads of the same entries give. Reading past a payload aborts under
// ASan. Anything else (another exception, a crash) aborts.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <sidco/comm/allgather/core.hpp>
#include <sidco/sidco.hpp>

#include "fuzz_input.hpp"

namespace {

using fuzz::violated;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sidco;
  fuzz::input_reader in{data, size};
  // Sizes spread evenly in log2 up to 2^18: a vector of 2^17 costs milliseconds under ASan,
  // and sizes uniform up to 2^18 made almost every run one (about 75 runs a second).
  const std::uint64_t size_bits = in.take(3);
  const unsigned size_log2 = unsigned(size_bits & 31) % 19;
  const std::size_t dense = 1 + (size_bits >> 5) % (std::uint64_t(1) << size_log2);
  const double delta = 0.001 + double(in.take(1) % 200) / 1000;  // 0.001 .. 0.2
  const auto coding = comm::entry_coding(in.take(1) % 3);  // plain, compact or compact8
  const std::uint64_t spread = 1 + in.take(2) % 2000;  // gaps below spread: 1 clusters, 2000 spreads
  std::vector<std::unique_ptr<comm::allgather_core<float>>> cores;  // each rank's: it keeps what it sent
  for (int r = 0; r < 3; ++r)
    cores.push_back(std::make_unique<comm::allgather_core<float>>(std::vector<segment>{{0, dense}}, delta, 1.25, coding));
  comm::allgather_core<float>& core = *cores[0];
  comm::allgather_core<float> plain_core({{0, dense}}, delta, 1.25);
  const std::size_t bytes = core.format().bytes();
  std::vector<std::vector<std::byte>> payloads(3, std::vector<std::byte>(bytes)), plain(3);
  std::vector<sparse_vector<float>> sent(3, sparse_vector<float>(dense)), selected;
  std::vector<std::vector<float>> residual(3, std::vector<float>(dense, 0.f));
  for (std::size_t r = 0; r < 3; ++r) {
    std::uint64_t index = in.take(2) % spread;
    while (index < dense && sent[r].size() < core.format().capacity) {
      const float value = float(std::int16_t(in.take(2))) / 64 + (r + 1) * 0.5f;  // no zeros, finite
      sent[r].push_back(std::uint32_t(index), value);
      index += 1 + (in.at < in.size ? in.take(1) : 7 * r + 3) % spread;
    }
    selected.push_back(sent[r]);
    comm::host_residual<float> sink{std::span<float>(residual[r])};
    try {
      cores[r]->encode(sent[r], sink, {1, 2, delta, comm::reduction::sum}, payloads[r]);
    } catch (const sidco::error&) {
      return 0;  // a selection this layout refuses (too many trimmed): nothing to decode
    }
    plain[r].resize(plain_core.format().bytes());
    comm::pack(sent[r], 0, {1, 2, delta, comm::reduction::sum}, plain_core.format(), plain[r]);
  }
  const std::vector<std::byte> clean = payloads[1];
  while (in.at + 4 <= in.size) {  // damage: (offset, xor) pairs
    const std::size_t offset = std::size_t(in.take(3)) % bytes;
    payloads[1][offset] ^= std::byte(in.take(1));
  }
  const bool damaged = payloads[1] != clean;
  const std::vector<std::span<const std::byte>> views(payloads.begin(), payloads.end());
  std::vector<float> out(dense, -1.f);
  comm::host_residual<float> sink{std::span<float>(residual[0])};
  try {
    core.decode(views, std::span<float>(out), sink);
  } catch (const sidco::runtime_error&) {
    // Refused: rank 0's residual holds every value it selected, unrounded, and nothing else.
    std::vector<float> expected(dense, 0.f);
    for (std::size_t j = 0; j < selected[0].size(); ++j) expected[selected[0].indices()[j]] = selected[0].values()[j];
    if (expected != residual[0]) violated("a refused decode did not give back what was sent");
    return 0;
  } catch (...) {
    violated("the decode threw something other than sidco::runtime_error");
  }
  if (!damaged) {
    std::vector<float> reference(dense, -2.f);
    const std::vector<std::span<const std::byte>> plain_views(plain.begin(), plain.end());
    comm::decode<float, std::uint32_t>(plain_views, plain_core.format(), std::span<float>(reference));
    if (std::memcmp(out.data(), reference.data(), dense * sizeof(float)) != 0)
      violated("an undamaged exchange decoded otherwise than its plain payloads");
  }
  return 0;
}
