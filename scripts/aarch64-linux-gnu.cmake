# CMake toolchain for cross-building to 64-bit Arm Linux with Debian's
# g++-aarch64-linux-gnu and the arm64 (multiarch) -dev packages, running the
# built programs (gtest discovery, ctest) under qemu-user.  Used by
# scripts/test_arm.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Libraries and CMake package files of the target live in the multiarch
# directories (/usr/lib/aarch64-linux-gnu); headers are shared in /usr/include.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)
# The loader and libc come from the arm64 multiarch libc6 (-L /): with the
# cross toolchain's own copy (-L /usr/aarch64-linux-gnu), qemu-user 7.2 hangs
# in pthread_create of dynamically linked programs on this host.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
