// A message in device memory accumulated by backend::host, which reads messages from
// host memory: refused at compile time, naming what to do instead.
#include <gradcomp/gradcomp.hpp>

#include <vector>

int main() {
  const gradcomp::device_message m;
  std::vector<float> dense(10);
  gradcomp::accumulate(gradcomp::backend::host{}, m.bytes(), dense, 1.0f);
  return static_cast<int>(dense.size());
}
