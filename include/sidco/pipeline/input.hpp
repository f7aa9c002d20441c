// What a compress call reads, built from the caller's gradient and its feedback state, with
// the checks that every front end (compressor, segmented) makes before the first pass.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "sidco/backend/source.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"

namespace sidco::pipeline {

/// Whether Memory's views are host spans. Where they are not (memory::device), the front
/// ends refuse a host span or vector given as the gradient with a sentence.
template <class Memory, class T>
inline constexpr bool host_views = std::is_same_v<typename Memory::template view<const T>, std::span<const T>>;

/// The sentence, shared by the front ends' catching overloads.
#define SIDCO_HOST_GRADIENT_FOR_DEVICE_MESSAGE                                                              \
  "sidco compress: the gradient is host memory (a std::span or vector), but this compressor's backend " \
  "reads another memory space (backend::cuda: device memory); pass its view type, e.g. "               \
  "memory::device::view<const float>(pointer, size) or a device_buffer's view()"

/// A source and the words errors name it by.
template <class Source>
struct input {
  Source source;
  const char* what;
};

/// delta in (0, 1], a non-empty gradient whose indices fit out's index type.
template <class T, class Index, class Memory>
void check_call(std::size_t size, double delta, const sparse_vector<T, Index, Memory>&) {
  check::density(delta);
  if (size == 0) detail::fail("gradient is empty");
  if (size > sparse_vector<T, Index, Memory>::max_dense_size)
    detail::fail("gradient: size ", size, " exceeds the ", 8 * sizeof(Index), "-bit index range (",
                 sparse_vector<T, Index, Memory>::max_dense_size, "); use sparse_vector<T, std::uint64_t>");
}

template <class T, class Memory>
input<backend::plain_source<T, Memory>> plain(typename Memory::template view<const T> gradient) {
  return {{gradient.data(), gradient.size()}, "gradient"};
}

/// gradient + residual; what is not sent stays in the residual.
template <class T, class Memory>
input<backend::feedback_source<T, Memory>> with_residual(typename Memory::template view<const T> gradient,
                                                        feedback::residual<T, Memory>& residual) {
  check::same_size("residual", residual.size(), gradient.size());
  return {{gradient.data(), residual.data(), gradient.size()}, "gradient + residual"};
}

/// DGC's momentum-corrected accumulation; what is sent is masked.
template <class T, class Memory>
input<backend::momentum_source<T, Memory>> with_momentum(typename Memory::template view<const T> gradient,
                                                        feedback::momentum<T, Memory>& state) {
  check::same_size("momentum", state.size(), gradient.size());
  return {{gradient.data(), state.velocity_data(), state.accumulation_data(), state.factor(), gradient.size()},
          "momentum-corrected gradient"};
}

}  // namespace sidco::pipeline
