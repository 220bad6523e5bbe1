// expect_error: runs f and expects a retort::Error whose message contains every one of the given parts;
// error_of: the message itself.
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

// The message of the retort::Error that f throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected retort::Error, got " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected retort::Error, nothing was thrown";
  return "";
}

}  // namespace retort::test
