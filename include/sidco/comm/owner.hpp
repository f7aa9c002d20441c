// How an owner in the reduce-scatter exchange chooses, from the sums it reduced, the
// entries it sends on: an owner policy. Policies take their compressor type from the caller;
// nothing here knows the method registry (the default, owner_sidco_e, is defined with the
// registry in <sidco/owners.hpp>, which <sidco/sidco.hpp> includes).
//
// A policy is a type with a static `name` (the registry's name of what it runs) and
//   std::size_t select<A, Index>(Index* indices, A* values, std::size_t count, std::size_t k)
// keeping about k of the count entries (indices ascending, kept so) and returning how many;
// the exchange trims what it keeps beyond its capacity. A policy with state between steps
// (an adaptive compressor's) has save_state / load_state: a failed step restores it, and
// checkpoints carry it.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/select/exact_k.hpp"
#include "sidco/select/top_k.hpp"

namespace sidco::comm {

/// What the reduce-scatter exchange asks of an owner policy (see the top of this file).
template <class P>
concept owner_policy = std::copy_constructible<P> && requires(P& p, std::uint32_t* indices, float* values) {
  { P::name } -> std::convertible_to<const char*>;
  { p.template select<float, std::uint32_t>(indices, values, std::size_t(1), std::size_t(1)) } -> std::same_as<std::size_t>;
};

/// An owner's reduced entries (indices ascending, their sums in the accumulator type), kept
/// from step to step so that a steady owner allocates nothing. Grown without zeroing: every
/// slot in use is written first.
template <class A, class Index>
class owner_workspace {
 public:
  /// Room for count entries; the entries held are lost when it grows.
  void reserve(std::size_t count) {
    if (count <= capacity_) return;
    const std::size_t grown = std::max(count, 2 * capacity_);
    indices_ = std::make_unique_for_overwrite<Index[]>(grown);
    values_ = std::make_unique_for_overwrite<A[]>(grown);
    capacity_ = grown;
    size_ = 0;
  }
  /// The first count slots (at most the capacity) are the entries.
  void set_size(std::size_t count) {
    if (count > capacity_) sidco::detail::fail("owner_workspace: ", count, " entries exceed the capacity ", capacity_);
    size_ = count;
  }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  Index* indices() { return indices_.get(); }
  A* values() { return values_.get(); }
  std::span<const Index> indices() const { return {indices_.get(), size_}; }
  std::span<const A> values() const { return {values_.get(), size_}; }

 private:
  std::unique_ptr<Index[]> indices_;
  std::unique_ptr<A[]> values_;
  std::size_t capacity_ = 0, size_ = 0;
};

namespace detail {

/// The owners' radix workspace (backend::host::keep_top_k's survivors), one per key width,
/// kept from step to step.
class top_k_workspace {
 public:
  template <class T, class Index>
  std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k) {
    return backend::host::keep_top_k(indices, values, count, k, std::get<std::vector<magnitude_key_t<T>>>(keys_));
  }

 private:
  std::tuple<std::vector<std::uint32_t>, std::vector<std::uint64_t>> keys_;
};

}  // namespace detail

/// Exact Top-k of the reduced sums (ties to the lower index).
struct owner_top_k {
  static constexpr const char* name = "top-k";
  template <class A, class Index>
  std::size_t select(Index* indices, A* values, std::size_t count, std::size_t k) {
    return workspace_.keep_top_k(indices, values, count, k);
  }

 private:
  detail::top_k_workspace workspace_;
};

/// A compressor run on the reduced sums at density k / count; its adaptive state carries
/// from step to step (save_state / load_state). When the compressor's result is the exact
/// Top-k (select::exact_k, select::top_k) and k is at least direct_share of the count, the
/// owner runs the exact Top-k itself: the same entries, in fewer passes than a fit, a
/// threshold pass and a trim. Derive from it to name the method (owner_sidco_e does).
template <class Compressor>
struct owner_compressor {
  static constexpr const char* name = "compressor";
  static constexpr bool selects_top_k = std::is_same_v<typename Compressor::selection_type, select::exact_k> ||
                                        std::is_same_v<typename Compressor::selection_type, select::top_k>;
  Compressor compressor{};
  double direct_share = 0.1;

  owner_compressor() = default;
  explicit owner_compressor(Compressor c) : compressor(std::move(c)) {}

  template <class A, class Index>
  std::size_t select(Index* indices, A* values, std::size_t count, std::size_t k) {
    if (count <= k) return count;
    if constexpr (selects_top_k)
      if (double(k) >= direct_share * double(count)) return top_k_.keep_top_k(indices, values, count, k);
    auto& picked = std::get<sparse_vector<A, std::uint32_t>>(picked_);
    compressor.compress(std::span<const A>(values, count), double(k) / double(count), picked);
    const auto at = picked.indices();
    for (std::size_t j = 0; j < at.size(); ++j) {  // positions ascend: compact in place
      indices[j] = indices[at[j]];
      values[j] = values[at[j]];
    }
    return at.size();
  }
  void save_state(state_writer& out) const { compressor.save_state(out); }
  void load_state(state_reader& in) { compressor.load_state(in); }

 private:
  // The selection's buffers, one per accumulator type, kept from step to step.
  std::tuple<sparse_vector<float, std::uint32_t>, sparse_vector<double, std::uint32_t>> picked_;
  detail::top_k_workspace top_k_;
};

/// The default owner: SIDCo-E's threshold on the reduced sums, trimmed to exactly the
/// owner's share (the registry's sidco-e-exact on the CPU backend). Defined in
/// <sidco/owners.hpp>.
struct owner_sidco_e;

}  // namespace sidco::comm
