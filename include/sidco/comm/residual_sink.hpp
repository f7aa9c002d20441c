// Where an exchange puts back what it took from a residual but did not apply: entries over a
// capacity, entries the global selection left out, every entry of a step that failed. The
// compressor left +0 at each index it sent, so giving back is residual[index] = value. A core
// gives each index back at most once a call, and the reduce-scatter core once a step, pack and
// apply together (its compact rounding remainders wait for the step's outcome: comm/compact.hpp
// give_back_rounded), so that entries a transport writes into device memory at once cannot race.
// One concept, one routine: every exchange and transport gives back through give_back_unkept
// into a residual_sink, a host span (host_residual) or entries staged for one upload to
// device memory (staged_residual; backend/cuda/entries.cuh writes them).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sidco::comm {

/// Takes entries back: give_back(index, value) puts value at index (index in the exchange's
/// dense space).
template <class Sink, class T, class Index>
concept residual_sink = requires(Sink& sink, Index index, T value) { sink.give_back(index, value); };

/// A residual in host memory (empty: no error feedback; what is given back is dropped).
template <class T>
struct host_residual {
  std::span<T> values;
  template <class Index>
  void give_back(Index index, T value) {
    if (!values.empty()) values[std::size_t(index)] = value;
  }
};

/// Entries kept on the host until a transport writes them into device memory in one go.
template <class T, class Index>
struct staged_residual {
  std::vector<Index> indices;
  std::vector<T> values;
  void give_back(Index index, T value) {
    indices.push_back(index);
    values.push_back(value);
  }
  void clear() {
    indices.clear();
    values.clear();
  }
  std::size_t size() const { return indices.size(); }
};

/// sink.give_back(indices[j], values[j]) for each entry whose index kept (ascending) lacks,
/// in order; every entry when kept is empty and keep_none is set. indices must ascend.
/// Returns how many it gave back. The one write-back routine every exchange calls.
template <class T, class Index, class Sink>
  requires residual_sink<Sink, T, Index>
std::size_t give_back_unkept(std::span<const Index> indices, std::span<const T> values, std::span<const Index> kept,
                             Sink& sink) {
  std::size_t k = 0, given = 0;
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const Index i = indices[j];
    while (k < kept.size() && kept[k] < i) ++k;
    if (k < kept.size() && kept[k] == i) continue;
    sink.give_back(i, values[j]);
    ++given;
  }
  return given;
}

/// Every entry back into sink (a step that failed, or will not be sent).
template <class T, class Index, class Sink>
  requires residual_sink<Sink, T, Index>
std::size_t give_back_all(std::span<const Index> indices, std::span<const T> values, Sink& sink) {
  return give_back_unkept<T, Index>(indices, values, std::span<const Index>{}, sink);
}

}  // namespace sidco::comm
