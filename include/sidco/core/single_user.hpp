// Catches one object used from two threads at once, in every build. A compressor keeps
// workspace and adaptive state between calls, so two calls at once would race and return
// malformed output or crash; the check is one uncontended atomic exchange a call (a few
// nanoseconds against a compress's microseconds at least), so release builds keep it.
#pragma once

#include <atomic>

#include "sidco/core/error.hpp"

namespace sidco::detail {

/// A flag a call holds while it runs. Copies start free: a copy is another object.
class single_user {
 public:
  single_user() = default;
  single_user(const single_user&) noexcept {}
  single_user& operator=(const single_user&) noexcept { return *this; }

  /// Holds the flag until it goes out of scope; throws sidco::error naming what when another
  /// call holds it (that call goes on undisturbed, and nothing of the object changes).
  class [[nodiscard]] scope {
   public:
    scope(single_user& user, const char* what) : user_(user) {
      if (user_.busy_.exchange(true, std::memory_order_acquire))
        fail(what, ": called from two threads at once; one object serves one thread at a time "
                   "(give each thread its own)");
    }
    ~scope() { user_.busy_.store(false, std::memory_order_release); }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    single_user& user_;
  };

 private:
  std::atomic<bool> busy_{false};
};

}  // namespace sidco::detail
