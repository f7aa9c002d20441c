// doctest as the tests include it: C strings in failure messages printed as text. doctest 2.4
// prints a const char* as its address (INFO(method) showed "0x55b6962d9639", not the name),
// and its DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING does not compile in Debian's 2.4.9 (and
// would compare char pointers by strcmp). Comparisons stay pointer comparisons.
#pragma once

#include <doctest/doctest.h>

template <>
struct doctest::StringMaker<const char*> {
  static doctest::String convert(const char* text) { return text ? text : "(null)"; }
};
template <>
struct doctest::StringMaker<char*> {
  static doctest::String convert(const char* text) { return text ? text : "(null)"; }
};
