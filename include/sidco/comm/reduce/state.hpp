// What a reduce-scatter exchange checkpoints to resume bit for bit, whatever carries it: its
// owner policy's state and its owner's carry (comm/reduce/carry.hpp; the local compressor
// and residual are the caller's; ownership is a hash, nothing to save). One versioned format
// for every transport; the older ones (versions 2 and 3, and tags "sparse_reduce_exchange"
// of the MPI and NCCL exchanges and "reduce_codec" of the DDP hook) still load, with no
// carry: their region bounds, from when indices were owned by contiguous regions, are read
// and dropped.
//
//   name "reduce_exchange_state", version 4, ranks, dense size, the owner's name, the
//   owner's state (a stateful owner's save_state), the carry (owner_carry::save: a count,
//   a layout, then index and value per nonzero entry, one word each for float)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sidco/comm/owner.hpp"
#include "sidco/comm/reduce/carry.hpp"
#include "sidco/comm/reduce/plan.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/state_io.hpp"

namespace sidco::comm {

inline constexpr std::string_view reduce_state_name = "reduce_exchange_state";
inline constexpr std::uint64_t reduce_state_version = 4;

/// Writes the plan's sizes, the owner policy's state and the carry in the format above.
template <class Policy, class T, class Index>
void save_reduce_state(state_writer& out, const reduce_plan& plan, const Policy& policy,
                       const owner_carry<T, Index>& carry) {
  out.name(reduce_state_name);
  out.word(reduce_state_version);
  out.word(plan.ranks);
  out.word(plan.size);
  out.name(Policy::name);
  if constexpr (stateful<Policy>) policy.save_state(out);
  carry.save(out);
}

/// What a saved exchange state says of itself, read without loading it: the format's
/// version (1: an older tag), the rank count, the dense size and the owner's name ("" where
/// version 1 did not say it).
struct reduce_state_info {
  std::uint64_t version = 0, ranks = 0, size = 0;
  std::string owner;
  std::string tag;  // the format's name
};

namespace detail {

/// Reads the fields before the owner's state (an older version's region bounds read and
/// dropped); in is left at the owner's state.
inline reduce_state_info read_reduce_state_head(state_reader& in) {
  reduce_state_info info;
  const std::string_view tag = in.read_name();
  info.tag = std::string(tag);
  if (tag == reduce_state_name) {
    info.version = in.word("reduce exchange state: version");
    if (info.version < 2 || info.version > reduce_state_version)
      sidco::detail::fail("reduce exchange state: version ", info.version, "; this sidco reads versions 1 to ",
                          reduce_state_version);
    info.ranks = in.word("reduce exchange state: ranks");
    info.size = in.word("reduce exchange state: dense size");
  } else if (tag == "sparse_reduce_exchange" || tag == "reduce_codec") {
    info.version = 1;
    const std::uint64_t count = in.word("reduce exchange state: bounds");
    if (count < 2) sidco::detail::fail("reduce exchange state: ", count, " region bounds");
    info.ranks = count - 1;
  } else {
    sidco::detail::fail("state: holds '", sidco::detail::printable_name(tag),
                        "' where a reduce exchange's state was expected");
  }
  if (info.ranks > (std::uint64_t(1) << 32)) sidco::detail::fail("reduce exchange state: ", info.ranks, " ranks");
  if (info.version < 3) {
    // Versions 1 and 2: ranks + 1 region bounds (version 1 counted them above).
    std::uint64_t bound = 0;
    for (std::uint64_t b = 0; b <= info.ranks; ++b) bound = in.word("reduce exchange state: region bound");
    if (info.version == 1) info.size = bound;
  }
  if (info.version != 1) info.owner = std::string(in.read_name());
  return info;
}

}  // namespace detail

/// Reads what a saved state says of itself (see reduce_state_info); throws sidco::error on
/// bytes that are not such a state.
inline reduce_state_info read_reduce_state_info(std::span<const std::byte> bytes) {
  state_reader in(bytes);
  return detail::read_reduce_state_head(in);
}

/// Loads a saved state into policy and carry (a version without one: no carry), which
/// change only when all of it reads and fits the plan: a state saved for another rank
/// count, dense size or owner is refused with a sidco::error saying so. Reads what
/// save_reduce_state wrote (a hook's version 1 state with an owner state this owner has no
/// use for: to the end).
template <class Policy, class T, class Index>
void load_reduce_state(state_reader& in, const reduce_plan& plan, Policy& policy, owner_carry<T, Index>& carry) {
  const reduce_state_info info = detail::read_reduce_state_head(in);
  if (info.ranks != plan.ranks || info.size != plan.size)
    sidco::detail::fail("reduce exchange state: saved for ", info.ranks, " ranks and ", info.size,
                        " values; this exchange has ", plan.ranks, " ranks and ", plan.size, " values");
  Policy loaded_policy = policy;
  // Version 1 did not name the owner; the hook's ("reduce_codec") always held SIDCo-E's state.
  const bool owner_state_follows = info.version != 1                 ? info.owner == Policy::name
                                   : info.tag == "reduce_codec"       ? std::string_view(Policy::name) == "sidco-e-exact"
                                                                      : true;
  if (info.version != 1 && !owner_state_follows)
    sidco::detail::fail("reduce exchange state: saved by owner '", sidco::detail::printable_name(info.owner),
                        "'; this exchange's owner is '", Policy::name, "'");
  if constexpr (stateful<Policy>) {
    if (owner_state_follows) loaded_policy.load_state(in);
  }
  if (info.version == 1 && !owner_state_follows) in.skip_rest();
  owner_carry<T, Index> loaded_carry;
  if (info.version >= 4) loaded_carry.load(in, plan.size);
  policy = std::move(loaded_policy);
  carry = std::move(loaded_carry);
}

}  // namespace sidco::comm
