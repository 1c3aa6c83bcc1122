// What the fuzz targets share: a compressor's checkpoint as a string, to compare a state
// before and after a call, and whether its memory is finite.
#pragma once

#include <cmath>
#include <sstream>
#include <string>

namespace fuzz {

template <class Compressor>
std::string state_of(const Compressor& c) {
  std::ostringstream out;
  c.save_state(out);
  return out.str();
}

template <class Compressor>
bool memory_is_finite(const Compressor& c) {
  for (std::size_t a = 0; a != Compressor::corrector_type::state_arrays; ++a) {
    for (const float v : c.corrector_state(a)) {
      if (!std::isfinite(v)) return false;
    }
  }
  return true;
}

}  // namespace fuzz
