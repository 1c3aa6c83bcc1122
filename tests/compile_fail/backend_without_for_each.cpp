// A backend that allocates but has no for_each primitive: the compressor names it.
#include <gradcomp/gradcomp.hpp>

#include <vector>

struct backend_without_for_each {
  template <class T>
  using buffer = std::vector<T>;
  template <class T>
  buffer<T> allocate(std::size_t n) const {
    return buffer<T>(n);
  }
};

int main() {
  gradcomp::compressor c{backend_without_for_each{}, 10, gradcomp::select::exact_topk{.density = 0.5}};
  return static_cast<int>(c.size());
}
