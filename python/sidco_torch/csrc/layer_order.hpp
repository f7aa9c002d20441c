// A bucket's layers in two orders: as DDP lays them out in the bucket (which changes when DDP
// rebuilds its buckets, and between a run and its resumption), and as the reduce-scatter
// exchange lays them out (sorted by parameter key: the same in every run and on every rank),
// so that its owners and checkpoint do not depend on DDP's order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include <sidco/core/error.hpp>
#include <sidco/core/segment.hpp>
#include <sidco/core/sparse_vector.hpp>

namespace sidco_torch {

class layer_order {
 public:
  layer_order() = default;
  /// bucket: the layers as the bucket holds them; order[c]: the layer at the exchange's
  /// position c (a permutation of 0 .. layers - 1; empty: the bucket's order).
  layer_order(const std::vector<sidco::segment>& bucket, const std::vector<std::int64_t>& order) : bucket_(bucket) {
    const std::size_t layers = bucket.size();
    if (!order.empty() && order.size() != layers)
      sidco::throw_error("order: ", order.size(), " positions for ", layers, " layers");
    order_.resize(layers);
    std::vector<char> seen(layers, 0);
    for (std::size_t c = 0; c < layers; ++c) {
      const std::int64_t layer = order.empty() ? std::int64_t(c) : order[c];
      if (layer < 0 || std::size_t(layer) >= layers || seen[std::size_t(layer)])
        sidco::throw_error("order: position ", c, " holds layer ", layer, ", not a permutation of 0 .. ", layers - 1);
      seen[std::size_t(layer)] = 1;
      order_[c] = std::size_t(layer);
    }
    identity_ = true;
    std::size_t offset = 0;
    canonical_.reserve(layers);
    starts_.reserve(layers);
    for (std::size_t c = 0; c < layers; ++c) {
      const sidco::segment& layer = bucket_[order_[c]];
      canonical_.push_back({offset, layer.size});
      starts_.push_back(offset);
      identity_ = identity_ && layer.offset == offset;
      offset += layer.size;
    }
  }

  bool identity() const { return identity_; }
  /// The layers in the exchange's order, end to end.
  const std::vector<sidco::segment>& canonical_layout() const { return canonical_; }

  /// Where the exchange's index lies in the bucket.
  std::size_t to_bucket(std::size_t index) const {
    if (identity_) return index;
    const std::size_t c = std::size_t(std::upper_bound(starts_.begin(), starts_.end(), index) - starts_.begin()) - 1;
    return index - starts_[c] + bucket_[order_[c]].offset;
  }

  /// in (bucket indices, ascending) as the exchange orders it: each layer's run moved to
  /// its position, indices shifted; ascending again.
  template <class T, class Index>
  void to_exchange(const sidco::sparse_vector<T, Index>& in, sidco::sparse_vector<T, Index>& out) const {
    out.clear(in.dense_size());
    out.reserve(in.size());
    const auto indices = in.indices();
    const auto values = in.values();
    for (std::size_t c = 0; c < order_.size(); ++c) {
      const sidco::segment& layer = bucket_[order_[c]];
      auto from = std::lower_bound(indices.begin(), indices.end(), layer.offset,
                                   [](Index i, std::size_t at) { return std::size_t(i) < at; });
      const std::size_t shift_from = layer.offset, shift_to = starts_[c];
      for (auto at = from; at != indices.end() && std::size_t(*at) < layer.end(); ++at)
        out.push_back(Index(std::size_t(*at) - shift_from + shift_to), values[std::size_t(at - indices.begin())]);
    }
  }

 private:
  std::vector<sidco::segment> bucket_, canonical_;
  std::vector<std::size_t> order_, starts_;
  bool identity_ = true;
};

/// A residual sink (sidco/comm/residual_sink.hpp) in the exchange's order over one in the
/// bucket's.
template <class Sink>
struct bucket_sink {
  const layer_order& order;
  Sink& sink;
  template <class Index, class T>
  void give_back(Index index, T value) {
    sink.give_back(Index(order.to_bucket(std::size_t(index))), value);
  }
};

}  // namespace sidco_torch
