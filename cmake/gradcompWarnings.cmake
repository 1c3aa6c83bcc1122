# Warnings for gradcomp's own targets (tests, tools, examples, benchmarks). Consumers
# of the INTERFACE target never get these flags.
add_library(gradcomp_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(gradcomp_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                                     -Wno-sign-conversion -Werror
                                                     -Wno-restrict)  # GCC 12 false positives in std::string (PR 105329)
endif()
