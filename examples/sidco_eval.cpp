// sidco-eval: does each method deliver the density asked for on real gradients, and at what
// cost? Reads float32 .npy gradient files and prints one row per (file, method, density).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <sidco/sidco.hpp>

#ifndef SIDCO_GRADIENTS_DIR
#define SIDCO_GRADIENTS_DIR "examples/data/gradients"
#endif

namespace {

using sparse = sidco::sparse_vector<float>;
using runner = std::function<sidco::compress_report(std::span<const float>, double, sparse&)>;

struct method {
  std::string name;
  std::string description;
  runner run;
};

// A fresh compressor per call, so that every timed repetition does the same work.
template <class Compressor>
runner fresh() {
  return [](std::span<const float> g, double delta, sparse& out) {
    Compressor c;
    return c.template compress<float>(g, delta, out);
  };
}

// Exact Top-k by std::nth_element on magnitudes: the baseline every row is compared with.
sidco::compress_report nth_element_top_k(std::span<const float> g, double delta, sparse& out) {
  const std::size_t k = std::max<std::size_t>(1, std::size_t(delta * double(g.size())));
  std::vector<std::uint32_t> order(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) order[i] = std::uint32_t(i);
  auto larger = [&](std::uint32_t a, std::uint32_t b) {
    const float fa = std::fabs(g[a]), fb = std::fabs(g[b]);
    return fa > fb || (fa == fb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + std::ptrdiff_t(k - 1), order.end(), larger);
  const double kth_magnitude = std::fabs(g[order[k - 1]]);
  std::sort(order.begin(), order.begin() + std::ptrdiff_t(k));
  out.clear(g.size());
  for (std::size_t i = 0; i < k; ++i) out.push_back(order[i], g[order[i]]);
  sidco::compress_report r;
  r.threshold = kth_magnitude;
  r.selected = k;
  r.size = g.size();
  r.target_density = delta;
  r.density = double(k) / double(g.size());
  return r;
}

std::vector<method> all_methods() {
  using namespace sidco::presets;
  return {
      {"sidco-e", "SIDCo, exponential, adaptive stages", fresh<sidco_e<>>()},
      {"sidco-gp", "SIDCo, generalized Pareto, adaptive stages", fresh<sidco_gp<>>()},
      {"sidco-gamma-gp", "SIDCo, gamma then generalized Pareto", fresh<sidco_gamma_gp<>>()},
      {"sidco-e-single", "SIDCo, exponential, one stage", fresh<sidco_e_single<>>()},
      {"sidco-gp-single", "SIDCo, generalized Pareto, one stage", fresh<sidco_gp_single<>>()},
      {"sidco-gamma-single", "SIDCo, gamma, one stage", fresh<sidco_gamma_single<>>()},
      {"sidco-e-paper", "original SIDCo fit (zeros in sample, fixed stage fractions)",
       fresh<sidco_e_paper<>>()},
      {"sidco-gp-paper", "original SIDCo fit, generalized Pareto", fresh<sidco_gp_paper<>>()},
      {"sidco-gamma-gp-paper", "original SIDCo fit, gamma then GP", fresh<sidco_gamma_gp_paper<>>()},
      {"topk-nth-element", "exact Top-k by std::nth_element (baseline)", nth_element_top_k},
  };
}

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "sidco-eval: " << message << "\n(run sidco-eval --help for usage)\n";
  std::exit(2);
}

void print_help(const std::vector<method>& methods) {
  std::cout << "usage: sidco-eval [--input FILE.npy]... [--method NAME]... [--density D]...\n"
               "                  [--repeat N] [--csv]\n\n"
               "Compresses each float32 .npy gradient with each method at each density and\n"
               "prints achieved density, threshold, time per call and throughput. Defaults:\n"
               "every bundled gradient in " SIDCO_GRADIENTS_DIR ",\n"
               "every method, densities 0.1 0.01 0.001, 5 repetitions (median time).\n\n"
               "methods:\n";
  for (const auto& m : methods) std::printf("  %-22s %s\n", m.name.c_str(), m.description.c_str());
}

double parse_double(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0') usage_error(flag + " '" + text + "' is not a number");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const auto methods = all_methods();
  std::vector<std::string> inputs, chosen;
  std::vector<double> densities;
  int repeat = 5;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      print_help(methods);
      return 0;
    } else if (arg == "--csv") {
      csv = true;
    } else if (arg == "--input") {
      inputs.push_back(value());
    } else if (arg == "--method") {
      chosen.push_back(value());
    } else if (arg == "--density") {
      densities.push_back(parse_double(arg, value()));
    } else if (arg == "--repeat") {
      repeat = int(parse_double(arg, value()));
      if (repeat < 1) usage_error("--repeat must be at least 1");
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (densities.empty()) densities = {0.1, 0.01, 0.001};
  if (inputs.empty()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(SIDCO_GRADIENTS_DIR, ec))
      if (entry.path().extension() == ".npy") inputs.push_back(entry.path().string());
    if (ec) usage_error(std::string("cannot read ") + SIDCO_GRADIENTS_DIR + ": " + ec.message());
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) usage_error(std::string("no .npy files in ") + SIDCO_GRADIENTS_DIR);
  }
  std::vector<const method*> run;
  if (chosen.empty())
    for (const auto& m : methods) run.push_back(&m);
  for (const auto& name : chosen) {
    auto it = std::find_if(methods.begin(), methods.end(), [&](auto& m) { return m.name == name; });
    if (it == methods.end()) usage_error("unknown method '" + name + "'");
    run.push_back(&*it);
  }

  if (csv)
    std::cout << "file,method,target_density,achieved_density,ratio,threshold,stages,selected,"
                 "time_ms,elements_per_s,speedup_vs_nth_element\n";
  else
    std::printf("%-18s %-22s %8s %10s %6s %11s %3s %9s %10s %8s\n", "file", "method", "target",
                "achieved", "ratio", "threshold", "st", "ms/call", "Melem/s", "vs nth");
  int failures = 0;
  for (const auto& path : inputs) {
    std::vector<float> g;
    try {
      g = sidco::io::load_npy<float>(path);
    } catch (const sidco::error& e) {
      std::cerr << "sidco-eval: " << e.what() << "\n";
      return 1;
    }
    const std::string file = std::filesystem::path(path).filename().string();
    sparse out;
    for (double delta : densities) {
      // The baseline's time, measured in the same run, for the speed-up column.
      auto time_of = [&](const runner& f, sidco::compress_report& report) {
        std::vector<double> ms;
        for (int r = 0; r < repeat; ++r) {
          const auto start = std::chrono::steady_clock::now();
          report = f(g, delta, out);
          ms.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - start).count());
        }
        std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
        return ms[ms.size() / 2];
      };
      sidco::compress_report base_report;
      double base_ms = 0;
      try {
        base_ms = time_of(nth_element_top_k, base_report);
      } catch (const sidco::error& e) {
        std::cerr << "sidco-eval: " << file << " at density " << delta << ": " << e.what() << "\n";
        return 1;
      }
      for (const method* m : run) {
        sidco::compress_report report;
        double ms = 0;
        try {
          ms = time_of(m->run, report);
        } catch (const sidco::error& e) {
          std::cerr << "sidco-eval: " << file << " " << m->name << ": " << e.what() << "\n";
          ++failures;
          continue;
        }
        const double rate = double(g.size()) / (ms * 1e-3);
        if (csv)
          std::printf("%s,%s,%g,%.6g,%.4f,%.6g,%d,%zu,%.4f,%.4g,%.3f\n", file.c_str(),
                      m->name.c_str(), delta, report.density, report.density_ratio(),
                      report.threshold, report.stages, report.selected, ms, rate, base_ms / ms);
        else
          std::printf("%-18s %-22s %8g %10.3g %6.2f %11.4g %3d %9.3f %10.1f %7.1fx\n",
                      file.c_str(), m->name.c_str(), delta, report.density,
                      report.density_ratio(), report.threshold, report.stages, ms, rate * 1e-6,
                      base_ms / ms);
      }
    }
  }
  return failures ? 1 : 0;
}
