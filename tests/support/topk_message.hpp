// The messages the NCCL tests exchange: a host compressor's exact top-k of a gradient,
// raw32 indices and f32 values, and the same message broken where its reader must
// refuse it.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <vector>

namespace support {

inline std::vector<std::byte> topk_message(const std::vector<float>& x, double density) {
  gradcomp::compressor c{gradcomp::backend::host{}, x.size(), gradcomp::select::exact_topk{.density = density},
                         gradcomp::correct::none{},
                         gradcomp::encode::index_value{.index = gradcomp::index_coding::raw32}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(x, buf);
  return {m.bytes().begin(), m.bytes().end()};
}

// `message` (topk_message()'s, two entries or more) with its second index far past any n.
inline std::vector<std::byte> with_second_index_broken(std::vector<std::byte> message) {
  for (std::size_t b = 60; b < 64; ++b) message[b] = std::byte{0xFF};
  return message;
}

}  // namespace support
