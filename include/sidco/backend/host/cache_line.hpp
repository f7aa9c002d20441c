// The bytes of a cache line on x86 and most Arm cores, for state that one thread writes while
// others write theirs: two threads' state on one line costs a line transfer per write.
#pragma once

#include <cstddef>

namespace sidco::backend::host {

inline constexpr std::size_t own_cache_line = 64;

}  // namespace sidco::backend::host
