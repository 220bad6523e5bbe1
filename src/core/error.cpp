#include "error.h"

namespace retort::detail {

void throw_error(const std::string& msg) { throw Error(msg); }

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(concat("retort internal error at ", file, ":", line, ": assertion `", cond, "` failed",
                     msg.empty() ? "" : ": ", msg, " (please report this)"));
}

}  // namespace retort::detail
