// The two exception types sidco throws, and the helpers that build their messages.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>

namespace sidco {

/// An invalid argument. The message names the argument and its value; the call that threw
/// has changed none of the caller's buffers or state.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An input that holds NaN or +-Inf (the message names how many and the first): an invalid
/// argument of its own type, so that a mixed-precision loop can tell an overflow from a bug.
class nonfinite_error : public error {
 public:
  using error::error;
};

/// A failure outside the arguments' control: a device, a network or a peer rank. The
/// message says what failed and where; what the call had written by then is unspecified
/// (each throwing function says which state it leaves), and state that another rank
/// depends on must be treated as lost (see the exchange's documentation).
class runtime_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Appends part to out; floating-point values in their shortest round-trip form, so that
/// two values that differ are never printed alike.
template <class Part>
void append_part(std::ostringstream& out, const Part& part) {
  if constexpr (std::is_floating_point_v<Part>) {
    char text[64];
    const auto written = std::to_chars(text, text + sizeof text, part);
    out.write(text, written.ptr - text);
  } else {
    out << part;
  }
}

template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream out;
  out << "sidco: ";
  (append_part(out, parts), ...);
  return out.str();
}

}  // namespace detail

/// Throws sidco::error with "sidco: " and the parts (numbers in shortest round-trip form):
/// for code built on sidco (a framework binding, a policy of its own) that checks its
/// arguments as sidco does.
template <class... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
  throw error(detail::message(parts...));
}

/// Throws sidco::runtime_error with "sidco: " and the parts.
template <class... Parts>
[[noreturn]] void throw_runtime_error(const Parts&... parts) {
  throw runtime_error(detail::message(parts...));
}

namespace detail {

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw_error(parts...);
}

template <class... Parts>
[[noreturn]] void fail_at_run_time(const Parts&... parts) {
  throw_runtime_error(parts...);
}

}  // namespace detail
}  // namespace sidco
