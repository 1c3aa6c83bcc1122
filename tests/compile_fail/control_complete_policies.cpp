// Control for the compile-fail tests: the same harness accepts a complete configuration,
// so a failure above is the missing member and not a broken command line.
#include <gradcomp/gradcomp.hpp>

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, gradcomp::select::exact_topk{.density = 0.5},
                         gradcomp::correct::none{}, gradcomp::encode::index_value{}};
  (void)c;
}
