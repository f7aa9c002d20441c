// One round of the two-hop schedule over MPI point-to-point messages: the messages of
// comm/reduce/hops.hpp's router, posted with MPI_Isend/MPI_Irecv and completed phase by phase.
// Runs on a communicator of its own (the caller's, duplicated), so that its messages meet no
// one else's. Needs MPI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/mpi_support.hpp"
#include "sidco/comm/reduce/hops.hpp"
#include "sidco/core/error.hpp"

namespace sidco::comm::mpi {

class two_hop {
 public:
  using failure_writer = two_hop_router::failure_writer;

  two_hop() = default;
  /// comm: a communicator of this schedule's own (the caller duplicates it); max_frame: the
  /// most bytes one frame takes.
  two_hop(MPI_Comm comm, std::size_t max_frame) : comm_(comm) {
    int ranks = 1, rank = 0;
    check(MPI_Comm_size(comm_, &ranks), "two_hop", "MPI_Comm_size");
    check(MPI_Comm_rank(comm_, &rank), "two_hop", "MPI_Comm_rank");
    router_ = two_hop_router(std::size_t(ranks), std::size_t(rank), max_frame, true);
  }

  const grid_routes& routes() const { return router_.routes(); }
  /// Bytes this rank put in messages in the last round (both phases).
  std::size_t bytes_sent() const { return router_.bytes_sent(); }
  std::size_t bytes_received() const { return router_.bytes_received(); }

  /// Phase 1 posted (two_hop_router::first); tag: the round's (phase 2 takes tag + 1).
  void start(std::span<const std::span<const std::byte>> frames, bool personal, std::uint64_t digest, int tag,
             bool check_digests = true) {
    tag_ = tag;
    requests_.clear();
    for (const auto& message : router_.first(frames, personal, digest, check_digests))
      post_send(message, tag_);
    post_receives(router_.first_receives(), tag_, receive1_);
  }

  /// Completes phase 1, runs phase 2 and returns, for each rank s, the frame s had for this
  /// rank (a failure frame where its message could not be read).
  std::vector<std::span<const std::byte>> finish(const wire_format& format, frame_kind kind,
                                                 const failure_writer& failure) {
    const auto first = complete_phase("MPI_Waitall (phase 1)", receive1_);
    for (const auto& message : router_.second(first, format, kind, failure)) post_send(message, tag_ + 1);
    post_receives(router_.second_receives(), tag_ + 1, receive2_);
    return router_.finish(complete_phase("MPI_Waitall (phase 2)", receive2_), format, kind, failure);
  }

  /// Completes whatever is in flight (a destructor's path: errors ignored).
  void abandon() noexcept {
    if (!requests_.empty()) complete(requests_.data(), int(requests_.size()));
    requests_.clear();
  }

 private:
  void post_send(const two_hop_router::outgoing& message, int tag) {
    if (message.bytes.size() > std::size_t(std::numeric_limits<int>::max()))
      sidco::detail::fail("two_hop: a message of ", message.bytes.size(), " bytes exceeds MPI's int counts");
    requests_.emplace_back();
    check(MPI_Isend(message.bytes.data(), int(message.bytes.size()), MPI_BYTE, int(message.peer), tag, comm_,
                    &requests_.back()),
          "two_hop", "MPI_Isend");
  }

  // Phase 1's buffers stay alive through phase 2: the router forwards from them.
  void post_receives(const std::vector<two_hop_router::incoming>& from, int tag,
                     std::vector<std::vector<std::byte>>& into) {
    into.resize(from.size());
    for (std::size_t m = 0; m < from.size(); ++m) {
      std::vector<std::byte>& buffer = into[m];
      buffer.resize(from[m].most);
      if (buffer.size() > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("two_hop: a message of up to ", buffer.size(), " bytes exceeds MPI's int counts");
      requests_.emplace_back();
      check(MPI_Irecv(buffer.data(), int(buffer.size()), MPI_BYTE, int(from[m].peer), tag, comm_, &requests_.back()),
            "two_hop", "MPI_Irecv");
    }
  }

  // Waits for the phase's messages; what each receive got, as long as it was.
  std::vector<std::span<const std::byte>> complete_phase(const char* what,
                                                        const std::vector<std::vector<std::byte>>& buffers) {
    statuses_.resize(requests_.size());
    check(MPI_Waitall(int(requests_.size()), requests_.data(), statuses_.data()), "two_hop", what);
    const std::size_t sends = requests_.size() - buffers.size();  // the receives were posted last
    std::vector<std::span<const std::byte>> received(buffers.size());
    for (std::size_t m = 0; m < buffers.size(); ++m) {
      int count = 0;
      check(MPI_Get_count(&statuses_[sends + m], MPI_BYTE, &count), "two_hop", "MPI_Get_count");
      received[m] = std::span<const std::byte>(buffers[m]).first(std::size_t(std::max(count, 0)));
    }
    requests_.clear();
    return received;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  two_hop_router router_;
  int tag_ = 0;
  std::vector<std::vector<std::byte>> receive1_, receive2_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
};

}  // namespace sidco::comm::mpi
