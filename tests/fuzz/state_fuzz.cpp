// libFuzzer target for checkpoints: what a compressor of any method of sidco::methods::table,
// or a reduce-scatter exchange (SIDCo-E's owner, compact8's carry), loads with load_state.
// A checkpoint is a file a user hands back, so it is hostile input. From the input: the
// target, then either the bytes to load whole, or (offset, xor) changes to a valid state the
// same target saved after three calls (so that most inputs get past the names). Invariants,
// else abort (a hang is libFuzzer's timeout):
// - load_state throws nothing but sidco::error, whose message is UTF-8 text (Python shows
//   any other as an empty one), and a refused state changes nothing (what the target saves
//   after equals what it saved before);
// - a loaded state saves to bytes that load back to the same bytes;
// - a compressor that loaded it compresses the next gradient into a valid selection
//   (ascending indices in range, values those of gradient + residual, sent + new residual =
//   gradient + old residual; exactly k, and the top k, where the method promises that) or
//   refuses with sidco::error; an exchange runs its next step;
// - the PyTorch hook's engines, whole and per layer, take a layer's state exactly when the
//   compressor takes it with no byte left over, and leave every layer as it was otherwise.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <sidco/comm/reduce/core.hpp>
#include <sidco/methods.hpp>
#include <sidco/owners.hpp>
#include <sidco/sidco.hpp>

#include "../../python/sidco_torch/csrc/engine.hpp"
#include "fuzz_input.hpp"
#include "selection_promises.hpp"

namespace {

using fuzz::violated;

// A gradient with the spread of real ones: Laplace values, a few zeros, fixed seed. The
// magnitudes sit on a grid of 2^-12 (sums of a few stay exact), so several equal the k-th
// largest of gradient + residual and Top-k's rule for ties is checked too.
const std::vector<float>& gradient() {
  static const std::vector<float> g = [] {
    std::vector<float> v(4096);
    std::mt19937_64 rng(11);
    std::exponential_distribution<float> magnitude(400.f);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float on_grid = std::round(magnitude(rng) * 4096.f) / 4096.f;
      v[i] = i % 97 == 0 ? 0.f : (rng() & 1 ? 1.f : -1.f) * on_grid;
    }
    return v;
  }();
  return g;
}
constexpr double delta = 0.01;

// The state to load: the input's bytes whole, or the valid state with the input's changes.
std::vector<std::byte> state_to_load(std::vector<std::byte> valid, const std::uint8_t* data, std::size_t size,
                                     bool whole) {
  if (whole) {
    std::vector<std::byte> raw(size);
    if (size > 0) std::memcpy(raw.data(), data, size);
    return raw;
  }
  for (std::size_t at = 0; at + 3 <= size && !valid.empty(); at += 3) {
    const std::size_t offset = (std::size_t(data[at]) | std::size_t(data[at + 1]) << 8) % (valid.size() + 1);
    if (offset == valid.size()) {
      valid.resize(valid.size() - data[at + 2] % std::min<std::size_t>(valid.size(), 16));  // cut short
    } else {
      valid[offset] ^= std::byte(data[at + 2]);
    }
  }
  return valid;
}

// Loads state into target; false (target unchanged) when refused.
template <class Target>
bool load(Target& target, const std::vector<std::byte>& state) {
  const std::vector<std::byte> before = sidco::saved_state(target);
  try {
    sidco::state_reader in{std::span<const std::byte>(state)};
    target.load_state(in);
    return true;
  } catch (const sidco::error& e) {
    if (sidco::saved_state(target) != before) violated("a refused state changed what the target saves");
    const std::string message = e.what();
    if (message.empty() || sidco::detail::valid_utf8(message) != message)
      violated("a refusal's message is empty or not UTF-8 text (Python would show it empty)");
    return false;
  } catch (...) {
    violated("load_state threw something other than sidco::error");
  }
}

template <class Target>
void check_round_trip(const Target& loaded, Target& fresh) {
  const std::vector<std::byte> bytes = sidco::saved_state(loaded);
  if (!load(fresh, bytes)) violated("a loaded state saves to bytes its own kind refuses");
  if (sidco::saved_state(fresh) != bytes) violated("a loaded state does not save to the same bytes after a round trip");
}

template <class Compressor>
void compress_once(Compressor& c, std::vector<float>& residual) {
  const std::vector<float>& g = gradient();
  sidco::sparse_vector<float> out;
  sidco::feedback::residual<float> state{std::span<float>(residual)};
  c.compress(std::span<const float>(g), delta, out, state);
}

// Loads bytes into layer i of engine; false (nothing changed, checked by the caller) when refused.
template <class Engine>
bool engine_load(Engine& engine, std::size_t i, const std::vector<std::byte>& bytes) {
  try {
    engine.load(i, std::span<const std::byte>(bytes));
    return true;
  } catch (const sidco::error&) {
    return false;
  } catch (...) {
    violated("an engine's load threw something other than sidco::error");
  }
}

// What a compressor keeps of state when every byte must be read: its saved bytes; none:
// refused. Written out here rather than through load_whole_state, which the engines use: it
// is the oracle they are checked against.
template <class Compressor>
std::optional<std::vector<std::byte>> kept_whole(const Compressor& prototype, const std::vector<std::byte>& state) {
  try {
    Compressor direct = prototype;
    sidco::state_reader in{std::span<const std::byte>(state)};
    direct.load_state(in);
    in.finish();
    return sidco::saved_state(direct);
  } catch (const sidco::error&) {
    return std::nullopt;
  }
}

// The hook's engines (python/sidco_torch/csrc/engine.hpp, no torch in it; whole or per layer,
// the input's last byte picks one, for half the cost) load a layer's state with
// load_whole_state: into a copy, kept only when no byte follows it. So they take exactly the
// states a compressor takes with every byte read, keep what it keeps, and a refusal leaves
// every layer as it was. Tried with the state and with one byte more (mostly a state with a
// byte left over). After a kept state, the engine's next call is a valid selection or a refusal.
template <class Compressor>
void check_engines(const Compressor& prototype, const Compressor& target, const std::vector<std::byte>& state,
                   std::byte extra) {
  const std::vector<float>& g = gradient();
  const std::size_t n = g.size();
  std::vector<std::byte> longer = state;
  longer.push_back(extra);
  const std::optional<std::vector<std::byte>> expected[] = {kept_whole(prototype, longer), kept_whole(prototype, state)};
  const std::vector<std::byte> start = sidco::saved_state(target);
  const bool per_layer = (std::to_integer<unsigned>(extra) & 1) != 0;
  const std::vector<sidco::segment> layout =
      per_layer ? std::vector<sidco::segment>{{0, n / 2}, {n / 2, n - n / 2}} : std::vector<sidco::segment>{};
  auto engine = sidco_torch::engine_of<float, std::uint32_t>(prototype, layout, sidco_torch::layer_budget::shared);
  const std::size_t layers = engine->layers(), layer = layers - 1;
  for (std::size_t i = 0; i < layers; ++i)
    if (!engine_load(*engine, i, start)) violated("an engine refused a state its compressor saved");
  bool any_kept = false;
  for (int tried = 0; tried < 2; ++tried) {
    std::vector<std::vector<std::byte>> before;
    for (std::size_t i = 0; i < layers; ++i) before.push_back(engine->save(i));
    const bool kept = engine_load(*engine, layer, tried == 0 ? longer : state);
    if (kept != expected[tried].has_value()) violated("an engine and its compressor disagree on a state");
    for (std::size_t i = 0; i < layers; ++i)
      if ((!kept || i != layer) && engine->save(i) != before[i])
        violated("an engine's load changed a layer it did not keep a state for");
    if (kept && engine->save(layer) != *expected[tried]) violated("an engine keeps another state than its compressor");
    any_kept |= kept;
  }
  if (!any_kept) return;  // the engine as it was: its next call is the start state's
  std::vector<float> residual(n, 0.f);
  const std::vector<float> old = residual;
  sidco::sparse_vector<float> out;
  try {
    engine->compress(std::span<const float>(g), delta, std::span<float>(residual), out);
  } catch (const sidco::error&) {
    return;
  } catch (...) {
    violated("an engine's compress after a load threw something other than sidco::error");
  }
  if (const char* broken = fuzz::broken_selection_promise(out, g, old, residual)) violated(broken);
}

template <class Compressor>
void run_compressor(std::size_t method, const Compressor& prototype, const std::uint8_t* data, std::size_t size,
                    bool whole) {
  const std::vector<float>& g = gradient();
  // The same for every input of this method, so made once (the calls are deterministic): the
  // valid state and residual after three calls, and a target with a state of its own that a
  // refusal must keep. Keyed by the method: two may share a type, built with other options.
  struct start {
    std::vector<std::byte> valid;
    std::vector<float> residual;
    Compressor target;
  };
  static std::map<std::size_t, start> made_for;
  auto found = made_for.find(method);
  if (found == made_for.end()) {
    start s{{}, std::vector<float>(g.size(), 0.f), prototype};
    Compressor source = prototype;
    for (int call = 0; call < 3; ++call) compress_once(source, s.residual);
    s.valid = sidco::saved_state(source);
    std::vector<float> other(g.size(), 0.f);
    compress_once(s.target, other);
    found = made_for.emplace(method, std::move(s)).first;
  }
  const start& made = found->second;
  std::vector<float> residual = made.residual;
  Compressor target = made.target;
  const std::vector<std::byte> bytes = state_to_load(made.valid, data, size, whole);
  check_engines(prototype, made.target, bytes, std::byte(size > 0 ? data[size - 1] : 0));
  if (!load(target, bytes)) return;
  Compressor fresh = prototype;
  check_round_trip(target, fresh);
  // The next call: a valid selection that keeps every bit of mass, or a refusal.
  const std::vector<float> old = residual;
  sidco::sparse_vector<float> out;
  sidco::feedback::residual<float> state{std::span<float>(residual)};
  try {
    target.compress(std::span<const float>(g), delta, out, state);
  } catch (const sidco::error&) {
    return;
  } catch (...) {
    violated("compress after a loaded state threw something other than sidco::error");
  }
  if (const char* broken = fuzz::broken_selection_promise(out, g, old, residual)) violated(broken);
  // No state makes a method break its count: exactly k, and the top k where it promises that.
  const sidco::methods::count_promise promise = sidco::methods::table[method].count;
  if (promise != sidco::methods::count_promise::about_k && out.size() != sidco::target_count(delta, g.size()))
    violated("after a loaded state, a method that promises exactly k kept another count");
  if (promise == sidco::methods::count_promise::top_k) {
    std::vector<float> input(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) input[i] = g[i] + old[i];
    if (const char* broken = fuzz::broken_top_k(out, input, 0, g.size())) violated(broken);
  }
}

// A reduce-scatter exchange among 3 ranks (rank 0's core; the others simulated), compact8 so
// that the owner's carry is saved too.
using exchange = sidco::comm::reduce_core<float, std::uint32_t, sidco::comm::owner_sidco_e>;

void step(std::vector<exchange>& cores, std::uint64_t number) {
  using namespace sidco;
  const std::vector<float>& g = gradient();
  const std::size_t ranks = cores.size(), bytes = cores[0].block_bytes();
  std::vector<std::vector<std::byte>> blocks(ranks, std::vector<std::byte>(ranks * bytes)),
      selections(ranks, std::vector<std::byte>(bytes));
  std::vector<std::vector<float>> residuals(ranks, std::vector<float>(g.size(), 0.f));
  for (std::size_t r = 0; r < ranks; ++r) {
    sparse_vector<float> sent(g.size());
    for (std::size_t i = r; i < g.size(); i += 7) sent.push_back(std::uint32_t(i), g[i] * float(r + 1));
    comm::host_residual<float> sink{std::span<float>(residuals[r])};
    cores[r].pack(sent, sink, cores[r].fields(number), blocks[r]);
  }
  for (std::size_t o = 0; o < ranks; ++o) {
    std::vector<std::span<const std::byte>> received;
    for (std::size_t r = 0; r < ranks; ++r) received.push_back(std::span<const std::byte>(blocks[r]).subspan(o * bytes, bytes));
    cores[o].select(received, selections[o]);
  }
  const std::vector<std::span<const std::byte>> all(selections.begin(), selections.end());
  for (std::size_t r = 0; r < ranks; ++r) {
    comm::host_residual<float> sink{std::span<float>(residuals[r])};
    try {
      cores[r].apply(all, sink);
    } catch (const sidco::runtime_error&) {
      // Refused alike on every rank (what the exchange's own tests check); nothing to add here.
    } catch (...) {
      violated("an exchange step after a loaded state threw something other than sidco::runtime_error");
    }
  }
}

void run_exchange(const std::uint8_t* data, std::size_t size, bool whole) {
  using namespace sidco;
  const std::vector<segment> layout{{0, gradient().size()}};
  const comm::exchange_options options{1.25, comm::reduction::average, 3, true, comm::entry_coding::compact8};
  const auto ranks = [&] {
    std::vector<exchange> cores;
    for (std::size_t r = 0; r < 3; ++r) cores.emplace_back(layout, delta, 3, r, options);
    return cores;
  };
  static const std::vector<std::byte> valid = [&] {  // the same for every input: made once
    std::vector<exchange> source = ranks();
    for (std::uint64_t s = 0; s < 3; ++s) step(source, s);
    return sidco::saved_state(source[0]);
  }();
  std::vector<exchange> target = ranks(), fresh = ranks();
  if (!load(target[0], state_to_load(valid, data, size, whole))) return;
  check_round_trip(target[0], fresh[0]);
  step(target, 3);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto& table = sidco::methods::table;
  const std::size_t choice = data[0] % (2 * (table.size() + 1));  // a method or the exchange; whole or changed
  const bool whole = choice % 2 == 1;
  const std::size_t target = choice / 2;
  if (target == table.size()) {
    run_exchange(data + 1, size - 1, whole);
  } else {
    sidco::methods::visit(table[target].name, {},
                          [&](auto prototype) { run_compressor(target, prototype, data + 1, size - 1, whole); });
  }
  return 0;
}
