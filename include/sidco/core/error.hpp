// The one exception type sidco throws for invalid arguments, and helpers that name them.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace sidco {

/// Thrown for invalid arguments. The message names the argument and its value; the call
/// that threw has changed none of the caller's buffers or state.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  message.precision(10);
  message << "sidco: ";
  (message << ... << parts);
  throw error(message.str());
}

}  // namespace detail
}  // namespace sidco
