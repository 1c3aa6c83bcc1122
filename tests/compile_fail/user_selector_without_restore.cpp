// Must not compile: the engine of a user's selector lacks restore_state(), though it
// saves state. The diagnostic names it.
#define USER_SELECTOR_NO_RESTORE
#include "user_selector.hpp"

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, first_entries{}};
  (void)c;
}
