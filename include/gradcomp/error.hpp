/// \file error.hpp
/// The single exception type of gradcomp and the precondition checks that raise it.
#pragma once

#include <gradcomp/config.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// What kind of failure a gradcomp::error reports.
enum class errc {
  invalid_argument,  ///< a parameter is outside its documented domain
  buffer_too_small,  ///< an output buffer cannot hold the result
  non_finite,        ///< a gradient (or accumulated value) is NaN or infinite
  corrupt_message,   ///< a message or saved state failed validation
  io,                ///< a stream could not be read or written
  device,            ///< the GPU runtime reported an error (backend::cuda)
};

/// Short, stable name of an error code ("invalid_argument", ...).
constexpr const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::buffer_too_small:
      return "buffer_too_small";
    case errc::non_finite:
      return "non_finite";
    case errc::corrupt_message:
      return "corrupt_message";
    case errc::io:
      return "io";
    case errc::device:
      return "device";
  }
  return "unknown";
}

/// Thrown by every gradcomp function that rejects its input. The message names the
/// offending parameter and its value; the call that threw changed no output and no state.
class error : public std::runtime_error {
 public:
  /// An error of `code` whose message is "gradcomp: " followed by `what`.
  error(errc code, const std::string& what) : std::runtime_error("gradcomp: " + what), code_(code) {}
  /// The category of the failure.
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

namespace detail {

/// Builds the message from streamable pieces only when the check fails, so the
/// success path of hot calls pays for one comparison and nothing else.
template <class... Parts>
[[noreturn]] void fail(errc code, Parts&&... parts) {
  std::ostringstream text;
  text.precision(17);
  (text << ... << std::forward<Parts>(parts));
  throw error(code, text.str());
}

template <class... Parts>
void require(bool condition, errc code, Parts&&... parts) {
  if (!condition) fail(code, std::forward<Parts>(parts)...);
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
