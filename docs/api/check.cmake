# Builds the API reference and fails on any Doxygen warning: an undocumented public
# entity, or a broken documentation comment.
#   -DDOXYGEN=<doxygen> -DCONFIG=<Doxyfile> -DWARNINGS=<the warnings file it writes>
file(REMOVE ${WARNINGS})
execute_process(COMMAND ${DOXYGEN} ${CONFIG} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "doxygen failed (${rc})")
endif()
file(READ ${WARNINGS} warnings)
if(NOT warnings STREQUAL "")
  message(FATAL_ERROR "the API reference has warnings (document every public entity with ///):\n${warnings}")
endif()
