// What a selection step reports back to the compressor.
#pragma once

#include <cstddef>

namespace sidco::select {

struct selection_result {
  std::size_t candidates = 0;  // entries above the estimated threshold (before trimming)
  int rescans = 0;             // extra passes because the threshold kept too few
};

}  // namespace sidco::select
