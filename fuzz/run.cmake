# Builds fuzz/decode_fuzzer.cpp with clang's libFuzzer and the address and undefined
# behaviour sanitizers, then fuzzes for SECONDS seconds from the committed seed corpus.
#   -DCLANGXX=<clang++> -DSOURCE=<gradcomp source> -DWORK=<scratch dir> -DSECONDS=<n>
file(MAKE_DIRECTORY ${WORK}/new_inputs)
execute_process(COMMAND ${CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
                        -fno-sanitize-recover=undefined -I${SOURCE}/include ${SOURCE}/fuzz/decode_fuzzer.cpp
                        -o ${WORK}/decode_fuzzer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the fuzzer failed (needs clang and libclang-rt-14-dev)")
endif()
# New inputs go to a scratch directory; the committed corpus is only read.
execute_process(COMMAND ${WORK}/decode_fuzzer -max_total_time=${SECONDS} -rss_limit_mb=2048 -print_final_stats=1
                        -artifact_prefix=${WORK}/ ${WORK}/new_inputs ${SOURCE}/fuzz/corpus RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the fuzzer found a failing input (see ${WORK}/crash-* or leak-*)")
endif()
