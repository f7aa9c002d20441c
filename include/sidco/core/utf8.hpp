// Text that crosses ranks (a peer's error message) as valid UTF-8: a message cut to a fixed
// room, or bytes that are not text, must still read as a message on every rank (Python makes
// an exception whose message is not UTF-8 into an empty one).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sidco::detail {

/// The longest prefix of text, at most max_bytes long, that does not end inside a UTF-8
/// sequence.
inline std::string_view utf8_prefix(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::size_t cut = max_bytes;
  // The first byte left out continues a sequence: leave that sequence out whole.
  for (int back = 0; back < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++back) --cut;
  if (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) cut = max_bytes;  // not UTF-8 anyway
  return text.substr(0, cut);
}

/// text, with every byte that does not start a well-formed UTF-8 sequence (RFC 3629: no
/// overlong forms, surrogates or code points above U+10FFFF) and every control character
/// other than tab and newline replaced by U+FFFD.
inline std::string valid_utf8(std::string_view text) {
  static constexpr std::string_view replacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(text[j]); };
    const unsigned char lead = byte(i);
    std::size_t length = 0;
    char32_t code = 0, least = 0;
    if (lead < 0x80) length = 1, code = lead;
    else if ((lead & 0xE0) == 0xC0) length = 2, code = lead & 0x1F, least = 0x80;
    else if ((lead & 0xF0) == 0xE0) length = 3, code = lead & 0x0F, least = 0x800;
    else if ((lead & 0xF8) == 0xF0) length = 4, code = lead & 0x07, least = 0x10000;
    bool ok = length > 0 && i + length <= text.size();
    for (std::size_t j = 1; ok && j < length; ++j) {
      ok = (byte(i + j) & 0xC0) == 0x80;
      code = (code << 6) | (byte(i + j) & 0x3F);
    }
    ok = ok && code >= least && code <= 0x10FFFF && !(code >= 0xD800 && code <= 0xDFFF);
    ok = ok && !(code < 0x20 && code != '\t' && code != '\n') && code != 0x7F;
    if (ok) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out.append(replacement);
      ++i;
    }
  }
  return out;
}

}  // namespace sidco::detail
