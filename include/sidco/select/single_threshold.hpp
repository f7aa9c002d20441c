// A backend's layout-wide select_above, called for one threshold over a whole source.
#pragma once

#include <cstddef>
#include <span>

#include "sidco/backend/concept.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::select::detail {

/// Appends every |x| > t of source to out (index order), settling its state as sent where
/// kept when Final, else as unsent. Returns how many it appended.
template <bool Final, backend::backend Backend, class Source, class Out>
std::size_t select_above(Backend& backend, const Source& source, double t, Out& out, std::size_t hint) {
  const segment whole{0, source.size};
  std::size_t kept = 0;
  backend.template select_above<Final>(source, std::span<const segment>(&whole, 1),
                                       std::span<const double>(&t, 1), out, hint,
                                       std::span<std::size_t>(&kept, 1));
  return kept;
}

}  // namespace sidco::select::detail
