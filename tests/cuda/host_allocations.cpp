// Counts the host's heap allocations for the CUDA backend test (compiled by the host
// compiler: nvcc would take a replaced operator new for device code too).
#include "../counting_new.hpp"

long host_allocations() { return sidco::test::heap_allocations.load(); }
