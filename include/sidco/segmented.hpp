// Layer-wise compression: one estimate per tensor of a flat model buffer, one sparse vector.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "sidco/compressor.hpp"
#include "sidco/core/error.hpp"

namespace sidco {

/// One tensor's place in the flat gradient.
struct segment {
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// Real models are many tensors of very different scales: one distribution fitted to their
/// concatenation is a mixture and misses. segmented<Compressor> keeps one compressor per
/// segment (each with its own adaptive state), estimates and selects per segment straight
/// from the flat buffer (no copies), and appends to one sparse vector with global indices.
/// The budget is delta times the whole length. By default it is shared in proportion to the
/// segments' lengths, except that no segment is given more than its non-zeros (an embedding
/// with unused rows cannot deliver its share): the surplus goes to the other segments, in
/// proportion to their lengths (water-filling). A budget policy can set densities instead.
/// Bad input anywhere is rejected before anything is written.
template <class Compressor>
class segmented {
 public:
  /// density for segment i of the layout, given the overall delta.
  using budget_policy = std::function<double(std::size_t index, const segment&, double delta)>;

  explicit segmented(std::vector<segment> layout, Compressor prototype = Compressor{},
                     budget_policy budget = {})
      : layout_(std::move(layout)), budget_(std::move(budget)) {
    if (layout_.empty()) detail::fail("layout is empty");
    std::size_t expected = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      if (layout_[i].offset != expected)
        detail::fail("layout: segment ", i, " starts at ", layout_[i].offset, ", expected ",
                     expected, " (segments must tile the gradient in order)");
      if (layout_[i].size == 0) detail::fail("layout: segment ", i, " is empty");
      expected += layout_[i].size;
    }
    compressors_.assign(layout_.size(), prototype);
    reports_.resize(layout_.size());
    moments_.resize(layout_.size());
    densities_.resize(layout_.size());
    capped_.resize(layout_.size());
  }

  std::size_t total_size() const { return layout_.back().offset + layout_.back().size; }
  const std::vector<segment>& layout() const { return layout_; }
  /// The per-segment densities and reports of the last call.
  const std::vector<double>& segment_densities() const { return densities_; }
  const std::vector<compress_report>& segment_reports() const { return reports_; }
  Compressor& segment_compressor(std::size_t i) { return compressors_.at(i); }

  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out) {
    check(gradient.size(), delta, out);
    return run(delta, out, "gradient", [&](const segment& s) {
      return backend::plain_source<T>{gradient.data() + s.offset, s.size, s.offset};
    });
  }

  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out, feedback::residual<T>& residual) {
    check(gradient.size(), delta, out);
    Compressor::check_state_size("residual", residual.size(), gradient.size());
    return run(delta, out, "gradient + residual", [&](const segment& s) {
      return backend::feedback_source<T>{gradient.data() + s.offset, residual.data() + s.offset,
                                         s.size, s.offset};
    });
  }

 private:
  template <class T, class Index>
  void check(std::size_t size, double delta, const sparse_vector<T, Index>& out) {
    Compressor::check_arguments(size, delta, out);
    if (size != total_size())
      detail::fail("gradient: size ", size, " does not match the layout's total ", total_size());
  }

  // A budget policy's densities (each checked; nothing is written yet when one is bad), or
  // water-filling: segments whose non-zeros are fewer than their proportional share are
  // capped there; the rest share what is left in proportion to their lengths.
  void share_budget(double delta) {
    if (budget_) {
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        densities_[i] = budget_(i, layout_[i], delta);
        if (!(densities_[i] > 0 && densities_[i] <= 1))
          detail::fail("budget policy: density ", densities_[i], " for segment ", i,
                       " is outside (0, 1]");
      }
      return;
    }
    std::fill(capped_.begin(), capped_.end(), false);
    double remaining = delta * double(total_size());
    double open_length = double(total_size());
    for (bool changed = true; changed;) {
      changed = false;
      const double share = open_length > 0 ? remaining / open_length : 0;
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const double nonzero = double(moments_[i].nonzero());
        if (!capped_[i] && nonzero <= share * double(layout_[i].size)) {
          capped_[i] = true;
          changed = true;
          remaining -= nonzero;
          open_length -= double(layout_[i].size);
        }
      }
    }
    const double share = open_length > 0 ? remaining / open_length : 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const double n = double(layout_[i].size);
      const double count = capped_[i] ? double(moments_[i].nonzero()) : share * n;
      // At least one entry, at most all: a density in (0, 1] whatever the rounding.
      densities_[i] = std::clamp(count, 1.0, n) / n;
    }
  }

  template <class T, class Index, class MakeSource>
  compress_report run(double delta, sparse_vector<T, Index>& out, const char* what,
                      MakeSource make_source) {
    // Every segment is checked before the first one writes anything.
    for (std::size_t i = 0; i < layout_.size(); ++i)
      moments_[i] = compressors_[i].analyze(make_source(layout_[i]), what);
    share_budget(delta);
    out.clear(total_size());
    compress_report total;
    total.size = total_size();
    total.target_density = delta;
    total.threshold = -1;  // one per segment: see segment_reports()
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      reports_[i] = compressors_[i].finish(make_source(layout_[i]), moments_[i], densities_[i],
                                           out);
      total.selected += reports_[i].selected;
      total.candidates += reports_[i].candidates;
      total.zeros += reports_[i].zeros;
      total.rescans += reports_[i].rescans;
      total.stages = std::max(total.stages, reports_[i].stages);
    }
    total.density = double(total.selected) / double(total.size);
    return total;
  }

  std::vector<segment> layout_;
  budget_policy budget_;
  std::vector<Compressor> compressors_;
  std::vector<compress_report> reports_;
  std::vector<moments> moments_;
  std::vector<double> densities_;
  std::vector<bool> capped_;
};

}  // namespace sidco
