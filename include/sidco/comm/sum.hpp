// How every exchange turns the ranks' values at one index into the update, written once:
// the all-gather's decode, the reduce-scatter owner's reduction and the hook's codecs (CPU
// buffers, and CUDA buffers through their host path) all call sum_runs and combine, so
// their bits and their overflow rule cannot drift apart.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"

namespace sidco::comm {

/// One rank's entries as they lie in a payload (or any two arrays): count indices of type
/// Index, ascending, and count values of type T, read by memcpy (no alignment needed).
template <class T, class Index>
struct entry_run {
  const std::byte* indices = nullptr;
  const std::byte* values = nullptr;
  std::size_t count = 0;

  std::uint64_t index(std::size_t j) const {
    Index i;
    std::memcpy(&i, indices + j * sizeof(Index), sizeof i);
    return std::uint64_t(i);
  }
  T value(std::size_t j) const {
    T v;
    std::memcpy(&v, values + j * sizeof(T), sizeof v);
    return v;
  }
  /// The value at index, if this run holds it (binary search).
  bool find(std::uint64_t at, T& value_out) const {
    std::size_t low = 0, high = count;
    while (low < high) {
      const std::size_t middle = low + (high - low) / 2;
      if (index(middle) < at) low = middle + 1;
      else high = middle;
    }
    if (low == count || index(low) != at) return false;
    value_out = value(low);
    return true;
  }
};

/// What the ranks' values at an index become: their sum, or for an average the sum divided
/// by the rank count.
struct sum_rule {
  reduction op = reduction::average;
  std::size_t ranks = 1;
};

/// Indices per window of sum_runs: its sums and bitmap stay in L1.
inline constexpr std::size_t sum_window = 4096;

namespace detail {

/// emit(window + at, slots[at]) for every index at marked in seen (touched: bit w set where
/// seen[w] is nonzero), ascending, each slot put back to Slot{} and seen cleared: the end of
/// one window of fold_runs_windowed and fold_runs_grouped (inlined there: their emit, a
/// local, stays in registers).
template <class Slot, std::size_t Words, class Emit>
void emit_window(std::array<Slot, sum_window>& slots, std::array<std::uint64_t, Words>& seen, std::uint64_t touched,
                 std::uint64_t window, Emit& emit) {
  for (; touched != 0; touched &= touched - 1) {
    const std::size_t word = std::size_t(std::countr_zero(touched));
    for (std::uint64_t bits = seen[word]; bits != 0; bits &= bits - 1) {
      const std::size_t at = word * 64 + std::size_t(std::countr_zero(bits));
      const Slot slot = slots[at];
      slots[at] = Slot{};
      emit(window + at, slot);
    }
    seen[word] = 0;
  }
}

/// emit(index, slot) for every index in [begin, end) some run holds, ascending, where slot
/// is Slot{} folded with the runs' values at that index in run order (fold(slot, value)).
/// Every run must be ascending and inside [begin, end). The range is walked in windows of
/// sum_window indices, each starting at the lowest index a run holds next (windows no entry
/// falls in are never visited): each run's entries in the window (its cursor only moves
/// forward) are folded into a window-sized array, a bitmap marks the indices seen, and the
/// bitmap walked in order emits them; O(entries + runs x windows holding an entry).
/// emit is taken and returned by value, so that what it writes through and counts stays in
/// registers (a callable held by reference kept its counter in memory: 25% slower).
template <class T, class Index, class Slot, class Fold, class Emit>
Emit fold_runs_windowed(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end, Fold fold,
                        Emit emit) {
  constexpr std::size_t words = sum_window / 64;
  static_assert(words <= 64, "one summary word marks the window's nonzero bitmap words");
  struct cursor {
    const std::byte* indices;
    const std::byte* values;
    std::size_t count, at;
  };
  std::array<cursor, 16> few;
  std::unique_ptr<cursor[]> many;
  cursor* cursors = few.data();
  if (runs.size() > few.size()) {
    many = std::make_unique<cursor[]>(runs.size());
    cursors = many.get();
  }
  for (std::size_t r = 0; r < runs.size(); ++r) cursors[r] = {runs[r].indices, runs[r].values, runs[r].count, 0};
  // Slot{} between uses (the emit loop restores each slot it reads), so that every entry
  // folds without asking whether its index was seen.
  std::array<Slot, sum_window> slots{};
  std::array<std::uint64_t, words> seen{};
  const auto next_index = [&] {
    std::size_t next = end;
    for (std::size_t r = 0; r < runs.size(); ++r)
      if (cursors[r].at < cursors[r].count) {
        Index stored;
        std::memcpy(&stored, cursors[r].indices + cursors[r].at * sizeof(Index), sizeof stored);
        next = std::min(next, std::size_t(stored));
      }
    return next;
  };
  for (std::size_t window = std::max(begin, next_index()), next = end; window < end; window = next, next = end) {
    const std::size_t window_end = std::min(end, window + sum_window);
    std::uint64_t touched = 0;  // bit w: seen[w] has a bit set (most are empty at a few %)
    for (std::size_t r = 0; r < runs.size(); ++r) {
      // The cursor in locals: stores to seen (64-bit words) could otherwise alias it.
      const std::byte* const indices = cursors[r].indices;
      const std::byte* const values = cursors[r].values;
      const std::size_t count = cursors[r].count;
      std::size_t e = cursors[r].at;
      for (; e < count; ++e) {
        Index stored;
        std::memcpy(&stored, indices + e * sizeof(Index), sizeof stored);
        const std::uint64_t index = std::uint64_t(stored);
        if (index >= window_end) {
          next = std::min(next, std::size_t(index));  // the next window starts at the lowest
          break;
        }
        const std::size_t at = std::size_t(index) - window;
        T v;
        std::memcpy(&v, values + e * sizeof(T), sizeof v);
        fold(slots[at], v);
        seen[at / 64] |= std::uint64_t(1) << (at % 64);
        touched |= std::uint64_t(1) << (at / 64);
      }
      cursors[r].at = e;
    }
    emit_window(slots, seen, touched, std::uint64_t(window), emit);
  }
  return emit;
}

/// fold_runs_windowed's result by another walk, for many short runs (an owner's P blocks and
/// the P owners' selections at many ranks, where every window asks every run): the entries
/// first grouped by window in run order (a counting sort on the window), then each window's
/// folded as fold_runs_windowed folds them; O(entries + windows of the range), whatever the
/// number of runs. The same bits: each index's values fold from Slot{} in run order either way.
template <class T, class Index, class Slot, class Fold, class Emit>
Emit fold_runs_grouped(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end, Fold fold,
                       Emit emit) {
  constexpr std::size_t words = sum_window / 64;
  if (end <= begin) return emit;
  struct entry {
    std::uint32_t at;  // the index's place in its window
    T value;
  };
  const std::size_t windows = (end - begin + sum_window - 1) / sum_window;
  std::vector<std::size_t> first(windows + 1, 0);  // window w's entries: [first[w], first[w + 1])
  std::size_t total = 0;
  for (const auto& run : runs)
    for (std::size_t e = 0; e < run.count; ++e) {
      const std::uint64_t index = run.index(e);
      if (index < begin || index >= end) continue;
      ++first[(index - begin) / sum_window + 1];
      ++total;
    }
  for (std::size_t w = 0; w < windows; ++w) first[w + 1] += first[w];
  std::vector<entry> grouped(total);
  {
    std::vector<std::size_t> next(first.begin(), first.end() - 1);
    for (const auto& run : runs)
      for (std::size_t e = 0; e < run.count; ++e) {
        const std::uint64_t index = run.index(e);
        if (index < begin || index >= end) continue;
        const std::size_t offset = std::size_t(index - begin);
        grouped[next[offset / sum_window]++] = {std::uint32_t(offset % sum_window), run.value(e)};
      }
  }
  std::array<Slot, sum_window> slots{};
  std::array<std::uint64_t, words> seen{};
  for (std::size_t w = 0; w < windows; ++w) {
    if (first[w] == first[w + 1]) continue;
    std::uint64_t touched = 0;
    for (std::size_t j = first[w]; j < first[w + 1]; ++j) {
      const std::size_t at = grouped[j].at;
      fold(slots[at], grouped[j].value);
      seen[at / 64] |= std::uint64_t(1) << (at % 64);
      touched |= std::uint64_t(1) << (at / 64);
    }
    emit_window(slots, seen, touched, std::uint64_t(begin) + std::uint64_t(w) * sum_window, emit);
  }
  return emit;
}

/// Whether fold_runs groups first: when the windowed walk would ask every run at every
/// window holding an entry (runs x windows) more often than there are entries and windows
/// (bench/exchange_bench.cpp's reduce_rank on payloads: grouping wins from 64 runs of a
/// 3.7M-value tensor, loses at 16; its sum_runs on plain arrays: from 256).
template <class T, class Index>
bool fold_grouped(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end) {
  if (end <= begin) return false;
  std::size_t total = 0;
  for (const auto& run : runs) total += run.count;
  const std::size_t windows = (end - begin + sum_window - 1) / sum_window;
  return runs.size() * std::min(total, windows) > total + windows;
}

/// emit(index, slot) for every index in [begin, end) some run holds, ascending, where slot is
/// Slot{} folded with the runs' values at that index in run order: by the windowed walk or
/// the grouped one, whichever costs less for these runs (the same bits).
template <class T, class Index, class Slot, class Fold, class Emit>
Emit fold_runs(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end, Fold fold, Emit emit) {
  if (fold_grouped(runs, begin, end))
    return fold_runs_grouped<T, Index, Slot>(runs, begin, end, std::move(fold), std::move(emit));
  return fold_runs_windowed<T, Index, Slot>(runs, begin, end, std::move(fold), std::move(emit));
}

/// What sum_runs folds: A(0) plus each value, in T's accumulator type A.
template <class T>
struct accumulate {
  using A = typename float_traits<T>::accumulator;
  void operator()(A& sum, T v) const { sum = A(sum + to_accumulator(v)); }
};

}  // namespace detail

/// emit(index, sum) for every index in [begin, end) some run holds, ascending, where sum is
/// A(0) plus the runs' values at that index added in run order, in T's accumulator type A
/// (detail::fold_runs: O(entries + runs x windows holding an entry), or O(entries) for many
/// short runs). Every run must be ascending and inside [begin, end).
template <class T, class Index, class Emit>
Emit sum_runs(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end, Emit emit) {
  return detail::fold_runs<T, Index, typename float_traits<T>::accumulator>(runs, begin, end, detail::accumulate<T>{},
                                                                           std::move(emit));
}

/// emit(index, value) for every entry of runs whose indices are disjoint (each index in one
/// run at most), ascending: their merge, each value's bits as the run held them.
template <class T, class Index, class Emit>
Emit merge_disjoint_runs(std::span<const entry_run<T, Index>> runs, std::size_t begin, std::size_t end, Emit emit) {
  return detail::fold_runs<T, Index, T>(runs, begin, end, [](T& slot, T v) { slot = v; }, std::move(emit));
}

/// The sum of the runs' values at index each divided by ranks first, in run order, from
/// A(0): an average that stays finite where every value is but their sum overflows.
template <class T, class Index>
typename float_traits<T>::accumulator sum_divided_first(std::span<const entry_run<T, Index>> runs,
                                                        std::uint64_t index, std::size_t ranks) {
  using A = typename float_traits<T>::accumulator;
  const A divisor = A(double(ranks));
  A sum = A(0);
  for (const auto& run : runs) {
    T v;
    if (run.find(index, v)) sum = A(sum + A(to_accumulator(v) / divisor));
  }
  return sum;
}

/// Whether count values are all finite: one branch-free pass that vectorizes (a test per
/// value kept an owner's loop scalar).
template <class V>
bool all_finite(const V* values, std::size_t count) {
  typename float_traits<V>::key beyond = 0;
  for (std::size_t j = 0; j < count; ++j) {
    typename float_traits<V>::key bits;
    std::memcpy(&bits, values + j, sizeof bits);
    beyond |= decltype(beyond)((bits & ~float_traits<V>::sign) >= float_traits<V>::infinity);
  }
  return beyond == 0;
}

namespace detail {

/// The rule's common case: sum divided once by ranks, in the accumulator type.
template <class A>
A divided_once(A sum, std::size_t ranks) {
  return A(sum / A(double(ranks)));
}

template <class T>
[[noreturn]] void beyond_range(std::uint64_t index, bool average, double result) {
  throw nonfinite_error(sidco::detail::message("exchange: the ranks' values at index ", index,
                                               average ? " average " : " add up to ", result, ", beyond ",
                                               float_traits<T>::name, "'s range"));
}

}  // namespace detail

/// The one rule: sum (the rank-order sum in the accumulator type) becomes, for a sum, itself;
/// for an average, sum / ranks where sum is finite, else divided_first() (the values each
/// divided before they are added: finite where every value is); then rounded once to T.
/// A result beyond T's range throws sidco::nonfinite_error naming index (every rank reads
/// the same values, so every rank throws it alike).
template <class T, class DividedFirst>
T combine(typename float_traits<T>::accumulator sum, const sum_rule& rule, std::uint64_t index,
          DividedFirst&& divided_first) {
  using A = typename float_traits<T>::accumulator;
  const bool average = rule.op == reduction::average;
  A result = sum;
  if (average) result = std::isfinite(double(sum)) ? detail::divided_once(sum, rule.ranks) : divided_first();
  const T rounded = from_accumulator<T>(result);
  if (!std::isfinite(double(to_accumulator(rounded)))) detail::beyond_range<T>(index, average, double(result));
  return rounded;
}

/// combine() over count finite sums at once (an owner's kept entries: a loop that
/// vectorizes): out[j] = the rule's result for sums[j]. Throws as combine() does, naming
/// indices[j], for the first result beyond T's range.
template <class T, class Index>
void combine_finite(const typename float_traits<T>::accumulator* sums, const Index* indices, std::size_t count,
                    const sum_rule& rule, T* out) {
  if (rule.op == reduction::average) {
    for (std::size_t j = 0; j < count; ++j) out[j] = from_accumulator<T>(detail::divided_once(sums[j], rule.ranks));
  } else {
    for (std::size_t j = 0; j < count; ++j) out[j] = from_accumulator<T>(sums[j]);
  }
  if (all_finite(out, count)) return;
  for (std::size_t j = 0; j < count; ++j)
    if (!std::isfinite(double(to_accumulator(out[j]))))
      detail::beyond_range<T>(std::uint64_t(indices[j]), rule.op == reduction::average,
                              rule.op == reduction::average ? double(detail::divided_once(sums[j], rule.ranks))
                                                            : double(sums[j]));
}

}  // namespace sidco::comm
