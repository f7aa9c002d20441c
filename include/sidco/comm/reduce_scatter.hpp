// The reduce-scatter exchange without a transport: its core (one rank's steps and state) and
// the pieces it is made of. Transports: comm/reduce_exchange.hpp (MPI), comm/nccl_reduce.cuh
// (NCCL), the DDP hook's reduce codecs.
#pragma once

#include "sidco/comm/owner.hpp"
#include "sidco/comm/ownership.hpp"
#include "sidco/comm/reduce/core.hpp"
#include "sidco/comm/reduce/plan.hpp"
#include "sidco/comm/reduce/state.hpp"
#include "sidco/comm/reduce/steps.hpp"
#include "sidco/comm/residual_sink.hpp"
