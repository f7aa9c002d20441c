// The published methods by name, as compressor types: one-line aliases of the registry's
// entries (methods.hpp), Backend their one parameter.
#pragma once

#include "sidco/methods.hpp"

namespace sidco::presets {

/// A SIDCo composition of your own: the model of the first stage, of the later stages (the
/// excesses over the last threshold: the same model unless another is given), the stage
/// count policy, the fit, the selection and the backend. sidco_with<models::exponential> is
/// SIDCo-E (presets::sidco_e).
template <class First, class Tail = First, class Stages = stages::adaptive, class Fit = fit::zero_aware,
          class Selection = select::above_threshold, class Backend = backend::cpu>
using sidco_with = compressor<estimate::statistical<First, Tail, Stages, Fit>, Selection, Backend>;

/// A published method's estimator with another selection, e.g.
/// with_selection<methods::sidco_gp, select::trimmed<0>>.
template <class Method, class Selection, class Backend = backend::cpu>
using with_selection = compressor<typename Method::estimator, Selection, Backend>;

/// SIDCo-E: exponential in every stage, adaptive stage count.
template <class Backend = backend::cpu>
using sidco_e = methods::compressor_of<methods::sidco_e, Backend>;
/// SIDCo-GP: generalized Pareto in every stage.
template <class Backend = backend::cpu>
using sidco_gp = methods::compressor_of<methods::sidco_gp, Backend>;
/// SIDCo-Gamma-GP: gamma for the bulk in stage 1, generalized Pareto for the tail stages.
template <class Backend = backend::cpu>
using sidco_gamma_gp = methods::compressor_of<methods::sidco_gamma_gp, Backend>;
/// SIDCo-Weibull: Weibull in every stage (shape < 1 is a heavier tail than the exponential).
template <class Backend = backend::cpu>
using sidco_weibull = methods::compressor_of<methods::sidco_weibull, Backend>;

/// Single-stage variants: one fit, two passes in all.
template <class Backend = backend::cpu>
using sidco_e_single = methods::compressor_of<methods::sidco_e_single, Backend>;
template <class Backend = backend::cpu>
using sidco_gp_single = methods::compressor_of<methods::sidco_gp_single, Backend>;
template <class Backend = backend::cpu>
using sidco_gamma_single = methods::compressor_of<methods::sidco_gamma_single, Backend>;

/// The original SIDCo fit (zeros in the sample, fixed stage fractions), for comparison.
template <class Backend = backend::cpu>
using sidco_e_paper = methods::compressor_of<methods::sidco_e_paper, Backend>;
template <class Backend = backend::cpu>
using sidco_gp_paper = methods::compressor_of<methods::sidco_gp_paper, Backend>;
template <class Backend = backend::cpu>
using sidco_gamma_gp_paper = methods::compressor_of<methods::sidco_gamma_gp_paper, Backend>;

/// Exact Top-k by radix select: the k = max(1, floor(delta N)) largest |x|, ties to the
/// lower index.
template <class Backend = backend::cpu>
using top_k = methods::compressor_of<methods::top_k, Backend>;

/// SIDCo made exact: the statistical threshold finds candidates, exact_k keeps the top k.
template <class Backend = backend::cpu>
using sidco_e_exact = methods::compressor_of<methods::sidco_e_exact, Backend>;
template <class Backend = backend::cpu>
using sidco_gp_exact = methods::compressor_of<methods::sidco_gp_exact, Backend>;

/// Random-k with a shared seed (pass select::random_k{seed} to the constructor).
template <class Backend = backend::cpu>
using random_k = methods::compressor_of<methods::random_k, Backend>;

/// DGC: sampled threshold, trimmed by magnitude beyond 20% over k. Use it with
/// feedback::momentum for DGC's momentum correction, and feedback::density_warmup.
template <class Backend = backend::cpu>
using dgc = methods::compressor_of<methods::dgc, Backend>;

/// Gaussian-k: normal-quantile threshold, adjusted towards k.
template <class Backend = backend::cpu>
using gaussian_k = methods::compressor_of<methods::gaussian_k, Backend>;

/// RedSync: mean + r (max - mean) by bisection; redsync_trimmed cuts to k when it keeps more.
template <class Backend = backend::cpu>
using redsync = methods::compressor_of<methods::redsync, Backend>;
template <class Backend = backend::cpu>
using redsync_trimmed = methods::compressor_of<methods::redsync_trimmed, Backend>;

}  // namespace sidco::presets
