// Control for the compile-fail tests: the same harness accepts a complete configuration,
// and a user's selector whose engine keeps the whole contract (user_selector.hpp), so a
// failure of the others is the missing piece and not a broken command line.
#include "user_selector.hpp"

#include <sstream>

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, gradcomp::select::exact_topk{.density = 0.5},
                         gradcomp::correct::none{}, gradcomp::encode::index_value{}};
  (void)c;
  gradcomp::compressor user{gradcomp::backend::host{}, 10, first_entries{}, gradcomp::correct::error_feedback{}};
  user.set_density(0.25);
  std::stringstream state;
  user.save_state(state);
  user.load_state(state);
}
