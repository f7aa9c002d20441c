// Which rank owns each index in the reduce-scatter exchange: a hash of the index, the same on
// every rank and every step. Contiguous regions put a hot range (an embedding's rows for this
// batch, a language model's output rows) on one or two owners, whose fixed-capacity blocks
// then overflow while the others' go unused; hashed single indices spread any range, any
// stride (a hot column of a row-major matrix) and any pattern that moves from step to step
// over every owner, so that each block holds about k/P entries wherever the large values
// fall. Nothing to balance, nothing to checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sidco::comm {

/// The owner of index among ranks: SplitMix64's finalizer (Steele, Lea, Flood 2014: every
/// input bit reaches every output bit) of the index, its high 32 bits mapped onto [0, ranks)
/// by a multiply (Lemire's range reduction: no division). ranks in [1, 2^32).
constexpr std::size_t owner_of(std::uint64_t index, std::size_t ranks) {
  std::uint64_t z = index + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return std::size_t(((z >> 32) * std::uint64_t(ranks)) >> 32);
}

}  // namespace sidco::comm
