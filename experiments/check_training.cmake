# Runs train_fashion_mnist briefly with every method on 2 ranks and checks the table:
# a row per method, and the models of dense and dgc well above chance (10%).
# Usage: cmake -DMPIEXEC=... -DEXE=... -DDATA=... -P check_training.cmake
execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${EXE} --method all --epochs 2 --train-limit 12000
                        --test-limit 2000 --data ${DATA}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_fashion_mnist exited with ${rc}")
endif()
foreach(method dense topk topk_ef dgc adacomp scalecom randomk_ef dagc ok_topk)
  if(NOT out MATCHES "\n${method} +([0-9.]+)%")
    message(FATAL_ERROR "no result row for ${method}")
  endif()
  set(accuracy_${method} ${CMAKE_MATCH_1})
endforeach()
foreach(method dense dgc)
  if(accuracy_${method} LESS 70)
    message(FATAL_ERROR "${method} reached only ${accuracy_${method}}% test accuracy (expected > 70%)")
  endif()
endforeach()
# A rejected flag is an error that names it.
execute_process(COMMAND ${MPIEXEC} -n 1 ${EXE} --method nonsense --data ${DATA} ERROR_VARIABLE err RESULT_VARIABLE rc
                OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--method: unknown method 'nonsense'")
  message(FATAL_ERROR "an unknown method was not rejected clearly: ${err}")
endif()
