// libFuzzer target for the reduce-scatter exchange as its framed transports carry it:
// comm/reduce/frames.hpp's messages, one per block (NCCL, the DDP hook's flat schedule), or
// the two-hop grid's (comm/reduce/hops.hpp: MPI's two hops at exact lengths, the hook's in
// zeroed buffers). 2 to 9 ranks, plain, compact or compact8, owners that run the exact Top-k
// where their share allows it or always fit SIDCo-E, two steps. From the input it
// builds each rank's selection for each step (a count, a seed for its indices, clustered or
// spread, and values; one selection in eight holds a value that is not finite or too small for
// the narrow codes), then damages messages in transit: round 1's on their way to an owner or an
// intermediate (bits flipped, cut short, lengthened), or, flat, an owner's round-2 selection
// (the same bytes to every rank, as an all-gather delivers them). Invariants, else abort:
// - no crash, no read past a message (ASan), nothing thrown by select (a transport would leave
//   the other ranks waiting), nothing from apply but sidco::runtime_error, its message UTF-8
//   text (Python shows any other as an empty one);
// - every rank ends the step alike: every one applies the same selection and update, bit for
//   bit, or every one raises the same message;
// - nothing is lost: each rank gives each index back at most once a step, only indices it
//   selected; a failed step gives back every entry it selected, unchanged; an applied one gives
//   back whole what no owner kept, and of what an owner kept at most what rounding left off;
// - while nothing was damaged, the framed exchange gives the same bits as blocks handed over
//   whole (the frames are lossless), residuals included.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <sidco/comm/reduce/core.hpp>
#include <sidco/comm/reduce/frames.hpp>
#include <sidco/comm/reduce/hops.hpp>
#include <sidco/core/splitmix.hpp>
#include <sidco/owners.hpp>
#include <sidco/sidco.hpp>

#include "fuzz_input.hpp"

namespace {

using Index = std::uint32_t;
using core_type = sidco::comm::reduce_core<float, Index, sidco::comm::owner_sidco_e>;

using fuzz::violated;

std::uint32_t bits_of(float v) { return std::bit_cast<std::uint32_t>(v); }

// One damage in transit: round 1's message from `from` to `to` (flat: to its owner; two hops:
// in phase 1 to an intermediate, in phase 2 from it), or round 2's selection of owner `from`
// (flat only); xor a byte, cut the message at offset, or lengthen it by a byte.
struct damage {
  std::size_t step, round, phase, from, to, offset;
  std::uint8_t kind, mask;
};

// What one rank's step ended with.
struct outcome {
  std::string error;  // empty: applied
  std::vector<Index> global;
  std::vector<std::uint32_t> updates;  // bits
  sidco::comm::staged_residual<float, Index> given;
  bool operator==(const outcome& o) const {
    return error == o.error && global == o.global && updates == o.updates && given.indices == o.given.indices &&
           std::ranges::equal(given.values, o.given.values, {}, bits_of, bits_of);
  }
};

void check_conserved(const sidco::sparse_vector<float>& selected, const outcome& out, sidco::comm::entry_coding coding) {
  std::map<Index, float> given;
  for (std::size_t j = 0; j < out.given.size(); ++j)
    if (!given.emplace(out.given.indices[j], out.given.values[j]).second) violated("an index was given back twice");
  for (std::size_t j = 0; j < selected.size(); ++j) {
    const Index i = selected.indices()[j];
    const float v = selected.values()[j];
    const auto back = given.find(i);
    const bool kept = out.error.empty() && std::binary_search(out.global.begin(), out.global.end(), i);
    if (back == given.end()) {
      if (!kept) violated("an entry no owner kept was not given back");
      continue;
    }
    const float b = back->second;
    given.erase(back);
    if (bits_of(b) == bits_of(v)) continue;  // whole
    if (!kept) violated("an entry no owner kept (or of a failed step) came back changed");
    if (coding == sidco::comm::entry_coding::plain) violated("a kept plain entry came back changed");
    if (!(std::fabs(b) < std::fabs(v))) violated("a kept entry's rounding remainder is not below its value");
  }
  if (!given.empty()) violated("an index this rank did not select was given back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sidco;
  fuzz::input_reader in{data, size};
  const std::size_t ranks = 2 + in.take(1) % 8;
  const std::uint64_t shape = in.take(1);
  const std::uint64_t schedule = shape % 3;  // flat messages; two hops, exact lengths or zero-padded
  // Owners that fit SIDCo-E to every share, or default ones (at these rank counts mostly the
  // exact Top-k itself: an owner's share is over direct_share of what it receives).
  comm::owner_sidco_e owner;
  if (shape / 3 % 2) owner.direct_share = 2.0;
  const bool two_hop = schedule != 0, exact_lengths = schedule == 1;
  const std::size_t dense = 1 + in.take(2) % (1 << 13);
  const double delta = 0.001 + double(in.take(1) % 200) / 1000;  // 0.001 .. 0.2
  const auto coding = comm::entry_coding(in.take(1) % 3);      // plain, compact or compact8
  const auto op = in.take(1) % 2 ? comm::reduction::sum : comm::reduction::average;
  const std::uint64_t spread = 1 + in.take(2) % 2000;  // gaps below spread: 1 clusters, 2000 spreads
  constexpr std::size_t steps = 2;
  const comm::exchange_options options{1.25, op, 7, true, coding};
  std::vector<core_type> framed, whole;  // each rank's core: through messages, and blocks handed over
  const std::vector<segment> layout{{0, dense}};
  for (std::size_t r = 0; r < ranks; ++r) {
    framed.emplace_back(layout, delta, ranks, r, options, owner);
    whole.emplace_back(layout, delta, ranks, r, options, owner);
  }
  const comm::wire_format& format = framed[0].plan().format;
  const std::size_t bytes = format.bytes();
  const std::size_t most = std::min<std::size_t>(dense, 2 * framed[0].plan().target + 8);

  // Each step's selections: a count, then ascending indices and values drawn from a seed
  // (short inputs, so that most of the bytes describe damage), one value now and then special.
  std::vector<std::vector<sparse_vector<float>>> selected(steps);
  for (std::size_t s = 0; s < steps; ++s)
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t count = std::size_t(in.take(2)) % (most + 1);
      splitmix64 next{in.take(2) * splitmix_gamma + r};  // the gaps and values
      const std::uint64_t special = in.take(1);
      sparse_vector<float> sel(dense);
      std::uint64_t index = next() % spread;
      while (index < dense && sel.size() < count) {
        float value = float(std::int16_t(next())) / 64 + float(r + 1) * 0.25f;
        if (special % 8 == 7 && sel.size() == special / 8 % count) {  // one selection in eight
          const float kinds[] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                                 1e-30f /* below the narrow codes' ranges */, -0.0f, 3e38f};
          value = kinds[special / 8 % 5];
        }
        sel.push_back(Index(index), value);
        index += 1 + next() % spread;
      }
      selected[s].push_back(std::move(sel));
    }
  std::vector<damage> damages;
  while (in.more(6)) {  // step, round, phase and kind; sender; receiver; offset; the bits flipped
    const std::uint64_t what = in.take(1);
    const std::size_t from = std::size_t(in.take(1)) % ranks, to = std::size_t(in.take(1)) % ranks;
    damages.push_back({what % steps, (what / 2) % 2, (what / 4) % 2, from, to, std::size_t(in.take(2)),
                       std::uint8_t((what / 8) % 3), std::uint8_t(in.take(1) | 1)});
  }
  // Damages message (round, phase, from, to) of step s as listed; whether any changed it.
  const auto damaged = [&](std::size_t s, std::size_t round, std::size_t phase, std::size_t from, std::size_t to,
                           std::vector<std::byte>& message) {
    const std::vector<std::byte> before = message;
    for (const damage& d : damages) {
      if (d.step != s || d.round != round || d.phase != phase || d.from != from || (round == 0 && d.to != to) ||
          message.empty())
        continue;
      const std::size_t at = d.offset % message.size();
      if (d.kind == 0) message[at] ^= std::byte(d.mask);
      if (d.kind == 1) message.resize(at);
      if (d.kind == 2) message.push_back(std::byte(d.mask));
    }
    return message != before;
  };
  // One round through the two-hop grid: frames[r] are rank r's frames (one per rank, or one
  // for all); returns, for each rank, every rank's frame for it. Each message passes through
  // hurt(phase, from, to, bytes) on its way, then is received as the transport receives it:
  // at most the length the router expects, and where lengths are not exact, at the front of
  // a zeroed buffer of that length.
  std::vector<comm::two_hop_router> routers;
  for (std::size_t r = 0; r < ranks; ++r) routers.emplace_back(ranks, r, comm::max_frame_bytes(format), exact_lengths);
  std::vector<std::vector<std::byte>> failure_scratch(ranks);
  std::vector<std::vector<std::vector<std::byte>>> inbox1(ranks), inbox2(ranks);  // alive until the next round
  const auto route = [&](const std::vector<std::vector<std::span<const std::byte>>>& frames, bool personal,
                         std::uint64_t digest, bool check_digests, comm::frame_kind kind, const comm::wire_fields& fields,
                         const auto& hurt) {
    std::vector<std::vector<comm::two_hop_router::outgoing>> out(ranks);
    const auto deliver = [&](std::size_t phase, auto&& receives, std::vector<std::vector<std::vector<std::byte>>>& inbox) {
      std::vector<std::vector<std::span<const std::byte>>> views(ranks);
      for (std::size_t to = 0; to < ranks; ++to) {
        inbox[to].clear();
        for (const auto& [peer, longest] : receives(routers[to])) {
          std::vector<std::byte> message;
          for (const auto& m : out[peer])
            if (m.peer == to) message.assign(m.bytes.begin(), m.bytes.end());
          hurt(phase, peer, to, message);
          if (message.size() > longest) message.resize(longest);
          if (!exact_lengths) message.resize(longest, std::byte{0});
          inbox[to].push_back(std::move(message));
        }
        views[to].assign(inbox[to].begin(), inbox[to].end());
      }
      return views;
    };
    for (std::size_t r = 0; r < ranks; ++r) out[r] = routers[r].first(frames[r], personal, digest, check_digests);
    const auto first = deliver(0, [](const comm::two_hop_router& router) { return router.first_receives(); }, inbox1);
    for (std::size_t r = 0; r < ranks; ++r)
      out[r] = routers[r].second(first[r], format, kind,
                                 comm::message_failure<float, Index>(r, dense, fields, format, failure_scratch[r]));
    const auto second = deliver(1, [](const comm::two_hop_router& router) { return router.second_receives(); }, inbox2);
    std::vector<std::vector<std::span<const std::byte>>> arrived(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      arrived[r] = routers[r].finish(second[r], format, kind,
                                     comm::message_failure<float, Index>(r, dense, fields, format, failure_scratch[r]));
    return arrived;
  };

  bool clean = true;  // nothing damaged so far: framed and whole must agree
  const auto kind_of = [&](bool selections) { return comm::frame_kind_for(selections, coding); };
  for (std::size_t s = 0; s < steps; ++s) {
    const comm::wire_fields fields{7, s, delta, op};
    const std::uint64_t digest = comm::fields_digest<float, Index>(fields, dense, format);
    const comm::wire_header header = comm::detail::header_for<float, Index>(fields, dense, format);
    std::vector<outcome> framed_out(ranks), whole_out(ranks);
    // Round 1: pack; every block to its owner, as its own message or through the two-hop grid.
    std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(ranks * bytes)), whole_blocks = blocks;
    for (std::size_t r = 0; r < ranks; ++r) {
      sparse_vector<float> sent = selected[s][r], sent_whole = selected[s][r];
      framed[r].pack(sent, framed_out[r].given, fields, blocks[r]);
      whole[r].pack(sent_whole, whole_out[r].given, fields, whole_blocks[r]);
    }
    std::vector<std::vector<std::byte>> received(ranks, std::vector<std::byte>(ranks * bytes));
    const auto slot_in = [&](std::vector<std::byte>& all) {
      return [&all, bytes](std::size_t r) { return std::span<std::byte>(all).subspan(r * bytes, bytes); };
    };
    if (two_hop) {
      std::vector<std::vector<std::byte>> frame_bytes(ranks);
      std::vector<std::vector<std::span<const std::byte>>> frames(ranks);
      for (std::size_t r = 0; r < ranks; ++r)
        comm::append_frames<float, Index>(blocks[r], ranks, format, kind_of(false), frame_bytes[r], frames[r]);
      const auto arrived = route(frames, true, digest, true, kind_of(false), fields, [&](std::size_t phase, std::size_t from,
                                                                                        std::size_t to, auto& message) {
        if (damaged(s, 0, phase, from, to, message)) clean = false;
      });
      for (std::size_t o = 0; o < ranks; ++o)
        comm::read_frames<float, Index>(arrived[o], header, format, kind_of(false), slot_in(received[o]));
    } else {
      for (std::size_t to = 0; to < ranks; ++to) {
        std::vector<std::vector<std::byte>> messages(ranks);
        for (std::size_t from = 0; from < ranks; ++from) {
          comm::append_message<float, Index>(std::span<const std::byte>(blocks[from]).subspan(to * bytes, bytes), format,
                                             kind_of(false), &digest, messages[from]);
          if (damaged(s, 0, 0, from, to, messages[from])) clean = false;
        }
        const std::vector<std::span<const std::byte>> views(messages.begin(), messages.end());
        comm::read_messages<float, Index>(views, header, format, kind_of(false), &digest, slot_in(received[to]));
      }
    }
    // Round 2: every owner selects; its selection to every rank, as one message (the same bytes
    // to every rank) or through the grid (undamaged: a forward damaged on its way to some ranks
    // only would leave the ranks disagreeing, which no later round could mend).
    std::vector<std::vector<std::byte>> selections(ranks, std::vector<std::byte>(bytes)), whole_selections = selections;
    for (std::size_t o = 0; o < ranks; ++o) {
      std::vector<std::span<const std::byte>> mine, whole_mine;
      for (std::size_t r = 0; r < ranks; ++r) {
        mine.push_back(std::span<const std::byte>(received[o]).subspan(r * bytes, bytes));
        whole_mine.push_back(std::span<const std::byte>(whole_blocks[r]).subspan(o * bytes, bytes));
      }
      try {
        framed[o].select(mine, selections[o]);
        whole[o].select(whole_mine, whole_selections[o]);
      } catch (...) {
        violated("select threw (its transport would leave the other ranks waiting)");
      }
    }
    std::vector<std::vector<std::byte>> read_back(ranks, std::vector<std::byte>(ranks * bytes));  // each rank's
    if (two_hop) {
      std::vector<std::vector<std::byte>> frame_bytes(ranks);
      std::vector<std::vector<std::span<const std::byte>>> frames(ranks);
      for (std::size_t o = 0; o < ranks; ++o)
        comm::append_frames<float, Index>(selections[o], 1, format, kind_of(true), frame_bytes[o], frames[o]);
      const auto arrived = route(frames, false, digest, false, kind_of(true), fields, [](auto...) {});
      for (std::size_t r = 0; r < ranks; ++r)
        comm::read_frames<float, Index>(arrived[r], header, format, kind_of(true), slot_in(read_back[r]));
    } else {
      std::vector<std::vector<std::byte>> messages(ranks);
      for (std::size_t o = 0; o < ranks; ++o) {
        comm::append_message<float, Index>(selections[o], format, kind_of(true), nullptr, messages[o]);
        if (damaged(s, 1, 0, o, 0, messages[o])) clean = false;
      }
      const std::vector<std::span<const std::byte>> views(messages.begin(), messages.end());
      for (std::size_t r = 0; r < ranks; ++r)
        comm::read_messages<float, Index>(views, header, format, kind_of(true), nullptr, slot_in(read_back[r]));
    }
    std::vector<std::span<const std::byte>> whole_gathered(whole_selections.begin(), whole_selections.end());
    // Round 3: apply on every rank, from what reached it.
    const auto apply = [](core_type& core, const std::vector<std::span<const std::byte>>& all, outcome& out) {
      try {
        core.apply(all, out.given);
        out.global.assign(core.global_selection().begin(), core.global_selection().end());
        for (const float u : core.updates()) out.updates.push_back(bits_of(u));
      } catch (const sidco::runtime_error& e) {
        out.error = e.what();
        if (out.error.empty() || sidco::detail::valid_utf8(out.error) != out.error)
          violated("apply raised a message that is empty or not UTF-8 text (Python would show it empty)");
      } catch (...) {
        violated("apply threw something other than sidco::runtime_error");
      }
    };
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<std::span<const std::byte>> own;
      for (std::size_t o = 0; o < ranks; ++o) own.push_back(std::span<const std::byte>(read_back[r]).subspan(o * bytes, bytes));
      apply(framed[r], own, framed_out[r]);
      apply(whole[r], whole_gathered, whole_out[r]);
      if (framed[r].in_step() || whole[r].in_step()) violated("a core is still in its step after apply");
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      const outcome& first = framed_out[0];
      if (framed_out[r].error != first.error) violated("the ranks ended a step differently (errors)");
      if (framed_out[r].global != first.global || framed_out[r].updates != first.updates)
        violated("the ranks applied different selections or updates");
      check_conserved(selected[s][r], framed_out[r], coding);
      check_conserved(selected[s][r], whole_out[r], coding);
      if (clean && !(framed_out[r] == whole_out[r]))
        violated("an undamaged framed exchange ended otherwise than blocks handed over whole");
    }
  }
  return 0;
}
