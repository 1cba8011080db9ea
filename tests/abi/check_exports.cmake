# cmake -DLIB=path/to/libcacheblend.so -P check_exports.cmake
# Fails unless every dynamic symbol the library defines starts with "cb_"
# (and the API's entry points are there).
if(NOT LIB)
  message(FATAL_ERROR "pass -DLIB=<shared library>")
endif()
find_program(NM nm REQUIRED)
execute_process(COMMAND ${NM} -D --defined-only ${LIB}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(bad "")
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  # "<address> <type> <name>[@version]".  Local text and data (t, d, b, r:
  # the library's own operator new, which the version script makes local)
  # bind nothing outside the library.
  if(line MATCHES "^[0-9a-fA-F]* +[tdbr] ")
    continue()
  endif()
  string(REGEX REPLACE "^[0-9a-fA-F]* *[A-Za-z] +" "" name "${line}")
  if(NOT name MATCHES "^cb_")
    list(APPEND bad "${line}")
  else()
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad_text "${bad}")
  message(FATAL_ERROR "libcacheblend exports symbols outside the API:\n  ${bad_text}")
endif()
foreach(required cb_version cb_last_error cb_model_load cb_session_create cb_generate
                 cb_session_logits cb_chunk_cache_create cb_rag_prefill cb_chunk_cache_add
                 cb_chunk_cache_contains)
  if(NOT out MATCHES "[ \n]${required}\n")
    message(FATAL_ERROR "${required} is not exported from ${LIB}")
  endif()
endforeach()
message(STATUS "${count} exported symbols, all cb_*")
