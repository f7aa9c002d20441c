// The published methods by name. Presets are type aliases, nothing more.
#pragma once

#include "sidco/compressor.hpp"
#include "sidco/dist/exponential.hpp"
#include "sidco/dist/gamma.hpp"
#include "sidco/dist/generalized_pareto.hpp"
#include "sidco/estimate/statistical.hpp"
#include "sidco/stages/stages.hpp"

namespace sidco::presets {

template <class First, class Tail, class Stages, class Fit, class Selection, class Backend>
using sidco_with = compressor<estimate::statistical<First, Tail, Stages, Fit>, Selection, Backend>;

/// SIDCo-E: exponential in every stage, adaptive stage count.
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_e = sidco_with<dist::exponential, dist::exponential, stages::adaptive, fit::zero_aware,
                           Selection, Backend>;

/// SIDCo-GP: generalized Pareto in every stage.
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gp = sidco_with<dist::generalized_pareto, dist::generalized_pareto, stages::adaptive,
                            fit::zero_aware, Selection, Backend>;

/// SIDCo-Gamma-GP: gamma for the bulk in stage 1, generalized Pareto for the tail stages.
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gamma_gp = sidco_with<dist::gamma, dist::generalized_pareto, stages::adaptive,
                                  fit::zero_aware, Selection, Backend>;

/// Single-stage variants: one fit, two passes in all.
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_e_single = sidco_with<dist::exponential, dist::exponential, stages::single,
                                  fit::zero_aware, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gp_single = sidco_with<dist::generalized_pareto, dist::generalized_pareto,
                                   stages::single, fit::zero_aware, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gamma_single = sidco_with<dist::gamma, dist::gamma, stages::single, fit::zero_aware,
                                      Selection, Backend>;

/// The original SIDCo fit (zeros in the sample, fixed stage fractions), for comparison.
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_e_paper = sidco_with<dist::exponential, dist::exponential, stages::adaptive,
                                 fit::paper, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gp_paper = sidco_with<dist::generalized_pareto, dist::generalized_pareto,
                                  stages::adaptive, fit::paper, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::serial>
using sidco_gamma_gp_paper = sidco_with<dist::gamma, dist::generalized_pareto, stages::adaptive,
                                        fit::paper, Selection, Backend>;

}  // namespace sidco::presets
