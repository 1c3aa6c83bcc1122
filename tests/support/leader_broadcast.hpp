// A transport as a follower sees it, for testing Leader SGD's pull on one backend without
// other ranks: broadcast() delivers what the leader would send (`leader`, floats as words)
// into the caller's memory through `copy` (memcpy on the host, cudaMemcpy to a device).
#pragma once

#include <gradcomp/memory.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

namespace support {

template <class Memory, class Copy>
struct leader_broadcast {
  using memory = Memory;
  std::vector<float> leader;  ///< what the root broadcasts
  Copy copy;                  ///< copy(from host, to the memory, bytes)
  int ranks = 2;

  [[nodiscard]] int size() const noexcept { return ranks; }
  [[nodiscard]] int rank() const noexcept { return 1; }
  void broadcast(gradcomp::span_in<Memory, std::uint32_t> data, int /*root*/) {
    if (data.size() != leader.size()) throw std::logic_error("leader_broadcast: another size than the leader's");
    copy(leader.data(), data.data(), 4 * data.size());
  }
};

/// x - strength (x - leader), element by element in float32: the pull as written out.
inline std::vector<float> pulled(const std::vector<float>& x, const std::vector<float>& leader, float strength) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] - strength * (x[i] - leader[i]);
  return out;
}

}  // namespace support
