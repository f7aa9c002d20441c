// Umbrella header: the host parts of sidco.
#pragma once

#include "sidco/compressor.hpp"
#include "sidco/core/config.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/decompress.hpp"
#include "sidco/dist/exponential.hpp"
#include "sidco/dist/gamma.hpp"
#include "sidco/dist/generalized_pareto.hpp"
#include "sidco/dist/normal.hpp"
#include "sidco/estimate/statistical.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/io/npy.hpp"
#include "sidco/presets.hpp"
#include "sidco/stages/stages.hpp"
