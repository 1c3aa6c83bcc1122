# Builds one libFuzzer target (fuzz/${TARGET}.cpp) with clang and the address and
# undefined behaviour sanitizers, then fuzzes it for SECONDS seconds from its committed
# seed corpus (CORPUS, a directory under fuzz/; none for targets that start empty).
#   -DCLANGXX=<clang++> -DSOURCE=<gradcomp source> -DWORK=<scratch dir> -DTARGET=<name>
#   -DSECONDS=<n> [-DCORPUS=<dir>]
file(MAKE_DIRECTORY ${WORK}/new_inputs)
execute_process(COMMAND ${CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
                        -fno-sanitize-recover=undefined -I${SOURCE}/include ${SOURCE}/fuzz/${TARGET}.cpp
                        -o ${WORK}/${TARGET} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building ${TARGET} failed (needs clang and libclang-rt-14-dev)")
endif()
set(corpus)
if(CORPUS)
  set(corpus ${SOURCE}/fuzz/${CORPUS})
endif()
# New inputs go to a scratch directory; the committed corpus is only read.
execute_process(COMMAND ${WORK}/${TARGET} -max_total_time=${SECONDS} -rss_limit_mb=2048 -print_final_stats=1
                        -artifact_prefix=${WORK}/ ${WORK}/new_inputs ${corpus} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "${TARGET} found a failing input (see ${WORK}/crash-* or leak-*)")
endif()
