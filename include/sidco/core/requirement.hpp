// The condition the policies' diagnose() functions assert: written as
// static_assert(requirement<Policy, Check>::holds, "sentence"), clang and g++ print the
// policy's type in the assertion itself ("requirement<mylab::log_normal, false>"), so the
// first error line says which type is at fault, not only what it lacks.
#pragma once

namespace sidco::detail {

template <class Policy, bool Holds>
struct requirement {
  static constexpr bool holds = Holds;
};

}  // namespace sidco::detail
