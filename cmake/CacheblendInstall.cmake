# `cmake --install` (make install): the public header, libcacheblend.so with
# its SONAME links, the self-contained libcacheblend.a, cb_bench and
# rag_assistant, the CUDA plugin
# libcacheblend-cuda.so when built (component cuda), a CMake package
# (find_package(cacheblend) -> cacheblend::cacheblend, and
# cacheblend::cacheblend_static when its system libraries are found) and
# cacheblend.pc for pkg-config.  Everything is relocatable: the package and
# the .pc file find the prefix from their own location, so a tree installed
# with --prefix DIR works wherever DIR is.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CB_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cacheblend)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/abi/include/cacheblend
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS cacheblend EXPORT cacheblendTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# A separate export set: the static target needs system libraries that a
# user of the shared library should not have to install.
install(TARGETS cacheblend_static EXPORT cacheblendStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The two programs; they find libcacheblend.so (and so the CUDA plugin) in
# ../lib relative to themselves, wherever the prefix is moved.
set_target_properties(cb_bench rag_assistant PROPERTIES
                      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS cb_bench rag_assistant RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CUDA plugin, its own component (cmake --install BUILD --component cuda),
# beside libcacheblend.so where the core looks for it.  No link-time
# consumer: the core loads it at run time.
if(TARGET cacheblend_cuda)
  install(TARGETS cacheblend_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          NAMELINK_SKIP COMPONENT cuda)
endif()
install(EXPORT cacheblendTargets NAMESPACE cacheblend:: DESTINATION ${CB_INSTALL_CMAKEDIR})
install(EXPORT cacheblendStaticTargets NAMESPACE cacheblend:: DESTINATION ${CB_INSTALL_CMAKEDIR})

set(CB_CONFIG_REDIS_LIB "")
if(CB_WITH_REDIS)
  set(CB_CONFIG_REDIS_LIB hiredis)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cacheblendConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cacheblendConfig.cmake
                              INSTALL_DESTINATION ${CB_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cacheblendConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cacheblendConfig.cmake
              ${PROJECT_BINARY_DIR}/cacheblendConfigVersion.cmake
        DESTINATION ${CB_INSTALL_CMAKEDIR})

# pkg-config: the prefix relative to the .pc file's directory.
set(CB_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH CB_PC_TO_PREFIX /prefix/${CB_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" CB_PC_TO_PREFIX "${CB_PC_TO_PREFIX}")
set(CB_PC_DL_LIBS "")
foreach(lib IN LISTS CMAKE_DL_LIBS)
  string(APPEND CB_PC_DL_LIBS " -l${lib}")
endforeach()
# hiredis only where the Redis tier is built (CB_WITH_REDIS).
set(CB_PC_REDIS_LIBS "")
if(CB_WITH_REDIS)
  set(CB_PC_REDIS_LIBS " -lhiredis")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/cacheblend.pc.in ${PROJECT_BINARY_DIR}/cacheblend.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cacheblend.pc DESTINATION ${CB_PC_DIR})
