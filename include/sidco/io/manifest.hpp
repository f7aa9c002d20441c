// A gradient manifest (JSON): per file, its layers as sidco segments, e.g.
//
//   {"lstm_it10.npy": {"layers": [{"offset": 0, "size": 1024}, {"offset": 1024, "size": 256}]}}
//
// as examples/data/gradients/manifest.json and ../shared/tools/make_lm_gradients.py write
// it. Needs nlohmann-json (Debian: nlohmann-json3-dev; not needed by any other header).
// Its parser keeps its own stack (a file of a million '[' is an error, not a stack
// overflow); every offset and size must be a JSON integer in [0, 2^64), each file's layers
// must tile it (check::layout, which adds sizes with an overflow check), and a file listed
// twice is refused. Errors are sidco::error naming the manifest, the file and the layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::io {

namespace manifest_detail {

[[noreturn]] inline void fail(const std::string& path, const std::string& what) {
  sidco::detail::fail("manifest '", path, "': ", what);
}

inline std::size_t whole_number(const nlohmann::json& v, const std::string& path, const std::string& where) {
  // Non-negative integers parse as unsigned; negative ones, fractions and integers past
  // 2^64 (parsed as floating point) do not.
  if (!v.is_number_unsigned()) fail(path, where + " is " + v.dump() + ", not an integer in [0, 2^64)");
  return std::size_t(v.get<std::uint64_t>());
}

}  // namespace manifest_detail

/// The manifest's text as file name -> its layers, in order; `path` names it in errors.
inline std::map<std::string, std::vector<sidco::segment>> parse_manifest(const std::string& text,
                                                                       const std::string& path) {
  nlohmann::json root;
  // A file listed twice would silently take its last entry: the parser reports each key.
  std::set<std::string> files;
  std::string twice;
  const auto note_file = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !files.insert(parsed.get<std::string>()).second &&
        twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  try {
    root = nlohmann::json::parse(text, note_file);
  } catch (const nlohmann::json::exception& e) {
    manifest_detail::fail(path, e.what());
  }
  if (!root.is_object()) manifest_detail::fail(path, "not a JSON object");
  if (!twice.empty()) manifest_detail::fail(path, "'" + twice + "' is listed twice");
  std::map<std::string, std::vector<sidco::segment>> layouts;
  for (const auto& [file, entry] : root.items()) {
    if (!entry.is_object() || !entry.contains("layers") || !entry["layers"].is_array())
      manifest_detail::fail(path, "'" + file + "' has no layers list");
    auto& layout = layouts[file];
    for (std::size_t i = 0; i < entry["layers"].size(); ++i) {
      const auto& layer = entry["layers"][i];
      const std::string where = "layer " + std::to_string(i) + " of '" + file + "'";
      if (!layer.is_object() || !layer.contains("offset") || !layer.contains("size"))
        manifest_detail::fail(path, where + " lacks offset or size");
      layout.push_back({manifest_detail::whole_number(layer["offset"], path, where + ": offset"),
                        manifest_detail::whole_number(layer["size"], path, where + ": size")});
    }
    try {
      sidco::check::layout(layout);
    } catch (const sidco::error& e) {
      std::string why = e.what();
      if (why.rfind("sidco: ", 0) == 0) why.erase(0, 7);
      manifest_detail::fail(path, "'" + file + "': " + why);
    }
  }
  return layouts;
}

/// The manifest file at `path`, as parse_manifest reads it.
inline std::map<std::string, std::vector<sidco::segment>> load_manifest(const std::string& path) {
  if (std::filesystem::is_directory(path)) manifest_detail::fail(path, "is a directory, not a manifest file");
  std::ifstream in(path);
  if (!in) manifest_detail::fail(path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), path);
}

}  // namespace sidco::io
