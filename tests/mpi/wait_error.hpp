// What an exchange's wait() raised as sidco::runtime_error (the failure every rank raises
// alike), or "" when it returned: the MPI tests' failure cases compare that sentence.
#pragma once

#include <string>

#include <sidco/core/error.hpp>

template <class Exchange, class Dense>
std::string wait_error(Exchange& exchange, Dense& dense) {
  try {
    exchange.wait(dense);
  } catch (const sidco::runtime_error& e) {
    return e.what();
  }
  return "";
}
