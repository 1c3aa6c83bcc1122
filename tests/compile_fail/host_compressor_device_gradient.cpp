// A gradient in device memory (a device_span) given to a compressor on backend::host,
// whose gradients are host memory (std::span): no compress() takes it.
#include <gradcomp/gradcomp.hpp>

#include <vector>

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, gradcomp::select::exact_topk{.density = 0.5}};
  std::vector<float> grad(10);
  std::vector<std::byte> out(c.max_message_bytes());
  const gradcomp::device_span<const float> on_device(grad.data(), grad.size());
  return static_cast<int>(c.compress(on_device, out).count());
}
