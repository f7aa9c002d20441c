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
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <sidco/methods.hpp>
#include <sidco/sidco.hpp>

#include <sidco/io/manifest.hpp>

#include "bundled_gradients.hpp"

namespace {

using sparse = sidco::sparse_vector<float>;

struct measurement {
  sidco::compress_report first;  // what the first call on this gradient delivers
  double median_ms = 0;          // per call, with warm buffers and the same work as the first
};
// layout empty: the whole vector at once; otherwise one estimate per segment.
using runner = std::function<measurement(std::span<const float>, double, sparse&, int,
                                         const std::vector<sidco::segment>& layout)>;

struct method {
  std::string name;
  std::string description;
  runner run;
  std::string count;  // what it promises about the count (--list): about-k, exactly-k, top-k, baseline
};

const char* promise_name(sidco::methods::count_promise p) {
  switch (p) {
    case sidco::methods::count_promise::about_k: return "about-k";
    case sidco::methods::count_promise::exactly_k: return "exactly-k";
    case sidco::methods::count_promise::top_k: return "top-k";
  }
  return "?";
}

// The first call reports the density a user gets without any adaptation. The timed calls run
// on copies of the compressor as it was after that call: warm workspace (as in training,
// where a compressor lives across steps), same stage count, so the same work.
template <class Compressor>
measurement measure(Compressor compressor, std::span<const float> g, double delta, sparse& out,
                    int repeat) {
  measurement m;
  m.first = compressor.template compress<float>(g, delta, out);
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) {
    Compressor warm = compressor;
    const auto start = std::chrono::steady_clock::now();
    warm.template compress<float>(g, delta, out);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                           start).count());
  }
  std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
  m.median_ms = ms[ms.size() / 2];
  return m;
}

// The methods of sidco::methods::table (the one table the torch binding uses too), by name.
runner measured(std::string_view name) {
  return [name](std::span<const float> g, double delta, sparse& out, int repeat,
                const std::vector<sidco::segment>& layout) {
    return sidco::methods::visit(name, {}, [&](auto compressor) {
      using Compressor = decltype(compressor);
      if (layout.empty()) return measure(std::move(compressor), g, delta, out, repeat);
      return measure(sidco::segmented<Compressor>(layout, std::move(compressor)), g, delta, out, repeat);
    });
  };
}

// Exact Top-k by std::nth_element on magnitudes: the baseline every row is compared with.
// Ties go to the lower index, so the result is deterministic.
class nth_element_top_k {
 public:
  template <class T>
  sidco::compress_report compress(std::span<const T> g, double delta, sparse& out) {
    const std::size_t k = std::max<std::size_t>(1, std::size_t(delta * double(g.size())));
    order_.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) order_[i] = std::uint32_t(i);
    auto larger = [&](std::uint32_t a, std::uint32_t b) {
      const float fa = std::fabs(g[a]), fb = std::fabs(g[b]);
      return fa > fb || (fa == fb && a < b);
    };
    std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(k - 1), order_.end(), larger);
    const double kth_magnitude = std::fabs(g[order_[k - 1]]);
    std::sort(order_.begin(), order_.begin() + std::ptrdiff_t(k));
    out.clear(g.size());
    for (std::size_t i = 0; i < k; ++i) out.push_back(order_[i], g[order_[i]]);
    sidco::compress_report r;
    r.threshold = kth_magnitude;
    r.selected = k;
    r.size = g.size();
    r.target_density = delta;
    r.density = double(k) / double(g.size());
    return r;
  }

 private:
  std::vector<std::uint32_t> order_;
};

std::vector<method> all_methods() {
  std::vector<method> all;
  for (const auto& m : sidco::methods::table)
    all.push_back({std::string(m.name), std::string(m.description), measured(m.name), promise_name(m.count)});
  all.push_back({"topk-nth-element", "exact Top-k by std::nth_element (baseline; whole vector)",
                 [](std::span<const float> g, double delta, sparse& out, int repeat, const std::vector<sidco::segment>&) {
                   return measure(nth_element_top_k{}, g, delta, out, repeat);
                 },
                 "baseline"});
  return all;
}

// Usage errors exit 2 with CLI11's message, which names the option and the value.
[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "sidco-eval: " << message << "\n(run sidco-eval --help for usage)\n";
  std::exit(2);
}

std::string methods_text(const std::vector<method>& methods) {
  std::string text = "Methods:\n";
  for (const auto& m : methods) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-22s %s\n", m.name.c_str(), m.description.c_str());
    text += line;
  }
  return text;
}

// A number as written, or a sentence saying why not (CLI11 prefixes the option's name).
std::string not_a_number(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
  return "";
}

const CLI::Validator density_in_range(
    [](const std::string& text) {
      double d = 0;
      if (auto why = not_a_number(text, d); !why.empty()) return why;
      return d > 0 && d <= 1 ? std::string() : text + " is outside (0, 1]";
    },
    "");

const CLI::Validator whole_repeat(
    [](const std::string& text) {
      double r = 0;
      if (auto why = not_a_number(text, r); !why.empty()) return why;
      return r >= 1 && r <= 1e6 && r == std::floor(r) ? std::string()
                                                       : text + " is not a whole number in [1, 1e6]";
    },
    "");

int run(int argc, char** argv);

}  // namespace

// Everything is validated before any work; whatever still goes wrong is reported, never a
// crash: exit 2 for usage errors, 1 for bad input or a failed method.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "sidco-eval: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "sidco-eval: unknown error\n";
  }
  return 1;
}

namespace {

int run(int argc, char** argv) {
  const auto methods = all_methods();
  std::vector<std::string> inputs, chosen;
  std::vector<double> densities;
  int repeat = 5;
  bool csv = false;
  std::string layers_path;

  CLI::App app(
      "Compresses each float32 .npy gradient with each method at each density and prints\n"
      "achieved density, threshold, time per call and throughput. Density is that of the first\n"
      "call on a fresh compressor; time is the median of warm calls doing the same work\n"
      "(buffers reused, as across training steps).",
      "sidco-eval");
  app.add_option("--input", inputs, std::string("a .npy gradient (repeatable; default: every one in ") + sidco::bundled::gradients_dir() + ")")
      ->type_name("FILE.npy");
  std::vector<std::string> names;
  for (const auto& m : methods) names.push_back(m.name);
  app.add_option("--method", chosen, "a method (repeatable; default: all, listed below)")
      ->type_name("NAME")
      ->check(CLI::Validator(
          [names](const std::string& name) {
            return std::find(names.begin(), names.end(), name) != names.end() ? std::string()
                                                                             : "unknown method '" + name + "'";
          },
          ""));
  app.add_option("--density", densities, "a density in (0, 1] (repeatable; default: 0.1 0.01 0.001)")
      ->type_name("D")
      ->check(density_in_range);
  // Read as a number (so that 1e6 is taken as the help says), checked whole by the validator.
  app.add_option_function<double>("--repeat", [&](double r) { repeat = int(r); },
                                  "timed calls per row, 1 to 1e6 (median; default 5)")
      ->type_name("N")
      ->check(whole_repeat);
  app.add_option("--layers", layers_path,
                 "estimate per layer (sidco::segmented) with the layout this manifest gives for each "
                 "file; method names get a /layers suffix")
      ->type_name("manifest.json");
  app.add_flag("--csv", csv, "comma-separated output");
  bool list = false;
  app.add_flag("--list", list,
               "print every method, one a line: its name and what it promises about the count (about-k, "
               "exactly-k, top-k; baseline for std::nth_element), for scripts");
  app.footer(methods_text(methods));
  app.allow_extras();  // reported below, with a hint where a file was named without --input
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& e) {
    usage_error(e.what());
  }
  if (const std::vector<std::string> extras = app.remaining(); !extras.empty()) {
    std::string message = "not expected:";
    bool bare = false;
    for (const auto& extra : extras) {
      message += " " + extra;
      bare = bare || !extra.starts_with('-');
    }
    if (bare) message += " (a gradient file is named with --input FILE.npy)";
    usage_error(message);
  }
  if (list) {
    for (const auto& m : methods) std::cout << m.name << ' ' << m.count << '\n';
    return 0;
  }
  if (densities.empty()) densities = {0.1, 0.01, 0.001};
  if (inputs.empty()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(sidco::bundled::gradients_dir(), ec))
      if (entry.path().extension() == ".npy") inputs.push_back(entry.path().string());
    if (ec) usage_error(std::string("cannot read ") + sidco::bundled::gradients_dir() + ": " + ec.message());
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) usage_error(std::string("no .npy files in ") + sidco::bundled::gradients_dir());
  }
  std::vector<const method*> run;
  if (chosen.empty())
    for (const auto& m : methods) run.push_back(&m);
  for (const auto& name : chosen)  // every name was checked by the parser
    run.push_back(&*std::find_if(methods.begin(), methods.end(), [&](auto& m) { return m.name == name; }));

  std::map<std::string, std::vector<sidco::segment>> layouts;
  if (!layers_path.empty()) layouts = sidco::io::load_manifest(layers_path);  // a bad one: main reports it, exit 1

  // Every input read and checked before any work.
  struct loaded {
    std::string file;
    std::vector<float> values;
    std::vector<sidco::segment> layout;
  };
  std::vector<loaded> gradients;
  for (const auto& path : inputs) {
    loaded g;
    g.file = std::filesystem::path(path).filename().string();
    g.values = sidco::io::load_npy<float>(path);  // a bad file: main reports it, exit 1
    if (g.values.empty()) {
      std::cerr << "sidco-eval: " << path << " holds no values: nothing to compress\n";
      return 1;
    }
    if (!layers_path.empty()) {
      const auto found = layouts.find(g.file);
      if (found == layouts.end()) {
        std::cerr << "sidco-eval: manifest '" << layers_path << "' has no entry for " << g.file << "\n";
        return 1;
      }
      g.layout = found->second;
      std::size_t total = 0;
      for (const auto& segment : g.layout) total += segment.size;
      if (total != g.values.size()) {
        std::cerr << "sidco-eval: manifest '" << layers_path << "': the layers of " << g.file << " add up to " << total
                  << " values, the file holds " << g.values.size() << "\n";
        return 1;
      }
    }
    gradients.push_back(std::move(g));
  }

  if (csv)
    std::cout << "file,method,target_density,achieved_density,ratio,threshold,stages,selected,"
                 "time_ms,elements_per_s,speedup_vs_nth_element,fallback\n";
  else
    std::printf("%-18s %-22s %8s %10s %6s %11s %3s %9s %10s %8s\n", "file", "method", "target",
                "achieved", "ratio", "threshold", "st", "ms/call", "Melem/s", "vs nth");
  int failures = 0;
  for (const auto& input : gradients) {
    const std::vector<float>& g = input.values;
    const std::string& file = input.file;
    const std::vector<sidco::segment>& layout = input.layout;
    const std::string suffix = layout.empty() ? "" : "/layers";
    sparse out;
    for (double delta : densities) {
      // The baseline's time, measured in the same run, for the speed-up column.
      double base_ms = 0;
      try {
        base_ms = measure(nth_element_top_k{}, g, delta, out, repeat).median_ms;
      } catch (const sidco::error& e) {
        std::cerr << "sidco-eval: " << file << " at density " << delta << ": " << e.what() << "\n";
        return 1;
      }
      for (const method* m : run) {
        measurement result;
        try {
          result = m->run(g, delta, out, repeat, layout);
        } catch (const sidco::error& e) {
          std::cerr << "sidco-eval: " << file << " " << m->name << ": " << e.what() << "\n";
          ++failures;
          continue;
        }
        const auto& report = result.first;
        const double ms = result.median_ms;
        const double rate = double(g.size()) / (ms * 1e-3);
        const std::string name = m->name + (m->name == "topk-nth-element" ? "" : suffix);
        // A ratio past 10^6 (a density below one entry of the file) in exponent form, not
        // hundreds of digits.
        const bool huge = !(report.density_ratio() < 1e6);
        if (csv)
          std::printf(huge ? "%s,%s,%g,%.6g,%.4e,%.6g,%d,%zu,%.4f,%.4g,%.3f,%d\n"
                           : "%s,%s,%g,%.6g,%.4f,%.6g,%d,%zu,%.4f,%.4g,%.3f,%d\n", file.c_str(),
                      name.c_str(), delta, report.density, report.density_ratio(),
                      report.threshold, report.stages, report.selected, ms, rate, base_ms / ms,
                      int(report.fallback));
        else
          std::printf(huge ? "%-18s %-22s %8g %10.3g %6.2g %11.4g %3d %9.3f %10.1f %7.1fx\n"
                           : "%-18s %-22s %8g %10.3g %6.2f %11.4g %3d %9.3f %10.1f %7.1fx\n",
                      file.c_str(), name.c_str(), delta, report.density,
                      report.density_ratio(), report.threshold, report.stages, ms, rate * 1e-6,
                      base_ms / ms);
      }
    }
  }
  return failures ? 1 : 0;
}

}  // namespace
