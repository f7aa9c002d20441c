// The calling rank and the rank count of a communicator, for the MPI tests.
#pragma once

#include <mpi.h>

inline int rank_in(MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

inline int size_of(MPI_Comm comm = MPI_COMM_WORLD) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  return ranks;
}
