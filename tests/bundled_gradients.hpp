// The folder of the real gradients bundled in the source tree (examples/data/gradients), for
// the tests, benchmarks and tools built beside it.
#pragma once

namespace sidco::bundled {

/// The source tree's examples/data/gradients, absolute. It is compiled into one small object
/// (tests/bundled_gradients.cpp) rather than onto every test's command line, where an
/// absolute path made every new clone miss the compiler cache.
const char* gradients_dir();

}  // namespace sidco::bundled
