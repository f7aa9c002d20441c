// One round of the two-hop schedule (comm/reduce/grid.hpp) over MPI point-to-point messages:
// each rank hands over a frame (comm/reduce/frames.hpp) for every rank, or one frame for all
// of them, and gets every rank's frame for it, in O(sqrt P) messages each way instead of
// P - 1, at the size the frames use. Phase 1 sends each intermediate the frames that go
// through it; phase 2 forwards what came through to where it goes. Each message starts with
// its sender's digest of the step's fields: a message whose digest is not this rank's, or
// that is cut short, arrives as failure frames naming its sender. Runs on a communicator of
// its own (the caller's, duplicated), so that its messages meet no one else's. Needs MPI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/mpi_support.hpp"
#include "sidco/comm/reduce/frames.hpp"
#include "sidco/comm/reduce/grid.hpp"
#include "sidco/core/error.hpp"

namespace sidco::comm::mpi {

class two_hop {
 public:
  /// Appends to out a frame saying that rank `sender`'s message could not be read (why).
  using failure_writer = std::function<void(std::size_t sender, const char* why, std::vector<std::byte>& out)>;

  two_hop() = default;
  /// comm: a communicator of this schedule's own (the caller duplicates it); max_frame: the
  /// most bytes one frame takes.
  two_hop(MPI_Comm comm, std::size_t max_frame) : comm_(comm), max_frame_(max_frame) {
    int ranks = 1, rank = 0;
    check(MPI_Comm_size(comm_, &ranks), "two_hop", "MPI_Comm_size");
    check(MPI_Comm_rank(comm_, &rank), "two_hop", "MPI_Comm_rank");
    routes_ = grid_routes(std::size_t(ranks));
    me_ = std::size_t(rank);
    const std::size_t p = std::size_t(ranks);
    in1_index_.assign(p, none);
    in2_index_.assign(p, none);
    for (const std::size_t q : routes_.neighbours(me_)) {
      if (auto d = routes_.destinations(me_, q); !d.empty()) out1_.push_back({q, std::move(d)});
      if (auto d = routes_.destinations(q, me_); !d.empty()) {
        in1_index_[q] = in1_.size();
        in1_.push_back({q, std::move(d)});
      }
      if (auto s = routes_.senders(me_, q); !s.empty()) out2_.push_back({q, std::move(s)});
      if (auto s = routes_.senders(q, me_); !s.empty()) {
        in2_index_[q] = in2_.size();
        in2_.push_back({q, std::move(s)});
      }
    }
  }

  const grid_routes& routes() const { return routes_; }
  /// Bytes this rank put in messages in the last round (both phases).
  std::size_t bytes_sent() const { return bytes_sent_; }
  std::size_t bytes_received() const { return bytes_received_; }

  /// Phase 1 posted. personal: frames[d] is this rank's frame for rank d (P of them);
  /// otherwise frames[0] is one frame for every rank. The frames must stay alive until
  /// finish() returns. tag: the round's (phase 2 takes tag + 1). check_digests: a message
  /// at another digest becomes failure frames. A round whose verdict every rank must reach
  /// alike from the same frames (the reduce exchange's selections, after round 1 compared
  /// every rank's digest) does not check: a rank out of step would otherwise find every
  /// other rank's messages wrong, and the others only its.
  void start(std::span<const std::span<const std::byte>> frames, bool personal, std::uint64_t digest, int tag,
             bool check_digests = true) {
    personal_ = personal;
    check_digests_ = check_digests;
    digest_ = digest;
    tag_ = tag;
    mine_.assign(frames.begin(), frames.end());
    bytes_sent_ = bytes_received_ = 0;
    send1_.resize(out1_.size());
    requests_.clear();
    for (std::size_t m = 0; m < out1_.size(); ++m) {
      std::vector<std::byte>& message = send1_[m];
      begin_message(message);
      if (personal_)
        for (const std::size_t d : out1_[m].ranks) append(message, mine_[d]);
      else
        append(message, mine_[0]);
      post_send(message, out1_[m].peer, tag_);
    }
    receive1_.resize(in1_.size());
    for (std::size_t m = 0; m < in1_.size(); ++m)
      post_receive(receive1_[m], (personal_ ? in1_[m].ranks.size() : 1) * max_frame_, in1_[m].peer, tag_);
  }

  /// Completes phase 1, runs phase 2 and returns, for each rank s, the frame s had for this
  /// rank (a failure frame where its message could not be read).
  std::vector<std::span<const std::byte>> finish(const wire_format& format, frame_kind kind,
                                                 const failure_writer& failure) {
    statuses_.resize(requests_.size());
    check(MPI_Waitall(int(requests_.size()), requests_.data(), statuses_.data()), "two_hop", "MPI_Waitall (phase 1)");
    const std::size_t sends = out1_.size();
    frames1_.assign(in1_.size(), {});
    repair1_.assign(in1_.size(), {});
    for (std::size_t m = 0; m < in1_.size(); ++m)
      read_message(receive1_[m], statuses_[sends + m], personal_ ? in1_[m].ranks.size() : 1, in1_[m].peer, format,
                   kind, failure, frames1_[m], repair1_[m]);
    // Phase 2: what came through for each rank, in sender order.
    requests_.clear();
    send2_.resize(out2_.size());
    for (std::size_t m = 0; m < out2_.size(); ++m) {
      std::vector<std::byte>& message = send2_[m];
      begin_message(message);
      for (const std::size_t s : out2_[m].ranks) append(message, first_hop_frame(s, out2_[m].peer));
      post_send(message, out2_[m].peer, tag_ + 1);
    }
    receive2_.resize(in2_.size());
    for (std::size_t m = 0; m < in2_.size(); ++m)
      post_receive(receive2_[m], in2_[m].ranks.size() * max_frame_, in2_[m].peer, tag_ + 1);
    statuses_.resize(requests_.size());
    check(MPI_Waitall(int(requests_.size()), requests_.data(), statuses_.data()), "two_hop", "MPI_Waitall (phase 2)");
    frames2_.assign(in2_.size(), {});
    repair2_.assign(in2_.size(), {});
    for (std::size_t m = 0; m < in2_.size(); ++m)
      read_message(receive2_[m], statuses_[out2_.size() + m], in2_[m].ranks.size(), in2_[m].peer, format,
                   kind, failure, frames2_[m], repair2_[m]);
    std::vector<std::span<const std::byte>> out(routes_.ranks());
    for (std::size_t s = 0; s < out.size(); ++s) {
      const std::size_t i = routes_.via(s, me_);
      if (i == me_) {
        out[s] = first_hop_frame(s, me_);
        continue;
      }
      const std::size_t m = in2_index_[i];
      const auto& senders = in2_[m].ranks;
      out[s] = frames2_[m][std::size_t(std::lower_bound(senders.begin(), senders.end(), s) - senders.begin())];
    }
    return out;
  }

  /// Completes whatever is in flight (a destructor's path: errors ignored).
  void abandon() noexcept {
    if (!requests_.empty()) complete(requests_.data(), int(requests_.size()));
    requests_.clear();
  }

 private:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  struct link {
    std::size_t peer;
    std::vector<std::size_t> ranks;  // destinations (phase 1) or senders (phase 2), ascending
  };

  void begin_message(std::vector<std::byte>& message) const {
    message.clear();
    comm::detail::append_bytes(message, &digest_, sizeof digest_);
  }
  static void append(std::vector<std::byte>& message, std::span<const std::byte> frame) {
    message.insert(message.end(), frame.begin(), frame.end());
  }

  void post_send(const std::vector<std::byte>& message, std::size_t peer, int tag) {
    if (message.size() > std::size_t(std::numeric_limits<int>::max()))
      sidco::detail::fail("two_hop: a message of ", message.size(), " bytes exceeds MPI's int counts");
    requests_.emplace_back();
    check(MPI_Isend(message.data(), int(message.size()), MPI_BYTE, int(peer), tag, comm_, &requests_.back()), "two_hop",
          "MPI_Isend");
    bytes_sent_ += message.size();
  }

  void post_receive(std::vector<std::byte>& buffer, std::size_t most, std::size_t peer, int tag) {
    buffer.resize(sizeof(std::uint64_t) + most);
    if (buffer.size() > std::size_t(std::numeric_limits<int>::max()))
      sidco::detail::fail("two_hop: a message of up to ", buffer.size(), " bytes exceeds MPI's int counts");
    requests_.emplace_back();
    check(MPI_Irecv(buffer.data(), int(buffer.size()), MPI_BYTE, int(peer), tag, comm_, &requests_.back()), "two_hop",
          "MPI_Irecv");
  }

  // The frame rank s had for d, as it reached this rank in phase 1 (s's own, or this rank's).
  std::span<const std::byte> first_hop_frame(std::size_t s, std::size_t d) const {
    if (s == me_) return personal_ ? mine_[d] : mine_[0];
    const std::size_t m = in1_index_[s];
    if (!personal_) return frames1_[m][0];
    const auto& destinations = in1_[m].ranks;
    return frames1_[m][std::size_t(std::lower_bound(destinations.begin(), destinations.end(), d) - destinations.begin())];
  }

  // Splits a received message into count frames; a message from a rank at other fields, or
  // cut short, becomes count failure frames (one, shared) naming that rank.
  void read_message(const std::vector<std::byte>& buffer, MPI_Status& status, std::size_t count, std::size_t peer,
                    const wire_format& format, frame_kind kind, const failure_writer& failure,
                    std::vector<std::span<const std::byte>>& frames, std::vector<std::byte>& repair) {
    int received = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &received), "two_hop", "MPI_Get_count");
    bytes_received_ += std::size_t(received);
    std::span<const std::byte> rest(buffer.data(), std::size_t(std::max(received, 0)));
    const char* problem = take_digest(rest, digest_, check_digests_);
    frames.clear();
    for (std::size_t f = 0; f < count && problem == nullptr; ++f) {
      const std::size_t length = frame_length(rest, format, kind);
      if (length == 0) {
        problem = "a message cut short (damaged in transit?)";
        break;
      }
      frames.push_back(rest.first(length));
      rest = rest.subspan(length);
    }
    if (problem == nullptr && !rest.empty()) problem = "a message longer than its frames (damaged in transit?)";
    if (problem == nullptr) return;
    repair.clear();
    failure(peer, problem, repair);
    frames.assign(count, std::span<const std::byte>(repair));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  grid_routes routes_;
  std::size_t me_ = 0, max_frame_ = 0;
  std::vector<link> out1_, in1_, out2_, in2_;
  std::vector<std::size_t> in1_index_, in2_index_;  // a peer's link, by rank
  bool personal_ = true, check_digests_ = true;
  std::uint64_t digest_ = 0;
  int tag_ = 0;
  std::vector<std::span<const std::byte>> mine_;
  std::vector<std::vector<std::byte>> send1_, send2_, receive1_, receive2_, repair1_, repair2_;
  std::vector<std::vector<std::span<const std::byte>>> frames1_, frames2_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  std::size_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace sidco::comm::mpi
