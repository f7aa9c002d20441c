// The backend contract: what a Source and a Backend must provide, each with its contract.
//
// A backend owns every loop over gradient elements and every buffer that holds them (the
// sparse output, error-feedback state, workspaces), in its memory space: host memory for
// backend::serial and backend::cpu, device memory for backend::cuda. Estimators and
// selections see only moments, counts, thresholds and positions, on the host. That is what
// lets one compressor template run on either, and a framework tensor be the residual.
//
// Conventions for every member below: Source is one of the source types of source.hpp over
// the backend's memory space; `out` is a sparse_vector<T, Index, memory> whose entries
// from position `begin` on are the current selection; thresholds are doubles and |x| > t
// is decided as if in double (threshold_key); results that estimators read (moments,
// counts, positions' magnitudes) come back in host memory. Passes over a layout treat it
// as segments tiling the source, offsets relative to the source.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/requirement.hpp"

namespace sidco::backend {

/// A memory space: buffer<T> (owned: data(), size(), capacity(), resize(), reserve(),
/// clear()), pointer<T> and view<T> (non-owning pointer and size), and zero(view), the one
/// whole-buffer operation code outside a backend may ask for (resetting state).
template <class M>
concept memory_space = requires(typename M::template buffer<float>& b,
                                typename M::template view<float> v) {
  typename M::template pointer<float>;
  { M::name } -> std::convertible_to<const char*>;
  b.data();
  b.size();
  b.resize(std::size_t{});
  b.reserve(std::size_t{});
  b.clear();
  v.size();
  v.data();
  M::zero(v);
};

/// A source over values of type T: value(i), rescan_value(i), settle(i, v, sent),
/// mark_sent(i), slice(offset, count), size, base, has_state (see source.hpp).
template <class S>
concept source = requires(const S& s, std::size_t i, typename S::value_type v) {
  typename S::value_type;
  typename S::memory_space;
  { S::has_state } -> std::convertible_to<bool>;
  { s.size } -> std::convertible_to<std::size_t>;
  { s.base } -> std::convertible_to<std::size_t>;
  { s.value(i) } -> std::same_as<typename S::value_type>;
  { s.rescan_value(i) } -> std::same_as<typename S::value_type>;
  s.settle(i, v, true);
  s.mark_sent(i);
  { s.slice(i, i) } -> std::same_as<S>;
};

namespace contract {

// The types a backend is checked with: float values, 32-bit indices, its own memory.
template <class B>
using probe_source = feedback_source<float, typename B::memory>;
template <class B>
using probe_output = sparse_vector<float, std::uint32_t, typename B::memory>;

// Each requirement, one per member, so that a missing one can be named.
template <class B>
concept has_memory = requires { typename B::memory; } && memory_space<typename B::memory>;
template <class B>
concept has_name = requires { { B::name } -> std::convertible_to<const char*>; };
/// analyze<Stats>(source, layout, probes, out): one pass over the source. For segment s of
/// the layout and P = probes.size() / layout.size() (0 or 1): out[s (1 + P)] = moments of |x| over the
/// segment (counts only unless Stats::sums; ln|x| when Stats::log); out[s (1 + P) + 1 + j] =
/// moments of the excesses |x| - p over the values with |x| > p, p = probes[s P + j] (count:
/// how many exceed p; a negative p is taken as 0, here and in tail). Reads the source, writes
/// nothing but out (host).
template <class B>
concept has_analyze = requires(B& b, const probe_source<B>& s, std::span<const segment> layout,
                               std::span<const double> probes, std::span<moments> out) {
  b.template analyze<pass_statistics<true, true, true>>(s, layout, probes, out);
};
/// tail<Log>(source, t): the excess moments over t of the values with |x| > t, as a probe.
/// A pass of its own; estimators use it where no probe was gathered.
template <class B>
concept has_tail = requires(B& b, const probe_source<B>& s) {
  { b.template tail<true>(s, 0.0) } -> std::same_as<moments>;
};
/// count_above(source, t): how many |x| > t.
template <class B>
concept has_count_above = requires(B& b, const probe_source<B>& s) {
  { b.count_above(s, 0.0) } -> std::convertible_to<std::size_t>;
};
/// coarse_histograms(source, layout, counts): one pass over every segment that keeps, in the
/// backend, each segment's coarse histogram (magnitude key >> coarse_shift) for
/// kth_largest_bins, and, unless counts is empty, writes counts[s] (host): the segment's
/// counts as analyze<pass_statistics<false>> gives them (count, zeros, non-finite). So the
/// pass that Top-k needs anyway is also its input check. Reads the source only.
template <class B>
concept has_coarse_histograms = requires(B& b, const probe_source<B>& s, std::span<const segment> layout,
                                         std::span<moments> counts) {
  b.coarse_histograms(s, layout, counts);
};
/// kth_largest_bins(targets, out): per segment s of the last coarse_histograms call, out[s]
/// (host) = the coarse bin of its targets[s]-th largest magnitude and how many of its values
/// lie in that bin or above (kth_largest_bin of its histogram). No pass over the values.
template <class B>
concept has_kth_largest_bins = requires(B& b, std::span<const std::size_t> targets, std::span<key_bin> out) {
  b.kth_largest_bins(targets, out);
};
/// first_nonfinite(source): index and value of the first NaN or infinity (index == size:
/// none). The error path; reads only.
template <class B>
concept has_first_nonfinite = requires(B& b, const probe_source<B>& s) {
  { b.first_nonfinite(s) } -> std::same_as<nonfinite_value>;
};
/// select_above<Final>(source, layout, thresholds, out, hint, kept): appends every
/// (base + i, x_i) with |x_i| > thresholds[s], s the segment holding i, in index order, and
/// settles the source's state in the same pass: as sent where kept when Final, else all as
/// unsent (the selection decides later and calls mark_sent). hint: the expected count (0:
/// unknown). kept[s] (host): how many it appended from segment s.
template <class B>
concept has_select_above = requires(B& b, const probe_source<B>& s, std::span<const segment> layout,
                                    std::span<const double> t, probe_output<B>& out,
                                    std::span<std::size_t> kept) {
  b.template select_above<true>(s, layout, t, out, std::size_t{}, kept);
};
/// select_band(source, low, high, out): after select_above<false>, appends (base + i, v) for
/// low < |v| <= high, v re-read from the settled state (rescan_value), in index order.
template <class B>
concept has_select_band = requires(B& b, const probe_source<B>& s, probe_output<B>& out) {
  b.select_band(s, 0.0, 1.0, out);
};
/// select_random(source, k, state, out): appends the entries at the local indices
/// uniform_subset(size, k, state) draws (core/uniform_subset.hpp; k <= size), ascending,
/// and settles every entry (sent where chosen).
template <class B>
concept has_select_random = requires(B& b, const probe_source<B>& s, std::uint64_t state, probe_output<B>& out) {
  b.select_random(s, std::size_t{}, state, out);
};
/// sample_magnitudes(source, state, out): out[j] = |x at sample_position(state, j, size)|
/// (core/splitmix.hpp: uniform positions drawn where the values are; out in host memory).
template <class B>
concept has_sample_magnitudes = requires(B& b, const probe_source<B>& s, std::uint64_t state,
                                         std::span<double> out) {
  b.sample_magnitudes(s, state, out);
};
/// keep_top_k(out, begin, run_sizes, keep): the entries from begin on are consecutive runs
/// (run_sizes, host); keeps of run s exactly the min(keep[s], run_sizes[s]) largest
/// magnitudes (ties to the lower index), in their order, the runs compacted in order.
/// Precondition: every entry tied with a run's keep[s]-th largest is in that run.
template <class B>
concept has_keep_top_k = requires(B& b, probe_output<B>& out, std::span<const std::size_t> r) {
  b.keep_top_k(out, std::size_t{}, r, r);
};
/// merge_runs(out, begin, run_starts): the entries from begin on are ascending runs, the
/// first from begin and one from each of run_starts; merges them into one ascending run.
template <class B>
concept has_merge_runs = requires(B& b, probe_output<B>& out, std::span<const std::size_t> r) {
  b.merge_runs(out, std::size_t{}, r);
};
/// mark_sent(source, out, begin): clears the state of the entries from begin on (sent).
template <class B>
concept has_mark_sent = requires(B& b, const probe_source<B>& s, const probe_output<B>& out) {
  b.mark_sent(s, out, std::size_t{});
};
/// scatter_add(in, dense, scale): dense[i] += scale v for every entry (i, v) of in; an
/// index out of range is a sidco::error before anything is written.
template <class B>
concept has_scatter_add = requires(B& b, const probe_output<B>& in,
                                   typename B::memory::template view<float> dense) {
  b.scatter_add(in, dense, 1.0f);
};

}  // namespace contract

/// Everything above: what compressor<..., Backend> needs.
template <class B>
concept backend = contract::has_memory<B> && contract::has_name<B> && contract::has_analyze<B> &&
                  contract::has_tail<B> && contract::has_count_above<B> && contract::has_coarse_histograms<B> &&
                  contract::has_kth_largest_bins<B> && contract::has_first_nonfinite<B> &&
                  contract::has_select_above<B> && contract::has_select_band<B> && contract::has_select_random<B> &&
                  contract::has_sample_magnitudes<B> && contract::has_keep_top_k<B> && contract::has_merge_runs<B> &&
                  contract::has_mark_sent<B> && contract::has_scatter_add<B>;

/// True, or a compile error whose first line names what B lacks.
template <class B>
consteval bool diagnose() {
  using sidco::detail::requirement;  // names the type in the assertion's first line
  static_assert(requirement<B, (requires { sizeof(B); })>::holds,
                "sidco backend: the backend's type is incomplete: include its header "
                "(sidco/backend/cpu.hpp for backend::cpu, sidco/backend/cuda.cuh for backend::cuda)");
  static_assert(requirement<B, contract::has_memory<B>>::holds,
                "sidco backend: missing `memory`, the memory space its buffers live in "
                "(memory::host for a CPU backend)");
  if constexpr (contract::has_memory<B>) {
    static_assert(requirement<B, contract::has_name<B>>::holds,
                  "sidco backend: missing `static constexpr const char* name`");
    static_assert(requirement<B, contract::has_analyze<B>>::holds,
                  "sidco backend: missing analyze<Stats>(source, layout, probes, out), the moments pass");
    static_assert(requirement<B, contract::has_tail<B>>::holds,
                  "sidco backend: missing tail<Log>(source, t), the excess moments over one threshold");
    static_assert(requirement<B, contract::has_count_above<B>>::holds, "sidco backend: missing count_above(source, t)");
    static_assert(requirement<B, contract::has_coarse_histograms<B>>::holds,
                  "sidco backend: missing coarse_histograms(source, layout, counts)");
    static_assert(requirement<B, contract::has_kth_largest_bins<B>>::holds,
                  "sidco backend: missing kth_largest_bins(targets, out)");
    static_assert(requirement<B, contract::has_first_nonfinite<B>>::holds,
                  "sidco backend: missing first_nonfinite(source) returning nonfinite_value");
    static_assert(requirement<B, contract::has_select_above<B>>::holds,
                  "sidco backend: missing select_above<Final>(source, layout, thresholds, out, hint, kept)");
    static_assert(requirement<B, contract::has_select_band<B>>::holds,
                  "sidco backend: missing select_band(source, low, high, out)");
    static_assert(requirement<B, contract::has_select_random<B>>::holds,
                  "sidco backend: missing select_random(source, k, state, out)");
    static_assert(requirement<B, contract::has_sample_magnitudes<B>>::holds,
                  "sidco backend: missing sample_magnitudes(source, state, out)");
    static_assert(requirement<B, contract::has_keep_top_k<B>>::holds,
                  "sidco backend: missing keep_top_k(out, begin, run_sizes, keep)");
    static_assert(requirement<B, contract::has_merge_runs<B>>::holds,
                  "sidco backend: missing merge_runs(out, begin, run_starts)");
    static_assert(requirement<B, contract::has_mark_sent<B>>::holds,
                  "sidco backend: missing mark_sent(source, out, begin)");
    static_assert(requirement<B, contract::has_scatter_add<B>>::holds,
                  "sidco backend: missing scatter_add(in, dense, scale)");
  }
  return backend<B>;
}

}  // namespace sidco::backend
