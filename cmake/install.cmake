# Writes the CMake package files of an install prefix (run by scripts/install.sh):
#   cmake -DPREFIX=... -DDFLASH2_LLAMA_PREFIX=... -DVERSION=... -P cmake/install.cmake
include(CMakePackageConfigHelpers)

foreach(var PREFIX DFLASH2_LLAMA_PREFIX VERSION)
    if(NOT DEFINED ${var})
        message(FATAL_ERROR "install.cmake needs -D${var}=...")
    endif()
endforeach()

set(pkg_dir "${PREFIX}/lib/cmake/dflash2")
file(MAKE_DIRECTORY "${pkg_dir}")
configure_file("${CMAKE_CURRENT_LIST_DIR}/dflash2Config.cmake.in" "${pkg_dir}/dflash2Config.cmake" @ONLY)
write_basic_package_version_file("${pkg_dir}/dflash2ConfigVersion.cmake"
    VERSION "${VERSION}"
    COMPATIBILITY SameMinorVersion)

# pkg-config, for C builds that do not use CMake
file(MAKE_DIRECTORY "${PREFIX}/lib/pkgconfig")
configure_file("${CMAKE_CURRENT_LIST_DIR}/dflash2.pc.in" "${PREFIX}/lib/pkgconfig/dflash2.pc" @ONLY)
