# Installs the build tree into a fresh prefix and builds and runs the
# consumer program (tests/abi/consumer) against it, the way an application
# would:
#   MODE=cmake     find_package(cacheblend), cacheblend::cacheblend (shared)
#   MODE=static    find_package(cacheblend COMPONENTS static),
#                  cacheblend::cacheblend_static
#   MODE=pkgconfig cc main.c $(pkg-config --cflags --libs cacheblend)
# cmake -DMODE= -DBUILD_DIR= -DWORK_DIR= -DCONSUMER_DIR= -DMODEL= -DVERSION=
#       -DN_LAYER= -DCC= [-DSAN_FLAGS=] -P install_consumer.cmake
# $CB_MODEL, when set, replaces MODEL (its layer count is then not known).
cmake_minimum_required(VERSION 3.25)  # script mode: set the policies (CMP0054)
foreach(v MODE BUILD_DIR WORK_DIR CONSUMER_DIR MODEL VERSION N_LAYER CC)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
if(DEFINED ENV{CB_MODEL} AND NOT "$ENV{CB_MODEL}" STREQUAL "" AND NOT "$ENV{CB_MODEL}" STREQUAL "${MODEL}")
  set(MODEL "$ENV{CB_MODEL}")
  set(N_LAYER 0)
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# The layout an application relies on.
file(GLOB pc_files ${prefix}/lib*/pkgconfig/cacheblend.pc ${prefix}/lib/*/pkgconfig/cacheblend.pc)
if(NOT pc_files)
  message(FATAL_ERROR "no cacheblend.pc under ${prefix}")
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir ${pc_file} DIRECTORY)
get_filename_component(libdir ${pc_dir} DIRECTORY)
string(REGEX MATCH "^[0-9]+" major "${VERSION}")
foreach(f include/cacheblend/cacheblend.h ${libdir}/libcacheblend.so.${VERSION}
          ${libdir}/libcacheblend.a ${libdir}/cmake/cacheblend/cacheblendConfig.cmake
          ${libdir}/cmake/cacheblend/cacheblendConfigVersion.cmake)
  if(NOT IS_ABSOLUTE ${f})
    set(f ${prefix}/${f})
  endif()
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# SONAME links: libcacheblend.so -> libcacheblend.so.MAJOR -> the real file.
foreach(pair "libcacheblend.so;libcacheblend.so.${major}"
             "libcacheblend.so.${major};libcacheblend.so.${VERSION}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK ${libdir}/${link})
    message(FATAL_ERROR "${libdir}/${link} is not a symbolic link")
  endif()
  file(READ_SYMLINK ${libdir}/${link} dest)
  if(NOT dest STREQUAL target)
    message(FATAL_ERROR "${libdir}/${link} points to ${dest}, not ${target}")
  endif()
endforeach()

# The CUDA plugin beside the library when the build has one.
if(EXISTS ${BUILD_DIR}/lib/libcacheblend-cuda.so.${VERSION} AND
   NOT EXISTS ${libdir}/libcacheblend-cuda.so.${major})
  message(FATAL_ERROR "the CUDA plugin was built but not installed in ${libdir}")
endif()

# The installed programs find the library from their own location, with no
# LD_LIBRARY_PATH.
if(MODE STREQUAL "cmake")
  foreach(program cb_bench rag_assistant)
    if(NOT EXISTS ${prefix}/bin/${program})
      message(FATAL_ERROR "not installed: ${prefix}/bin/${program}")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ldd ${prefix}/bin/cb_bench)
  file(RELATIVE_PATH rel_libdir ${prefix} ${libdir})
  if(NOT run_out MATCHES "libcacheblend\\.so\\.${major} => ${prefix}/bin/\\.\\./${rel_libdir}/")
    message(FATAL_ERROR "the installed cb_bench does not load the installed library:\n${run_out}")
  endif()
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/cb_bench generate
      --model ${MODEL} --threads 2 --prompt "The capital of France is" --max-tokens 3)
  if(NOT run_out MATCHES "Paris")
    message(FATAL_ERROR "the installed cb_bench did not continue with Paris:\n${run_out}")
  endif()
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/rag_assistant --help)
endif()

set(exe ${WORK_DIR}/consumer)
if(MODE STREQUAL "cmake" OR MODE STREQUAL "static")
  set(link_static OFF)
  if(MODE STREQUAL "static")
    set(link_static ON)
  endif()
  # The consumer's own cache and build: no CMAKE_PREFIX_PATH or flags leak in
  # from the project's build.
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_C_COMPILER=${CC} -DCMAKE_PREFIX_PATH=${prefix} -DCONSUMER_STATIC=${link_static}
      "-DCMAKE_C_FLAGS=${SAN_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${SAN_FLAGS}"
      -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  set(exe ${WORK_DIR}/build/consumer)
elseif(MODE STREQUAL "pkgconfig")
  find_program(PKG_CONFIG pkg-config REQUIRED)
  run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} sh -c
      "${CC} -std=c99 -pedantic -Wall -Wextra -Werror ${SAN_FLAGS} \"$0\" -o \"$1\" $(${PKG_CONFIG} --cflags --libs cacheblend)"
      ${CONSUMER_DIR}/main.c ${exe})
  run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} ${PKG_CONFIG} --modversion cacheblend)
  string(STRIP "${run_out}" pc_version)
  if(NOT pc_version STREQUAL VERSION)
    message(FATAL_ERROR "pkg-config says version ${pc_version}, expected ${VERSION}")
  endif()
else()
  message(FATAL_ERROR "unknown MODE ${MODE}")
endif()

# Statically linked: the program must not need libcacheblend.so; else it
# must load it from the prefix (not from the build tree).
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ldd ${exe})
if(MODE STREQUAL "static")
  if(run_out MATCHES "libcacheblend")
    message(FATAL_ERROR "the static consumer needs libcacheblend.so:\n${run_out}")
  endif()
elseif(NOT run_out MATCHES "libcacheblend\\.so\\.${major} => ${libdir}/")
  message(FATAL_ERROR "the consumer does not load libcacheblend.so.${major} from ${libdir}:\n${run_out}")
endif()
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${exe} ${MODEL} ${VERSION} ${N_LAYER})
message(STATUS "${MODE}: ${run_out}")
if(NOT run_out MATCHES "n_layer [0-9]+")
  message(FATAL_ERROR "the consumer printed no n_layer:\n${run_out}")
endif()
