// One round of the two-hop schedule (comm/reduce/grid.hpp) as messages, whatever moves them
// (MPI point-to-point in comm/mpi_two_hop.hpp, gloo's send/recv in the PyTorch hook): each
// rank hands over a frame (comm/reduce/frames.hpp) for every rank, or one frame for all of
// them, and gets every rank's frame for it, in O(sqrt P) messages each way instead of P - 1.
// Phase 1 sends each intermediate the frames that go through it; phase 2 forwards what came
// through to where it goes. Each message starts with its sender's digest of the step's
// fields: a message whose digest is not this rank's, or that is cut short, arrives as failure
// frames naming its sender. The transport posts the messages first() and second() return and
// receives, from each peer *_receives() names, at most that many bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "sidco/comm/agree.hpp"
#include "sidco/comm/reduce/frames.hpp"
#include "sidco/comm/reduce/grid.hpp"

namespace sidco::comm {

class two_hop_router {
 public:
  /// Appends to out a frame saying that rank `sender`'s message could not be read (why).
  using failure_writer = std::function<void(std::size_t sender, const char* why, std::vector<std::byte>& out)>;
  struct outgoing {
    std::size_t peer;
    std::span<const std::byte> bytes;
  };
  struct incoming {
    std::size_t peer;
    std::size_t most;  // the longest the message can be
  };

  two_hop_router() = default;
  /// max_frame: the most bytes one frame takes. exact_lengths: the transport says how long
  /// each received message is (MPI); otherwise (gloo) a message lies at the front of its
  /// receive buffer, zeroed before, and bytes past its frames must be zero (a message cut
  /// short may then read as whole, zeros read as codes: such a transport must deliver whole
  /// messages, as gloo's does).
  two_hop_router(std::size_t ranks, std::size_t me, std::size_t max_frame, bool exact_lengths)
      : routes_(ranks), me_(me), max_frame_(max_frame), exact_lengths_(exact_lengths) {
    if (me >= ranks) sidco::detail::fail("two_hop_router: rank ", me, " of ", ranks, " ranks");
    in1_index_.assign(ranks, none);
    in2_index_.assign(ranks, none);
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
  std::size_t rank() const { return me_; }
  /// Bytes this rank put in messages in the last round (both phases), and read from them.
  std::size_t bytes_sent() const { return bytes_sent_; }
  std::size_t bytes_received() const { return bytes_received_; }

  /// Phase 1's messages. personal: frames[d] is this rank's frame for rank d (P of them);
  /// otherwise frames[0] is one frame for every rank. The frames must stay alive until
  /// finish() returns. check_digests: a message at another digest becomes failure frames. A
  /// round whose verdict every rank must reach alike from the same frames (the reduce
  /// exchange's selections, after round 1 compared every rank's digest) does not check: a
  /// rank out of step would otherwise find every other rank's messages wrong, and the others
  /// only its.
  const std::vector<outgoing>& first(std::span<const std::span<const std::byte>> frames, bool personal,
                                     std::uint64_t digest, bool check_digests = true) {
    personal_ = personal;
    check_digests_ = check_digests;
    digest_ = digest;
    mine_.assign(frames.begin(), frames.end());
    bytes_sent_ = bytes_received_ = 0;
    send1_.resize(out1_.size());
    for (std::size_t m = 0; m < out1_.size(); ++m) {
      std::vector<std::byte>& message = send1_[m];
      begin_message(message);
      if (personal_)
        for (const std::size_t d : out1_[m].ranks) append(message, mine_[d]);
      else
        append(message, mine_[0]);
    }
    return outgoing_of(out1_, send1_, sent1_);
  }

  /// What phase 1 receives: a message from each of these peers.
  std::vector<incoming> first_receives() const {
    std::vector<incoming> out;
    for (const link& l : in1_) out.push_back({l.peer, most(personal_ ? l.ranks.size() : 1)});
    return out;
  }

  /// Phase 2's messages, from phase 1's (received[m] from first_receives()[m].peer).
  const std::vector<outgoing>& second(std::span<const std::span<const std::byte>> received, const wire_format& format,
                                      frame_kind kind, const failure_writer& failure) {
    frames1_.assign(in1_.size(), {});
    repair1_.assign(in1_.size(), {});
    for (std::size_t m = 0; m < in1_.size(); ++m)
      read_message(received[m], personal_ ? in1_[m].ranks.size() : 1, in1_[m].peer, format, kind, failure,
                   frames1_[m], repair1_[m]);
    send2_.resize(out2_.size());
    for (std::size_t m = 0; m < out2_.size(); ++m) {
      std::vector<std::byte>& message = send2_[m];
      begin_message(message);
      for (const std::size_t s : out2_[m].ranks) append(message, first_hop_frame(s, out2_[m].peer));
    }
    return outgoing_of(out2_, send2_, sent2_);
  }

  /// What phase 2 receives: a message from each of these peers.
  std::vector<incoming> second_receives() const {
    std::vector<incoming> out;
    for (const link& l : in2_) out.push_back({l.peer, most(l.ranks.size())});
    return out;
  }

  /// For each rank s, the frame s had for this rank (a failure frame where its message could
  /// not be read), from phase 2's messages (received[m] from second_receives()[m].peer).
  std::vector<std::span<const std::byte>> finish(std::span<const std::span<const std::byte>> received,
                                                 const wire_format& format, frame_kind kind,
                                                 const failure_writer& failure) {
    frames2_.assign(in2_.size(), {});
    repair2_.assign(in2_.size(), {});
    for (std::size_t m = 0; m < in2_.size(); ++m)
      read_message(received[m], in2_[m].ranks.size(), in2_[m].peer, format, kind, failure, frames2_[m], repair2_[m]);
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

 private:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  struct link {
    std::size_t peer;
    std::vector<std::size_t> ranks;  // destinations (phase 1) or senders (phase 2), ascending
  };

  std::size_t most(std::size_t frames) const { return sizeof(std::uint64_t) + frames * max_frame_; }

  void begin_message(std::vector<std::byte>& message) const {
    message.clear();
    comm::detail::append_bytes(message, &digest_, sizeof digest_);
  }
  static void append(std::vector<std::byte>& message, std::span<const std::byte> frame) {
    message.insert(message.end(), frame.begin(), frame.end());
  }

  const std::vector<outgoing>& outgoing_of(const std::vector<link>& links, const std::vector<std::vector<std::byte>>& messages,
                                           std::vector<outgoing>& out) {
    out.clear();
    for (std::size_t m = 0; m < links.size(); ++m) {
      out.push_back({links[m].peer, std::span<const std::byte>(messages[m])});
      bytes_sent_ += messages[m].size();
    }
    return out;
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
  void read_message(std::span<const std::byte> rest, std::size_t count, std::size_t peer, const wire_format& format,
                    frame_kind kind, const failure_writer& failure, std::vector<std::span<const std::byte>>& frames,
                    std::vector<std::byte>& repair) {
    const std::size_t size = rest.size();
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
    if (problem == nullptr && !rest.empty() &&
        (exact_lengths_ || !detail::all_zero(rest.data(), rest.data() + rest.size())))
      problem = "a message longer than its frames (damaged in transit?)";
    bytes_received_ += problem == nullptr ? size - rest.size() : size;
    if (problem == nullptr) return;
    repair.clear();
    failure(peer, problem, repair);
    frames.assign(count, std::span<const std::byte>(repair));
  }

  grid_routes routes_;
  std::size_t me_ = 0, max_frame_ = 0;
  bool exact_lengths_ = true;
  std::vector<link> out1_, in1_, out2_, in2_;
  std::vector<std::size_t> in1_index_, in2_index_;  // a peer's link, by rank
  bool personal_ = true, check_digests_ = true;
  std::uint64_t digest_ = 0;
  std::vector<std::span<const std::byte>> mine_;
  std::vector<std::vector<std::byte>> send1_, send2_, repair1_, repair2_;
  std::vector<outgoing> sent1_, sent2_;
  std::vector<std::vector<std::span<const std::byte>>> frames1_, frames2_;
  std::size_t bytes_sent_ = 0, bytes_received_ = 0;
};

/// The router's failure_writer on rank `me`: a failure frame "the message from rank s to
/// rank me held why" under this step's fields (scratch: a payload's room, reused).
template <class T, class Index>
two_hop_router::failure_writer message_failure(std::size_t me, std::size_t dense_size, const wire_fields& fields,
                                               const wire_format& format, std::vector<std::byte>& scratch) {
  return [=, &scratch](std::size_t sender, const char* why, std::vector<std::byte>& out) {
    const sidco::runtime_error reason(
        sidco::detail::message("the message from rank ", sender, " to rank ", me, " held ", why));
    append_failure_frame<T, Index>(reason, dense_size, fields, format, scratch, out);
  };
}

}  // namespace sidco::comm
