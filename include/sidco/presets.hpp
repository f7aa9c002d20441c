// The published methods by name. Presets are type aliases, nothing more.
#pragma once

#include "sidco/backend/cpu.hpp"
#include "sidco/backend/serial.hpp"
#include "sidco/compressor.hpp"
#include "sidco/dist/exponential.hpp"
#include "sidco/dist/gamma.hpp"
#include "sidco/dist/generalized_pareto.hpp"
#include "sidco/dist/weibull.hpp"
#include "sidco/estimate/gaussian_k.hpp"
#include "sidco/estimate/none.hpp"
#include "sidco/estimate/redsync.hpp"
#include "sidco/estimate/sampled.hpp"
#include "sidco/estimate/statistical.hpp"
#include "sidco/select/exact_k.hpp"
#include "sidco/select/random_k.hpp"
#include "sidco/select/top_k.hpp"
#include "sidco/stages/stages.hpp"

namespace sidco::presets {

template <class First, class Tail, class Stages, class Fit, class Selection, class Backend>
using sidco_with = compressor<estimate::statistical<First, Tail, Stages, Fit>, Selection, Backend>;

/// SIDCo-E: exponential in every stage, adaptive stage count.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_e = sidco_with<dist::exponential, dist::exponential, stages::adaptive, fit::zero_aware,
                           Selection, Backend>;

/// SIDCo-GP: generalized Pareto in every stage.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gp = sidco_with<dist::generalized_pareto, dist::generalized_pareto, stages::adaptive,
                            fit::zero_aware, Selection, Backend>;

/// SIDCo-Gamma-GP: gamma for the bulk in stage 1, generalized Pareto for the tail stages.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gamma_gp = sidco_with<dist::gamma, dist::generalized_pareto, stages::adaptive,
                                  fit::zero_aware, Selection, Backend>;

/// SIDCo-Weibull: Weibull in every stage (shape < 1 is a heavier tail than the exponential).
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_weibull = sidco_with<dist::weibull, dist::weibull, stages::adaptive, fit::zero_aware,
                                 Selection, Backend>;

/// Single-stage variants: one fit, two passes in all.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_e_single = sidco_with<dist::exponential, dist::exponential, stages::single,
                                  fit::zero_aware, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gp_single = sidco_with<dist::generalized_pareto, dist::generalized_pareto,
                                   stages::single, fit::zero_aware, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gamma_single = sidco_with<dist::gamma, dist::gamma, stages::single, fit::zero_aware,
                                      Selection, Backend>;

/// The original SIDCo fit (zeros in the sample, fixed stage fractions), for comparison.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_e_paper = sidco_with<dist::exponential, dist::exponential, stages::adaptive,
                                 fit::paper, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gp_paper = sidco_with<dist::generalized_pareto, dist::generalized_pareto,
                                  stages::adaptive, fit::paper, Selection, Backend>;
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_gamma_gp_paper = sidco_with<dist::gamma, dist::generalized_pareto, stages::adaptive,
                                        fit::paper, Selection, Backend>;

/// Exact Top-k by radix select: the k = max(1, floor(delta N)) largest |x|, ties to the
/// lower index.
template <class Backend = backend::cpu>
using top_k = compressor<estimate::none, select::top_k, Backend>;

/// Random-k with a shared seed (pass select::random_k{seed} to the constructor).
template <class Backend = backend::cpu>
using random_k = compressor<estimate::none, select::random_k, Backend>;

/// DGC: sampled threshold, trimmed by magnitude beyond 20% over k. Use it with
/// feedback::momentum for DGC's momentum correction, and feedback::density_warmup.
template <class Selection = select::trimmed<20>, class Backend = backend::cpu>
using dgc = compressor<estimate::sampled, Selection, Backend>;

/// Gaussian-k: normal-quantile threshold, adjusted towards k.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using gaussian_k = compressor<estimate::gaussian_k, Selection, Backend>;

/// RedSync: mean + r (max - mean) by bisection; redsync_trimmed cuts to exactly k.
template <class Selection = select::above_threshold, class Backend = backend::cpu>
using redsync = compressor<estimate::redsync, Selection, Backend>;
template <class Backend = backend::cpu>
using redsync_trimmed = compressor<estimate::redsync, select::trimmed<0>, Backend>;

/// SIDCo made exact: the statistical threshold finds candidates, exact_k keeps the top k.
template <class Backend = backend::cpu>
using sidco_e_exact = sidco_e<select::exact_k, Backend>;
template <class Backend = backend::cpu>
using sidco_gp_exact = sidco_gp<select::exact_k, Backend>;

}  // namespace sidco::presets
