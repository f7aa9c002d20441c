// Owner policies of the reduce-scatter exchange (comm/owner.hpp) that run a method of the
// registry: here, not in comm/, so that the exchanges' transports do not depend on the
// method registry. <sidco/sidco.hpp> includes it.
#pragma once

#include "sidco/backend/cpu.hpp"
#include "sidco/comm/owner.hpp"
#include "sidco/methods.hpp"

namespace sidco::comm {

/// A registry method (methods.hpp) as an owner policy, on the CPU backend (its SIMD passes
/// cost a few ns per reduced value where the serial backend's cost 20), named as the
/// registry names it.
template <class Method>
struct owner_method : owner_compressor<methods::compressor_of<Method, backend::cpu>> {
  using owner_compressor<methods::compressor_of<Method, backend::cpu>>::owner_compressor;
  static constexpr const char* name = Method::about.name.data();
};

/// The default owner: SIDCo-E's threshold on the reduced sums, trimmed to exactly the
/// owner's share (sidco-e-exact): the global selection holds what the ranks' own
/// compressors aimed at, on average, whatever the reduced values' distribution.
struct owner_sidco_e : owner_method<methods::sidco_e_exact> {
  using owner_method::owner_method;
};

}  // namespace sidco::comm
