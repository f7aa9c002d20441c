// What the NCCL exchange tests share: each rank's input (a real gradient rotated per rank,
// compressed on the host by exact Top-k with error feedback, uploaded as device memory), bit
// comparisons of what comes back, and the failing steps every exchange must raise alike.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <sidco/sidco.hpp>

#include "ranks.hpp"

namespace sidco::test {

// Rank r's step: the gradient rotated by r 997 places, as H, compressed by exact Top-k at
// delta with error feedback from a zero residual.
template <class H = float>
struct rank_input {
  sparse_vector<H> sent;
  std::vector<H> residual;
};

template <class H = float>
rank_input<H> input_of(const std::vector<float>& gradient, int r, double delta) {
  rank_input<H> in;
  const std::size_t n = gradient.size();
  std::vector<H> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = H(gradient[(i + std::size_t(r) * 997) % n]);
  in.residual.assign(n, H(0.f));
  feedback::residual<H> state(std::span<H>(in.residual));
  presets::top_k<> compressor;
  compressor.compress(std::span<const H>(g), delta, in.sent, state);
  return in;
}

template <class A, class B>
bool same_bits(const std::vector<A>& a, const std::vector<B>& b) {
  static_assert(sizeof(A) == sizeof(B));
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

template <class D>
std::vector<D> download(const memory::device_buffer<D>& buffer) {
  std::vector<D> out(buffer.size());
  SIDCO_CUDA(cudaMemcpy(out.data(), buffer.data(), out.size() * sizeof(D), cudaMemcpyDeviceToHost));
  return out;
}

// Rank r's input in device memory, as device type D (the host type's bits).
template <class D, class H>
void upload(const rank_input<H>& in, std::size_t n, sparse_vector<D, std::uint32_t, memory::device>& sent,
            memory::device_buffer<D>& residual) {
  static_assert(sizeof(D) == sizeof(H));
  sent.clear(n);
  sent.resize(in.sent.size());
  memory::device::copy_from_host(in.sent.indices(), sent.mutable_indices());
  SIDCO_CUDA(cudaMemcpy(sent.mutable_values().data(), in.sent.values().data(), in.sent.size() * sizeof(D),
                        cudaMemcpyHostToDevice));
  residual.resize(n);
  SIDCO_CUDA(cudaMemcpy(residual.data(), in.residual.data(), n * sizeof(D), cudaMemcpyHostToDevice));
}

// The residual of a rank whose step failed: every entry it sent back in place.
template <class H>
std::vector<H> restored(const rank_input<H>& in) {
  std::vector<H> out = in.residual;
  for (std::size_t j = 0; j < in.sent.size(); ++j) out[in.sent.indices()[j]] = in.sent.values()[j];
  return out;
}

/// What each rank raised in failing_steps.
struct raised {
  std::string failed, refused;
};

/// Two failing steps of exchange (an NCCL exchange: exchange() and exchange_failed()) on rank
/// r of ranks, from in: at step, rank 0's compress threw (every rank raises it; the others
/// get every entry they sent back: checked here); at step + 1, the last rank's dense vector
/// is one value short. Returns what this rank raised.
template <class Exchange, class D, class H>
raised failing_steps(Exchange& exchange, const rank_input<H>& in, int r, int ranks, std::uint64_t step,
                     const std::string& who) {
  const std::size_t n = in.residual.size();
  sparse_vector<D, std::uint32_t, memory::device> sent;
  memory::device_buffer<D> residual, dense(n), short_dense(n - 1);
  raised out;
  upload(in, n, sent, residual);
  try {
    if (r == 0) exchange.exchange_failed(std::runtime_error("gradient contains NaN"), step);
    exchange.exchange(sent, residual.view(), dense.view(), step);
  } catch (const sidco::runtime_error& e) {
    out.failed = e.what();
  }
  if (r != 0) expect(same_bits(download(residual), restored(in)), who + "every entry sent is back in the residual");
  upload(in, n, sent, residual);
  try {
    exchange.exchange(sent, residual.view(), r == ranks - 1 ? short_dense.view() : dense.view(), step + 1);
  } catch (const sidco::runtime_error& e) {
    out.refused = e.what();
  }
  return out;
}

/// Every rank raised the same errors in failing_steps, naming rank 0 and the last rank's
/// short dense vector (dense: how the exchange names that argument).
inline void expect_raised_alike(const std::vector<raised>& all, const std::string& dense, const std::string& who) {
  const std::string last = "rank " + std::to_string(all.size() - 1) + " failed: " + dense;
  for (std::size_t r = 0; r < all.size(); ++r) {
    expect(all[r].failed.find("rank 0 failed: gradient contains NaN") != std::string::npos,
           who + "rank " + std::to_string(r) + " names the failing rank: '" + all[r].failed + "'");
    expect(all[r].refused == all[0].refused && all[r].refused.find(last) != std::string::npos,
           who + "rank " + std::to_string(r) + " names the rank with a short dense vector: '" + all[r].refused + "'");
  }
}

}  // namespace sidco::test
