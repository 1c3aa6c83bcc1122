// A program outside the gradcomp tree: compress, decode, check.
#include <gradcomp/gradcomp.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> grad(1000);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 17) - 8.0f;
  gradcomp::compressor c{gradcomp::backend::host{}, grad.size(), gradcomp::select::exact_topk{.count = 5},
                         gradcomp::correct::error_feedback{}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto sent = gradcomp::decode(c.compress(grad, buf).bytes());
  std::printf("gradcomp %d: sent %zu entries\n", GRADCOMP_VERSION, sent.indices.size());
  return sent.indices.size() == 5 ? 0 : 1;
}
