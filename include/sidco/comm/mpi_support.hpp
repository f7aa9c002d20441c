// What the MPI exchanges share: MPI errors as sidco::runtime_error, the collective setup
// agreement of their constructors, and completing a request still in flight when an
// exchange is destroyed. Needs MPI.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"

namespace sidco::comm::mpi {

/// Throws sidco::runtime_error "who: what failed: MPI's text" unless status is MPI_SUCCESS.
inline void check(int status, const char* who, const char* what) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  sidco::detail::fail_at_run_time(who, ": ", what, " failed: ", std::string(text, std::size_t(length)));
}

/// Every rank's setup record, all-gathered; throws on every rank alike what check_setups
/// finds (a rank that could not set up, or whose payloads would differ).
inline void agree_setup(MPI_Comm comm, int ranks, const exchange_setup& mine, const char* who) {
  std::vector<exchange_setup> setups(static_cast<std::size_t>(ranks));
  check(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, setups.data(), int(sizeof mine), MPI_BYTE, comm), who,
        "MPI_Allgather of the setup");
  check_setups(setups);
}

/// Completes count requests still in flight (from a destructor: errors are ignored), unless
/// MPI is finalized already.
inline void complete(MPI_Request* requests, int count) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Waitall(count, requests, MPI_STATUSES_IGNORE);
}

}  // namespace sidco::comm::mpi
