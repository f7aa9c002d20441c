// How backend::cuda splits a layout into the pieces its thread blocks work on: runs of at
// most `tile` values inside one segment, in order. Host code; no CUDA header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sidco/core/segment.hpp"

namespace sidco::backend::cuda_detail {

struct piece {
  std::size_t offset;     // first value, relative to the source
  std::uint32_t size;     // at most the tile
  std::uint32_t segment;  // the layout's segment that holds it
};

/// The pieces of layout, and segment_first[s]: the index of segment s's first piece
/// (segment_first[segments] = the piece count). Rebuilt only when the layout changes.
class piece_plan {
 public:
  /// True when the plan changed (the device copy must be refreshed).
  bool plan(std::span<const segment> layout, std::size_t tile) {
    if (tile == tile_ && std::equal(layout.begin(), layout.end(), layout_.begin(), layout_.end(),
                                    [](const segment& a, const segment& b) { return a.offset == b.offset && a.size == b.size; }))
      return false;
    tile_ = tile;
    layout_.assign(layout.begin(), layout.end());
    pieces_.clear();
    segment_first_.clear();
    for (std::size_t s = 0; s < layout.size(); ++s) {
      segment_first_.push_back(std::uint32_t(pieces_.size()));
      for (std::size_t at = 0; at < layout[s].size; at += tile)
        pieces_.push_back({layout[s].offset + at, std::uint32_t(std::min(tile, layout[s].size - at)), std::uint32_t(s)});
    }
    segment_first_.push_back(std::uint32_t(pieces_.size()));
    return true;
  }

  /// After a failed upload of the tables: the next plan() builds them again and says so,
  /// so that no later call reads a stale or short device table.
  void forget() {
    tile_ = 0;
    layout_.clear();
    pieces_.clear();
    segment_first_.clear();
  }

  const std::vector<piece>& pieces() const { return pieces_; }
  const std::vector<std::uint32_t>& segment_first() const { return segment_first_; }
  std::size_t segments() const { return layout_.size(); }

 private:
  std::size_t tile_ = 0;
  std::vector<segment> layout_;
  std::vector<piece> pieces_;
  std::vector<std::uint32_t> segment_first_;
};

}  // namespace sidco::backend::cuda_detail
