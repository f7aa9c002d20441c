// Layer-wise compression: one estimate per tensor of a flat model buffer, one sparse vector,
// two passes over the buffer whatever the number of layers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "sidco/compressor.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/single_user.hpp"
#include "sidco/pipeline/front_end.hpp"
#include "sidco/pipeline/input.hpp"
#include "sidco/pipeline/run.hpp"
#include "sidco/pipeline/scratch.hpp"

namespace sidco {

/// Real models are many tensors of very different scales: one distribution fitted to their
/// concatenation is a mixture and misses. segmented<Compressor> keeps one tensor state (estimator
/// and selection, with their adaptive state and probes) per segment and one backend, and
/// runs the pipeline compressor runs over one segment (pipeline/run.hpp): it gathers every
/// segment's moments in one threaded pass over the flat buffer (threads split the buffer,
/// not the layers), fits every segment, then selects: with a selection that fuses layers
/// (above_threshold), in one pass with each element's own segment threshold; otherwise
/// segment by segment. Indices in the one sparse vector are global.
/// The budget is delta times the whole length. By default it is shared in proportion to the
/// segments' lengths, except that no segment is given more than its non-zeros (an embedding
/// with unused rows cannot deliver its share): the surplus goes to the other segments, in
/// proportion to their lengths (water-filling). A budget policy can set densities instead.
/// Bad input anywhere is rejected before anything is written.
template <class Compressor>
class segmented : public pipeline::front_end<segmented<Compressor>, typename Compressor::memory_space> {
  using Backend = typename Compressor::backend_type;
  using Estimator = typename Compressor::estimator_type;
  using Selection = typename Compressor::selection_type;
  using State = typename Compressor::state_type;
  using memory = typename Compressor::memory_space;

 public:
  /// density for segment i of the layout, given the overall delta.
  using budget_policy = std::function<double(std::size_t index, const segment&, double delta)>;

  /// Every segment starts as a copy of prototype's tensor state, and the passes run on a copy of
  /// the prototype's backend (for backend::cuda: its stream).
  explicit segmented(std::vector<segment> layout, Compressor prototype = Compressor{}, budget_policy budget = {})
      : segmented(std::move(layout), prototype, std::move(budget), prototype.backend()) {}
  /// The same, with the passes on backend instead.
  segmented(std::vector<segment> layout, Compressor prototype, budget_policy budget, Backend backend)
      : layout_(std::move(layout)), budget_(std::move(budget)), backend_(std::move(backend)) {
    total_ = check::layout(layout_);
    states_.assign(layout_.size(), prototype.tensor_state());
    capped_.resize(layout_.size());
    work_.view(layout_.size(), 0);
  }

  std::size_t total_size() const { return total_; }
  const std::vector<segment>& layout() const { return layout_; }
  /// The per-segment densities and reports of the last call.
  const std::vector<double>& segment_densities() const { return work_.densities(); }
  const std::vector<compress_report>& segment_reports() const { return work_.reports(); }
  /// Segment i's estimator and selection, with their state.
  State& segment_state(std::size_t i) { return states_.at(i); }
  Backend& backend() { return backend_; }

  // compress(gradient, delta, out[, residual or momentum]): pipeline/front_end.hpp (the
  // gradient's size must be total_size()).

  /// Segment i's state (compressor::save_state writes the same): one per segment, so that
  /// a tensor's state can follow it into another layout or into a compressor.
  void save_segment_state(std::size_t i, state_writer& out) const { states_.at(i).save_state(out); }
  void load_segment_state(std::size_t i, state_reader& in) { states_.at(i).load_state(in); }

  /// Every segment's state, in order; a state of another layout or method is refused and
  /// nothing changes.
  void save_state(state_writer& out) const {
    out.name("sidco.segmented");
    out.word(states_.size());
    for (const auto& s : states_) s.save_state(out);
  }
  void load_state(state_reader& in) {
    in.expect("sidco.segmented");
    const std::uint64_t count = in.word("segmented: segment count");
    if (count != states_.size())
      detail::fail("state: segmented: holds ", count, " segments, the layout has ", states_.size());
    std::vector<State> loaded = states_;
    for (auto& s : loaded) s.load_state(in);
    states_ = std::move(loaded);
  }

  /// Bytes kept between calls besides the output.
  std::size_t workspace_bytes() const {
    std::size_t bytes = work_.bytes() + capped_.capacity() / 8;
    if constexpr (requires { backend_.workspace_bytes(); }) bytes += backend_.workspace_bytes();
    for (const auto& s : states_) bytes += s.workspace_bytes();
    return bytes;
  }

 private:
  friend pipeline::front_end<segmented, memory>;

  template <class T, class Index>
  void check_call(std::size_t size, double delta, const sparse_vector<T, Index, memory>& out) const {
    pipeline::check_call(size, delta, out);
    if (size != total_size())
      detail::fail("gradient: size ", size, " does not match the layout's total ", total_size());
  }

  // A budget policy's densities (each checked; nothing is written yet when one is bad), or
  // water-filling: segments whose non-zeros are fewer than their proportional share are
  // capped there; the rest share what is left in proportion to their lengths.
  void share_budget(const pipeline::scratch& work, double delta) {
    if (budget_) {
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        work.densities[i] = budget_(i, layout_[i], delta);
        if (!(work.densities[i] > 0 && work.densities[i] <= 1))
          detail::fail("budget policy: density ", work.densities[i], " for segment ", i, " is outside (0, 1]");
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
        const double nonzero = double(work.all_of(i).nonzero());
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
      const double count = capped_[i] ? double(work.all_of(i).nonzero()) : share * n;
      // At least one entry, at most all: a density in (0, 1] whatever the rounding.
      work.densities[i] = std::clamp(count, 1.0, n) / n;
    }
  }

  template <class Source, class T, class Index>
  compress_report run(const pipeline::input<Source>& in, double delta, sparse_vector<T, Index, memory>& out) {
    const detail::single_user::scope in_use(user_, "segmented::compress");
    const pipeline::scratch work =
        work_.view(layout_.size(), pipeline::probes_per_segment(std::span<const State>(states_),
                                                                pipeline::probe_limit<Source>));
    pipeline::run<typename Estimator::statistics, Selection>(
        backend_, std::span<State>(states_), std::span<const segment>(layout_), in.source, in.what, out, work,
        [&](const pipeline::scratch& w) { share_budget(w, delta); });

    compress_report total;
    total.size = total_size();
    total.target_density = delta;
    total.threshold = -1;  // one per segment: see segment_reports()
    for (const auto& r : work.reports) {
      total.selected += r.selected;
      total.candidates += r.candidates;
      total.zeros += r.zeros;
      total.rescans += r.rescans;
      total.passes += r.passes;
      total.stages = std::max(total.stages, r.stages);
      total.fallback |= r.fallback;
    }
    total.density = double(total.selected) / double(total.size);
    return total;
  }

  std::vector<segment> layout_;
  std::size_t total_ = 0;
  budget_policy budget_;
  Backend backend_;
  std::vector<State> states_;
  std::vector<bool> capped_;
  pipeline::growing_scratch work_;
  [[no_unique_address]] detail::single_user user_;
};

}  // namespace sidco
