// What a sparse all-reduce did, shared by the MPI (host) and NCCL (device) versions.
#pragma once

#include <cstddef>

namespace sidco::comm {

enum class reduction { sum, average };

/// Which way the data went: gathered sparse entries, or a dense all-reduce because the
/// gathered entries would have been larger than the dense vector (delta P >~ 1).
enum class path { sparse, dense };

struct allreduce_report {
  path taken = path::sparse;
  std::size_t gathered = 0;  // entries from all ranks together
  std::size_t bytes = 0;     // bytes each rank received (sparse) or reduced (dense)
  int ranks = 0;
};

}  // namespace sidco::comm
