// The NCCL exchange tests' ranks' inputs: a real gradient rotated per rank, compressed on the
// host by exact Top-k with error feedback, uploaded as device memory; and bit comparisons
// of what comes back against the host transports' code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <sidco/sidco.hpp>

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

}  // namespace sidco::test
