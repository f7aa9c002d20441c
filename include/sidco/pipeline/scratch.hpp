// Per-segment working storage of one pipeline call: on the stack for one segment (a
// compressor allocates nothing of its own), in vectors kept between calls for many.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/pipeline/report.hpp"
#include "sidco/pipeline/tensor_state.hpp"
#include "sidco/select/candidates.hpp"
#include "sidco/select/result.hpp"

namespace sidco::pipeline {

/// Spans over a call's storage, per segment s: per probe thresholds; measured[s * (1 + per)]
/// the moments of the whole segment, then its per probes' tails; the segment's density,
/// estimate, threshold, kept count and report; for selections that rank candidates, its
/// target count, selection result, coarse radix bin and band starts
/// (select::bands_per_segment each).
struct scratch {
  std::size_t per = 0;
  std::span<double> probes;
  std::span<moments> measured;
  std::span<double> densities;
  std::span<estimate_outcome> estimates;
  std::span<double> thresholds;
  std::span<std::size_t> kept;
  std::span<compress_report> reports;
  std::span<std::size_t> targets;
  std::span<select::selection_result> picked;
  std::span<key_bin> bins;
  std::span<std::size_t> band_starts;

  select::candidate_scratch candidates() const { return {thresholds, targets, kept, picked, bins, band_starts}; }
  const moments& all_of(std::size_t s) const { return measured[s * (1 + per)]; }
  std::span<const moments> probes_of(std::size_t s) const { return measured.subspan(s * (1 + per) + 1, per); }
};

/// One segment with at most MaxProbes probes (tensor_state::probe_count clamps to it).
template <std::size_t MaxProbes>
class single_scratch {
 public:
  scratch view(std::size_t per) {
    return {per,
            std::span<double>(probes_.data(), per),
            std::span<moments>(measured_.data(), 1 + per),
            std::span<double>(&density_, 1),
            std::span<estimate_outcome>(&estimate_, 1),
            std::span<double>(&threshold_, 1),
            std::span<std::size_t>(&kept_, 1),
            std::span<compress_report>(&report_, 1),
            std::span<std::size_t>(&target_, 1),
            std::span<select::selection_result>(&picked_, 1),
            std::span<key_bin>(&bin_, 1),
            std::span<std::size_t>(band_starts_)};
  }

 private:
  std::array<double, MaxProbes> probes_{};
  std::array<moments, 1 + MaxProbes> measured_{};
  double density_ = 0;
  estimate_outcome estimate_;
  double threshold_ = 0;
  std::size_t kept_ = 0;
  compress_report report_;
  std::size_t target_ = 0;
  select::selection_result picked_;
  key_bin bin_;
  std::array<std::size_t, select::bands_per_segment> band_starts_{};
};

/// Any number of segments; grows only when the layout or the probe count does.
class growing_scratch {
 public:
  scratch view(std::size_t segments, std::size_t per) {
    probes_.resize(segments * per);
    measured_.resize(segments * (1 + per));
    densities_.resize(segments);
    estimates_.resize(segments);
    thresholds_.resize(segments);
    kept_.resize(segments);
    reports_.resize(segments);
    targets_.resize(segments);
    picked_.resize(segments);
    bins_.resize(segments);
    band_starts_.resize(segments * select::bands_per_segment);
    return {per,      probes_,  measured_, densities_, estimates_, thresholds_, kept_,
            reports_, targets_, picked_,   bins_,      band_starts_};
  }
  const std::vector<double>& densities() const { return densities_; }
  const std::vector<compress_report>& reports() const { return reports_; }
  std::size_t bytes() const {
    return probes_.capacity() * sizeof(double) + measured_.capacity() * sizeof(moments) +
           densities_.capacity() * sizeof(double) + estimates_.capacity() * sizeof(estimate_outcome) +
           thresholds_.capacity() * sizeof(double) + kept_.capacity() * sizeof(std::size_t) +
           reports_.capacity() * sizeof(compress_report) + targets_.capacity() * sizeof(std::size_t) +
           picked_.capacity() * sizeof(select::selection_result) + bins_.capacity() * sizeof(key_bin) +
           band_starts_.capacity() * sizeof(std::size_t);
  }

 private:
  std::vector<double> probes_;
  std::vector<moments> measured_;
  std::vector<double> densities_;
  std::vector<estimate_outcome> estimates_;
  std::vector<double> thresholds_;
  std::vector<std::size_t> kept_;
  std::vector<compress_report> reports_;
  std::vector<std::size_t> targets_;
  std::vector<select::selection_result> picked_;
  std::vector<key_bin> bins_;
  std::vector<std::size_t> band_starts_;
};

}  // namespace sidco::pipeline
