// Errors: retort::Error for anything a caller can get wrong, RT_ASSERT for internal invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace retort {

// Thrown for bad input (shapes, dtypes, options, files). The message names the op or file and the fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace retort

// Checks a condition on user input; throws retort::Error with the streamed message parts.
#define RT_CHECK(cond, ...)                                                 \
  do {                                                                      \
    if (!(cond)) ::retort::detail::throw_error(::retort::detail::concat(__VA_ARGS__)); \
  } while (0)

// Throws retort::Error unconditionally with the streamed message parts.
#define RT_FAIL(...) ::retort::detail::throw_error(::retort::detail::concat(__VA_ARGS__))

// Internal invariant: a failure is a retort bug; the message names file and line. Never aborts.
#define RT_ASSERT(cond)                                                            \
  do {                                                                             \
    if (!(cond)) ::retort::detail::throw_internal(__FILE__, __LINE__, #cond, ""); \
  } while (0)
