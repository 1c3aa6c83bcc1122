// A message in device memory (what backend::cuda's compress returns) handed to the host's
// decode(): its bytes are a device_span, which the host's reader refuses at compile time,
// naming the call that can decode it (it used to read device addresses on the host).
#include <gradcomp/gradcomp.hpp>

int main() {
  const gradcomp::device_message m;
  const gradcomp::sparse_vector s = gradcomp::decode(m.bytes());
  return static_cast<int>(s.n);
}
