// comm/collective_wait.hpp, the polling wait behind the NCCL allreducer, with fakes for the
// stream and the communicator (the real multi-GPU test is tests/cuda/nccl_test.cu): a
// stream that finishes returns; a stuck stream with an asynchronous error (a peer that
// died) throws that error instead of waiting; a stuck stream with none throws at the
// timeout; no timeout keeps polling while the work progresses.
#include "doctest.hpp"

#include <chrono>
#include <string>

#include <sidco/comm/collective_wait.hpp>

// Named after the file: the test programs compile several test files as one unit.
namespace collective_wait_test {

using sidco::comm::detail::poll_until_finished;
using namespace std::chrono_literals;

TEST_CASE("a stream that finishes: the wait returns once it has") {
  int polls = 0;
  poll_until_finished([&] { return ++polls == 5; }, [] { return std::string(); }, 0ms, "NCCL");
  CHECK(polls == 5);
}

TEST_CASE("a stuck stream and a peer that died: the asynchronous error, not a hang") {
  int polls = 0;
  CHECK_THROWS_WITH_AS(
      poll_until_finished([&] { return ++polls, false; },
                          [&] { return polls < 3 ? std::string() : std::string("remote process exited or there was a network error"); },
                          0ms, "NCCL"),
      "sidco: NCCL: asynchronous error: remote process exited or there was a network error", sidco::runtime_error);
  CHECK(polls == 3);
}

TEST_CASE("a stuck stream and a silent peer: the timeout") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(poll_until_finished([] { return false; }, [] { return std::string(); }, 20ms, "NCCL"),
                       "sidco: NCCL: no progress in 20 ms", sidco::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start >= 20ms);
}

TEST_CASE("the default timeout is finite") {
  CHECK(sidco::comm::default_collective_timeout > 0ms);
  CHECK(sidco::comm::default_collective_timeout <= std::chrono::minutes(30));
}

}  // namespace collective_wait_test
