# Finds Kokkos for gradcomp's Kokkos backend and defines the imported target
# gradcomp_kokkos_dependency, plus GRADCOMP_KOKKOS_FOUND.
#
# A standard Kokkos install (3.x built with CMake, 4.x, 5.x) provides Kokkos::kokkos.
# Debian's Trilinos packages (libtrilinos-kokkos-dev, Kokkos 3.4.1) also install a
# KokkosConfig.cmake, but its Kokkos::kokkos target points at /usr/include and at
# targets it never defines; for it we use KokkosCore's trilinos_kokkoscore target and
# add the header directory ourselves.
include_guard(GLOBAL)
set(GRADCOMP_KOKKOS_FOUND FALSE)

if(NOT TARGET gradcomp_kokkos_dependency)
  # Debian's (Trilinos) Kokkos refuses GNU extensions and would force them off with a
  # warning; gradcomp needs standard C++20 anyway, so say it here, once, plainly.
  if(NOT DEFINED CMAKE_CXX_EXTENSIONS)
    message(STATUS "gradcomp: building with CMAKE_CXX_EXTENSIONS OFF (-std=c++20), as Kokkos requires")
    set(CMAKE_CXX_EXTENSIONS OFF)
  endif()
  set(_gradcomp_kokkos_link "")
  find_package(Kokkos QUIET CONFIG)
  if(Kokkos_FOUND AND TARGET Kokkos::kokkos)
    get_target_property(_gradcomp_kokkos_links Kokkos::kokkos INTERFACE_LINK_LIBRARIES)
    if(NOT _gradcomp_kokkos_links MATCHES "trilinos_kokkoscore")
      set(_gradcomp_kokkos_link Kokkos::kokkos)
    endif()
  endif()
  if(NOT _gradcomp_kokkos_link)
    find_package(KokkosCore QUIET CONFIG)
    find_path(GRADCOMP_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos)
    if(KokkosCore_FOUND AND TARGET trilinos_kokkoscore AND GRADCOMP_KOKKOS_INCLUDE_DIR)
      set(_gradcomp_kokkos_link trilinos_kokkoscore)
    endif()
  endif()
  if(_gradcomp_kokkos_link)
    add_library(gradcomp_kokkos_dependency INTERFACE IMPORTED GLOBAL)
    set_property(TARGET gradcomp_kokkos_dependency PROPERTY INTERFACE_LINK_LIBRARIES ${_gradcomp_kokkos_link})
    if(GRADCOMP_KOKKOS_INCLUDE_DIR AND _gradcomp_kokkos_link STREQUAL "trilinos_kokkoscore")
      set_property(TARGET gradcomp_kokkos_dependency PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${GRADCOMP_KOKKOS_INCLUDE_DIR})
    endif()
  endif()
endif()

if(TARGET gradcomp_kokkos_dependency)
  set(GRADCOMP_KOKKOS_FOUND TRUE)
endif()
