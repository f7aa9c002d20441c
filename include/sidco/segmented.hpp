// Layer-wise compression: one estimate per tensor of a flat model buffer, one sparse vector,
// two passes over the buffer whatever the number of layers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "sidco/compressor.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/single_user.hpp"

namespace sidco {

/// Real models are many tensors of very different scales: one distribution fitted to their
/// concatenation is a mixture and misses. segmented<Compressor> keeps one compressor per
/// segment (each with its own adaptive state and probes) and one backend, gathers every
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
class segmented {
  using Backend = typename Compressor::backend_type;
  using Estimator = typename Compressor::estimator_type;
  using Selection = typename Compressor::selection_type;
  using memory = typename Compressor::memory_space;
  template <class T>
  using view = typename memory::template view<T>;

 public:
  /// density for segment i of the layout, given the overall delta.
  using budget_policy = std::function<double(std::size_t index, const segment&, double delta)>;

  /// Every segment starts as a copy of prototype, and the passes run on a copy of the
  /// prototype's backend (for backend::cuda: its stream).
  explicit segmented(std::vector<segment> layout, Compressor prototype = Compressor{}, budget_policy budget = {})
      : segmented(std::move(layout), prototype, std::move(budget), prototype.backend()) {}
  /// The same, with the passes on backend instead.
  segmented(std::vector<segment> layout, Compressor prototype, budget_policy budget, Backend backend)
      : layout_(std::move(layout)), budget_(std::move(budget)), backend_(std::move(backend)) {
    total_ = check::layout(layout_);
    const std::size_t n = layout_.size();
    compressors_.assign(n, prototype);
    reports_.resize(n);
    densities_.resize(n);
    capped_.resize(n);
    thresholds_.resize(n);
    kept_.resize(n);
    estimates_.resize(n);
  }

  std::size_t total_size() const { return total_; }
  const std::vector<segment>& layout() const { return layout_; }
  /// The per-segment densities and reports of the last call.
  const std::vector<double>& segment_densities() const { return densities_; }
  const std::vector<compress_report>& segment_reports() const { return reports_; }
  Compressor& segment_compressor(std::size_t i) { return compressors_.at(i); }
  Backend& backend() { return backend_; }

  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out) {
    check(gradient.size(), delta, out);
    return run(backend::plain_source<T, memory>{gradient.data(), gradient.size()}, "gradient", delta, out);
  }

  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out, feedback::residual<T, memory>& residual) {
    check(gradient.size(), delta, out);
    check::same_size("residual", residual.size(), gradient.size());
    return run(backend::feedback_source<T, memory>{gradient.data(), residual.data(), gradient.size()},
               "gradient + residual", delta, out);
  }

  /// DGC per segment: compresses the momentum-corrected accumulation and masks what was sent.
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out, feedback::momentum<T, memory>& state) {
    check(gradient.size(), delta, out);
    check::same_size("momentum", state.size(), gradient.size());
    return run(backend::momentum_source<T, memory>{gradient.data(), state.velocity_data(), state.accumulation_data(),
                                                   state.factor(), gradient.size()},
               "momentum-corrected gradient", delta, out);
  }

  /// Segment i's compressor state (compressor::save_state): one per segment, so that a
  /// tensor's state can follow it into another layout.
  void save_segment_state(std::size_t i, state_writer& out) const { compressors_.at(i).save_state(out); }
  void load_segment_state(std::size_t i, state_reader& in) { compressors_.at(i).load_state(in); }

  /// Every segment's state, in order; a state of another layout or method is refused and
  /// nothing changes.
  void save_state(state_writer& out) const {
    out.name("sidco.segmented");
    out.word(compressors_.size());
    for (const auto& c : compressors_) c.save_state(out);
  }
  void load_state(state_reader& in) {
    in.expect("sidco.segmented");
    const std::uint64_t count = in.word("segmented: segment count");
    if (count != compressors_.size())
      detail::fail("state: segmented: holds ", count, " segments, the layout has ", compressors_.size());
    std::vector<Compressor> loaded = compressors_;
    for (auto& c : loaded) c.load_state(in);
    compressors_ = std::move(loaded);
  }

  /// Bytes kept between calls besides the output.
  std::size_t workspace_bytes() const {
    std::size_t bytes = probes_.capacity() * sizeof(double) + measured_.capacity() * sizeof(moments);
    for (const auto& c : compressors_) bytes += c.workspace_bytes();
    return bytes;
  }

 private:
  template <class T, class Index>
  void check(std::size_t size, double delta, const sparse_vector<T, Index, memory>& out) {
    Compressor::check_arguments(size, delta, out);
    if (size != total_size())
      detail::fail("gradient: size ", size, " does not match the layout's total ", total_size());
  }

  const moments& all_of(std::size_t s) const { return measured_[s * (1 + per_)]; }
  std::span<const moments> probes_of(std::size_t s) const {
    return std::span<const moments>(measured_).subspan(s * (1 + per_) + 1, per_);
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
        const double nonzero = double(all_of(i).nonzero());
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
      const double count = capped_[i] ? double(all_of(i).nonzero()) : share * n;
      // At least one entry, at most all: a density in (0, 1] whatever the rounding.
      densities_[i] = std::clamp(count, 1.0, n) / n;
    }
  }

  template <class Source, class T, class Index>
  compress_report run(const Source& source, const char* what, double delta, sparse_vector<T, Index, memory>& out) {
    const detail::single_user::scope in_use(user_, "segmented::compress");
    const std::size_t n = layout_.size();
    // One moments pass for every segment, with each one's probes (unused slots: +inf).
    per_ = 0;
    for (const auto& c : compressors_) per_ = std::max(per_, c.probe_count());
    probes_.assign(n * per_, std::numeric_limits<double>::infinity());
    for (std::size_t s = 0; s < n; ++s)
      compressors_[s].probe_thresholds(std::span<double>(probes_).subspan(s * per_, compressors_[s].probe_count()));
    measured_.resize(n * (1 + per_));
    backend_.template analyze<typename Estimator::statistics>(source, layout_, probes_, measured_);
    moments all;
    for (std::size_t s = 0; s < n; ++s) all.merge(all_of(s));
    Compressor::check_finite(backend_, source, all, what);  // before anything is written
    share_budget(delta);
    out.clear(total_size());

    if constexpr (Selection::fuses_layers) {
      std::size_t hint = 0;
      for (std::size_t s = 0; s < n; ++s) {
        const auto part = source.slice(layout_[s].offset, layout_[s].size);
        estimates_[s] = compressors_[s].estimate_threshold(backend_, part, all_of(s), probes_of(s), densities_[s]);
        thresholds_[s] = estimates_[s].first.threshold;
        hint += target_count(densities_[s], layout_[s].size);
      }
      backend_.template select_above<true>(source, layout_, thresholds_, out, hint, kept_);
      for (std::size_t s = 0; s < n; ++s)
        reports_[s] = compressors_[s].complete(estimates_[s].first, estimates_[s].second, {kept_[s], 0},
                                               kept_[s], all_of(s), densities_[s], layout_[s].size);
    } else {
      for (std::size_t s = 0; s < n; ++s)
        reports_[s] = compressors_[s].finish(backend_, source.slice(layout_[s].offset, layout_[s].size),
                                             all_of(s), probes_of(s), densities_[s], out);
    }

    compress_report total;
    total.size = total_size();
    total.target_density = delta;
    total.threshold = -1;  // one per segment: see segment_reports()
    for (const auto& r : reports_) {
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
  std::vector<Compressor> compressors_;
  std::vector<compress_report> reports_;
  std::vector<double> densities_;
  std::vector<bool> capped_;
  std::size_t per_ = 0;             // probes per segment in this call
  std::vector<double> probes_;      // per segment: per_ thresholds
  std::vector<moments> measured_;   // per segment: all, then the per_ probes' tails
  std::vector<double> thresholds_;
  std::vector<std::size_t> kept_;
  std::vector<std::pair<estimate::threshold_estimate, int>> estimates_;
  [[no_unique_address]] detail::single_user user_;
};

}  // namespace sidco
