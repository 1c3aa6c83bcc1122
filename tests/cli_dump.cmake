# `gradcomp eval --dump` writes, per step, exactly the files numpy writes for the
# reference top-k (tests/data/expected_topk_*, made with numpy.lexsort and numpy.save);
# a dumped file reads back as input.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CLI} eval --input ${DATA}/stream_3x1000.npy --density 0.01 --methods topk --dump ${WORK}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "eval --dump failed")
endif()
foreach(t 0000 0001 0002)
  foreach(part indices values)
    set(got ${WORK}/topk/step_${t}_${part}.npy)
    set(want ${DATA}/expected_topk_step_${t}_${part}.npy)
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${got} ${want} RESULT_VARIABLE differ)
    if(differ)
      message(FATAL_ERROR "${got} differs from numpy's ${want}")
    endif()
  endforeach()
endforeach()
execute_process(COMMAND ${CLI} eval --input ${WORK}/topk/step_0000_values.npy --density 0.5 RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "a dumped file does not read back")
endif()
