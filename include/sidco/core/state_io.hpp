// A policy's state between calls (adaptive stages, a generator's position) as bytes, so
// that a checkpoint restores a compressor bit for bit and a resumed run repeats an
// uninterrupted one.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sidco/core/bit.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/utf8.hpp"

namespace sidco {

namespace detail {

/// A name read from a state, for an error message: at most 64 bytes of it, as valid UTF-8. A
/// damaged checkpoint holds any bytes there, and Python makes an exception whose message is
/// not UTF-8 into an empty one.
inline std::string printable_name(std::string_view name) {
  constexpr std::size_t longest = 64;
  std::string text = valid_utf8(utf8_prefix(name, longest));
  if (name.size() > longest) text += "...";
  return text;
}

}  // namespace detail

/// Appends 64-bit little-endian words: integers as they are, doubles by their bits, and
/// names that the reader checks, so that a state cannot be loaded into another policy.
class state_writer {
 public:
  void word(std::uint64_t v) { put_word(extend(8), v); }
  void number(double v) { word(detail::bit_cast<std::uint64_t>(v)); }
  void name(std::string_view text) {
    word(text.size());
    for (char c : text) bytes_.push_back(std::byte(c));
  }

  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }
  /// Empties the writer, keeping its storage (a state written every step).
  void clear() { bytes_.clear(); }
  /// bytes more at the end, for the caller to fill with put_word (a long state written in
  /// one go); valid until the next write.
  std::byte* extend(std::size_t bytes) {
    bytes_.resize(bytes_.size() + bytes);
    return bytes_.data() + bytes_.size() - bytes;
  }
  /// Writes v as a word at `at` (8 bytes, little-endian).
  static void put_word(std::byte* at, std::uint64_t v) {
    for (int b = 0; b < 8; ++b) at[b] = std::byte(v >> (8 * b));
  }

 private:
  std::vector<std::byte> bytes_;
};

/// Reads what a state_writer wrote; anything short, misnamed or left over is a sidco::error
/// naming what was expected.
class state_reader {
 public:
  explicit state_reader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  std::uint64_t word(const char* what) {
    if (bytes_.size() - at_ < 8) detail::fail("state: ends before ", what, " (", bytes_.size(), " bytes)");
    const std::uint64_t v = word_at(at_);
    at_ += 8;
    return v;
  }
  double number(const char* what) { return detail::bit_cast<double>(word(what)); }

  /// The next name must be expected: a state of another policy or method is refused. A
  /// name written with underscores (policy names before they took the registry's hyphens)
  /// reads as the same name.
  void expect(std::string_view expected) {
    const std::string_view found = read_name();
    if (!same_name(found, expected))
      detail::fail("state: holds '", detail::printable_name(found), "' where '", expected,
                   "' was expected (a state of another method?)");
  }

  /// The next name, whatever it is (for a reader that accepts several).
  std::string_view read_name() {
    const std::uint64_t length = word("a name");
    if (length > bytes_.size() - at_)
      detail::fail("state: a name of ", length, " bytes runs past its end (", bytes_.size(), " bytes)");
    const std::string_view found(reinterpret_cast<const char*>(bytes_.data() + at_), std::size_t(length));
    at_ += std::size_t(length);
    return found;
  }

  /// Whether the next field is the name `expected`, reading nothing (a field added to a
  /// state later, which states saved before it lack).
  bool next_name_is(std::string_view expected) const {
    if (bytes_.size() - at_ < 8) return false;
    const std::uint64_t length = word_at(at_);
    if (length != expected.size() || length > bytes_.size() - at_ - 8) return false;
    return same_name({reinterpret_cast<const char*>(bytes_.data() + at_ + 8), std::size_t(length)}, expected);
  }

  /// Skips what is left (a part this reader has no use for).
  void skip_rest() { at_ = bytes_.size(); }

  /// Every byte must have been read.
  void finish() const {
    if (at_ != bytes_.size())
      detail::fail("state: ", bytes_.size() - at_, " bytes left over after ", at_, " (a state of another method?)");
  }

 private:
  // The little-endian word at offset, which the caller has checked lies inside.
  std::uint64_t word_at(std::size_t offset) const {
    std::uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= std::uint64_t(bytes_[offset + std::size_t(b)]) << (8 * b);
    return v;
  }

  static bool same_name(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && !((a[i] == '_' || a[i] == '-') && (b[i] == '_' || b[i] == '-'))) return false;
    return true;
  }

  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

/// A policy with state between calls: save_state(writer) const and load_state(reader),
/// which either restores everything or throws having changed nothing.
template <class P>
concept stateful = requires(const P& p, P& q, state_writer& w, state_reader& r) {
  p.save_state(w);
  q.load_state(r);
};

/// Every byte of target's state: what a checkpoint stores, and what load_whole_state takes back.
template <stateful Target>
std::vector<std::byte> saved_state(const Target& target) {
  state_writer out;
  target.save_state(out);
  return out.take();
}

/// Loads target's state from bytes, all of which it must read: a state with anything after it
/// (a longer file's rest, a second state) is refused like a damaged one, with a sidco::error,
/// and either way a refusal leaves target as it was. load_state alone cannot promise that,
/// since state_reader::finish() only finds the extra bytes after it. A target that copies
/// loads into a copy; one that does not (a reduce exchange's core, with its scratch) saves
/// what it holds first and has it put back.
template <stateful Target>
void load_whole_state(Target& target, std::span<const std::byte> bytes) {
  state_reader in(bytes);
  if constexpr (std::is_copy_constructible_v<Target> && std::is_move_assignable_v<Target>) {
    Target loaded = target;
    loaded.load_state(in);
    in.finish();
    target = std::move(loaded);
  } else {
    const std::vector<std::byte> held = saved_state(target);
    target.load_state(in);
    try {
      in.finish();
    } catch (...) {
      state_reader back(held);
      target.load_state(back);
      throw;
    }
  }
}

namespace detail {

/// A value read from a state that must lie in [low, high] (and not be NaN).
inline double checked_state(double v, double low, double high, const char* what) {
  if (!(v >= low && v <= high)) fail("state: ", what, " = ", v, " is outside [", low, ", ", high, "]");
  return v;
}

/// A value read from a state that is -1 (none yet) or a finite value >= 0 (what: its name,
/// kind: what it measures).
inline double unset_or_finite_state(double v, const char* what, const char* kind) {
  if (!(v == -1 || (v >= 0 && std::isfinite(v))))
    fail("state: ", what, " = ", v, " is neither -1 nor a finite ", kind);
  return v;
}

}  // namespace detail
}  // namespace sidco
