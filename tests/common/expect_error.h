// expect_error: runs f and expects a retort::Error whose message contains every one of the given parts.
#pragma once
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "retort.h"

namespace retort::test {

template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected retort::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

}  // namespace retort::test
