// Two-hop routes among P ranks: the ranks in rows of w = ceil(sqrt(P)) (the last row may be
// shorter), and what rank s has for rank d travels through one intermediate, so that each
// rank sends and receives O(sqrt P) messages a round instead of P - 1. Normally the
// intermediate is s's row-mate in d's column: (row(s), col(d)). Where the last row is short
// and lacks that column, it is d's row-mate in s's column, (row(d), col(s)). Every rank
// computes the same routes from P alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "sidco/core/error.hpp"

namespace sidco::comm {

class grid_routes {
 public:
  grid_routes() = default;
  explicit grid_routes(std::size_t ranks) : ranks_(ranks) {
    if (ranks == 0) sidco::detail::fail("grid_routes: ranks = 0");
    width_ = std::size_t(std::ceil(std::sqrt(double(ranks))));
    while (width_ * width_ < ranks) ++width_;
    while (width_ > 1 && (width_ - 1) * (width_ - 1) >= ranks) --width_;
    rows_ = (ranks + width_ - 1) / width_;
    last_row_ = ranks - (rows_ - 1) * width_;
  }

  std::size_t ranks() const { return ranks_; }
  std::size_t width() const { return width_; }
  std::size_t rows() const { return rows_; }

  /// The rank what s has for d travels through (s itself, or d itself, when one hop does).
  std::size_t via(std::size_t s, std::size_t d) const {
    const std::size_t normal = row(s) * width_ + col(d);
    return normal < ranks_ ? normal : row(d) * width_ + col(s);
  }

  /// The destinations d, ascending, whose traffic from s goes through i (via(s, d) == i).
  std::vector<std::size_t> destinations(std::size_t s, std::size_t i) const {
    std::vector<std::size_t> out;
    if (row(s) == row(i)) {
      for (std::size_t d = col(i); d < ranks_; d += width_) out.push_back(d);
    } else if (row(s) == rows_ - 1 && col(s) == col(i) && last_row_ < width_) {
      for (std::size_t c = last_row_; c < width_; ++c) out.push_back(row(i) * width_ + c);
    }
    return out;
  }

  /// The senders s, ascending, whose traffic to d goes through i (via(s, d) == i).
  std::vector<std::size_t> senders(std::size_t i, std::size_t d) const {
    std::vector<std::size_t> out;
    if (col(d) == col(i)) {
      for (std::size_t s = row(i) * width_; s < std::min(ranks_, (row(i) + 1) * width_); ++s) out.push_back(s);
    } else if (row(d) == row(i) && row(i) < rows_ - 1 && col(d) >= last_row_ && col(i) < last_row_) {
      out.push_back((rows_ - 1) * width_ + col(i));
    }
    return out;
  }

  /// The ranks other than me that any route joins to me in one hop: my row and my column
  /// (every intermediate shares a row or a column with both ends).
  std::vector<std::size_t> neighbours(std::size_t me) const {
    std::vector<std::size_t> out;
    for (std::size_t q = row(me) * width_; q < std::min(ranks_, (row(me) + 1) * width_); ++q)
      if (q != me) out.push_back(q);
    for (std::size_t q = col(me); q < ranks_; q += width_)
      if (q != me && row(q) != row(me)) out.push_back(q);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::size_t row(std::size_t q) const { return q / width_; }
  std::size_t col(std::size_t q) const { return q % width_; }

  std::size_t ranks_ = 1, width_ = 1, rows_ = 1, last_row_ = 1;
};

}  // namespace sidco::comm
