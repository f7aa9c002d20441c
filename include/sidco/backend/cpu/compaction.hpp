// Order-preserving parallel compaction into one output: what the selection pass writes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "sidco/backend/cpu/ranges.hpp"
#include "sidco/backend/cpu/tuning.hpp"

namespace sidco::backend::cpu_detail {

/// Compacts, in range order, what count(lo, hi) counts and write(bounded, r, lo, hi, at,
/// end) writes for range r into slots [0, total) of a buffer that resize(slots) sizes,
/// keeping its contents, and move(to, from, count) moves within. write writes the range's
/// entries at [at, end), advancing at, and returns where in [lo, hi) it stopped: with
/// bounded, before an entry block that might not fit below end; otherwise end is exactly
/// where the range's entries end, and it finishes (returns hi).
///
/// With a hint of the count, one pass: each range writes into its own region, then the
/// regions are closed up (only kept entries move). A range that fills its region stops
/// there; the rest of it is counted and written after (correct, only slower). Without a
/// hint, two passes: count, then write at each range's offset. Either way indices stay in
/// order with O(threads) scratch. What each range kept is remembered to size its region
/// next time: the one piece of state that outlives a call, and it only affects speed.
class compaction {
 public:
  template <class Count, class Write, class Resize, class Move>
  std::size_t run(const thread_ranges& threads, std::size_t n, std::size_t expected, std::size_t room,
                  Count&& count, Write&& write, Resize&& resize, Move&& move) {
    const std::size_t ranges = std::size_t(threads.count(n));
    if (expected == 0) {
      const std::size_t total = threads.count_each(n, count, offsets_);
      resize(total);
      threads.for_each(n, [&](int r, std::size_t lo, std::size_t hi) {
        // A copy: the next range's thread reads offsets_[r + 1] as its end.
        std::size_t at = offsets_[std::size_t(r)];
        write(std::false_type{}, r, lo, hi, at, offsets_[std::size_t(r) + 1]);
      });
      last_.resize(ranges);
      for (std::size_t r = 0; r < ranges; ++r) last_[r] = offsets_[r + 1] - offsets_[r];
      return total;
    }
    plan_regions(ranges, expected, room);
    resize(regions_.back().end);
    threads.for_each(n, [&](int r, std::size_t lo, std::size_t hi) {
      region& g = regions_[std::size_t(r)];
      g.stop = write(std::true_type{}, r, lo, hi, g.at, g.end);
      g.hi = hi;
      g.leftover = g.stop < hi ? count(g.stop, hi) : 0;
    });
    std::size_t total = 0;
    bool overflow = false;  // a range stopped early: its rest is unwritten (and unsettled)
    for (auto& g : regions_) {
      g.place = total;  // range r's kept entries, then its leftovers, in range order
      total += (g.at - g.begin) + g.leftover;
      overflow |= g.stop < g.hi;
    }
    if (total > regions_.back().end) resize(total);
    // Places are ascending and disjoint, as are the regions: moving those that go right from
    // the last, then those that go left from the first, never overwrites unmoved entries.
    for (auto g = regions_.rbegin(); g != regions_.rend(); ++g)
      if (g->place > g->begin && g->at > g->begin) move(g->place, g->begin, g->at - g->begin);
    for (const auto& g : regions_)
      if (g.place < g.begin && g.at > g.begin) move(g.place, g.begin, g.at - g.begin);
    if (overflow) {
      threads.for_each(n, [&](int r, std::size_t, std::size_t hi) {
        const region& g = regions_[std::size_t(r)];
        std::size_t at = g.place + (g.at - g.begin);
        if (g.stop < hi) write(std::false_type{}, r, g.stop, hi, at, at + g.leftover);
      });
    }
    for (std::size_t r = 0; r < ranges; ++r) last_[r] = (regions_[r].at - regions_[r].begin) + regions_[r].leftover;
    return total;
  }

  std::size_t workspace_bytes() const {
    return regions_.capacity() * sizeof(region) + (offsets_.capacity() + last_.capacity()) * sizeof(std::size_t);
  }

 private:
  // One range's share of a one-pass compaction: [begin, end) of the output, at the next free
  // slot, stop where the range's pass stopped, hi where the range ends, leftover kept after
  // stop, place its final offset. Its own cache line: at moves with every entry written.
  struct alignas(tuning::own_line) region {
    std::size_t begin, end, at, stop, hi, leftover, place;
  };

  // Regions: the hint shared out as the ranges shared the last compaction (evenly the first
  // time), with slack, plus room for whole blocks. When the buffer already has room enough,
  // the regions share that room instead of growing it.
  void plan_regions(std::size_t ranges, std::size_t expected, std::size_t room) {
    if (last_.size() != ranges) last_.assign(ranges, 0);
    std::size_t last_total = 0;
    for (std::size_t kept : last_) last_total += kept;
    const double slack = last_total ? tuning::region_slack : tuning::first_region_slack;
    const double blocks = double(ranges * tuning::region_blocks * tuning::select_block);
    const double wanted = slack * double(expected) + blocks;
    const double enough = tuning::region_room_enough * double(expected) + blocks;
    const double scale = double(room) >= enough ? double(room) / wanted : 1.0;
    regions_.resize(ranges);
    std::size_t end = 0;
    for (std::size_t r = 0; r < ranges; ++r) {
      const double share = last_total ? double(last_[r]) / double(last_total) : 1.0 / double(ranges);
      const auto size = std::size_t(
          scale * (slack * share * double(expected) + double(tuning::region_blocks * tuning::select_block)));
      regions_[r] = {end, end + size, end, 0, 0, 0, 0};
      end += size;
    }
  }

  std::vector<region> regions_;
  std::vector<std::size_t> offsets_;
  std::vector<std::size_t> last_;  // per range, what it kept last time
};

}  // namespace sidco::backend::cpu_detail
