// Reads the gradient manifest (manifest.json): per file, its layers as sidco segments.
// A small JSON reader is enough for this file, and keeps the example free of dependencies.
#pragma once

#include <cctype>
#include <cstddef>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sidco/segmented.hpp>

namespace manifest {

struct value {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  double number = 0;
  std::string text;
  std::vector<value> items;
  std::map<std::string, value> fields;
};

class parser {
 public:
  parser(std::string text, std::string path) : text_(std::move(text)), path_(std::move(path)) {}

  value parse() {
    value v = parse_value();
    skip_space();
    if (at_ != text_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw sidco::error("sidco-eval: manifest '" + path_ + "': " + what + " at byte " +
                       std::to_string(at_));
  }
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  void expect(char c) {
    skip_space();
    if (at_ >= text_.size() || text_[at_] != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  bool next_is(char c) {
    skip_space();
    return at_ < text_.size() && text_[at_] == c;
  }
  std::string parse_string() {
    expect('"');
    std::string s;
    while (at_ < text_.size() && text_[at_] != '"') {
      if (text_[at_] == '\\') ++at_;  // escapes: the next character as it is
      if (at_ < text_.size()) s += text_[at_++];
    }
    expect('"');
    return s;
  }
  value parse_value() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    value v;
    const char c = text_[at_];
    if (c == '{') {
      v.type = value::kind::object;
      ++at_;
      if (!next_is('}')) {
        do {
          std::string key = parse_string();
          expect(':');
          v.fields[key] = parse_value();
        } while (next_is(',') && ++at_);
      }
      expect('}');
    } else if (c == '[') {
      v.type = value::kind::array;
      ++at_;
      if (!next_is(']')) {
        do v.items.push_back(parse_value());
        while (next_is(',') && ++at_);
      }
      expect(']');
    } else if (c == '"') {
      v.type = value::kind::string;
      v.text = parse_string();
    } else if (text_.compare(at_, 4, "true") == 0 || text_.compare(at_, 5, "false") == 0) {
      v.type = value::kind::boolean;
      v.number = text_[at_] == 't';
      at_ += text_[at_] == 't' ? 4 : 5;
    } else if (text_.compare(at_, 4, "null") == 0) {
      at_ += 4;
    } else {
      std::size_t used = 0;
      try {
        v.number = std::stod(text_.substr(at_, 32), &used);
      } catch (const std::exception&) {
        fail("unexpected character");
      }
      v.type = value::kind::number;
      at_ += used;
    }
    return v;
  }

  std::string text_, path_;
  std::size_t at_ = 0;
};

/// file name -> its layers, in order.
inline std::map<std::string, std::vector<sidco::segment>> load_layers(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw sidco::error("sidco-eval: manifest '" + path + "': cannot open");
  std::stringstream text;
  text << in.rdbuf();
  const value root = parser(text.str(), path).parse();
  if (root.type != value::kind::object)
    throw sidco::error("sidco-eval: manifest '" + path + "': not a JSON object");
  std::map<std::string, std::vector<sidco::segment>> layouts;
  for (const auto& [file, entry] : root.fields) {
    const auto layers = entry.fields.find("layers");
    if (layers == entry.fields.end() || layers->second.type != value::kind::array)
      throw sidco::error("sidco-eval: manifest '" + path + "': '" + file + "' has no layers list");
    for (const auto& layer : layers->second.items) {
      const auto offset = layer.fields.find("offset"), size = layer.fields.find("size");
      if (offset == layer.fields.end() || size == layer.fields.end())
        throw sidco::error("sidco-eval: manifest '" + path + "': a layer of '" + file +
                           "' lacks offset or size");
      layouts[file].push_back({std::size_t(offset->second.number), std::size_t(size->second.number)});
    }
  }
  return layouts;
}

}  // namespace manifest
