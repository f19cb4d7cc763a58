# devmr's GPU architectures (docs/architectures.md): the oldest one its device code supports, the
# ones the library's own device code is built for by default, and checks of CUDA_ARCHITECTURES
# lists against them. devmr's CMakeLists.txt includes this file, and so does the installed
# package's devmrConfig.cmake.

# Compute capability 8.0 (Ampere): the device code's warp reductions (__reduce_or_sync) need it.
# include/devmr/detail/config.hpp stops the device compilation of any older one with an #error
# (DEVMR_MINIMUM_CUDA_ARCH, the same number times 10).
set(DEVMR_MINIMUM_CUDA_ARCHITECTURE 80)

# What the library's own device code (device/slab_heap.cu) is built for when devmr is built on its
# own and nobody names architectures: real code for every major architecture from 8.0 that CUDA 13
# supports (8.0 also runs on 8.6, 8.7, 8.8 and 8.9; 10.0 on 10.3; 12.0 on 12.1), and PTX of the
# newest, which the driver compiles for GPUs newer than all of them.
set(DEVMR_DEFAULT_CUDA_ARCHITECTURES "80-real;90-real;100-real;110-real;120")

# devmr_expand_cuda_architectures(<out> <list>): the entries that a CUDA_ARCHITECTURES value
# stands for: "all", "all-major" and "native" as CMake expands them (nothing when unknown); OFF
# and the empty list give nothing.
function(devmr_expand_cuda_architectures out list)
  set(entries "")
  foreach(entry IN LISTS list)
    if(entry STREQUAL "all")
      list(APPEND entries ${CMAKE_CUDA_ARCHITECTURES_ALL})
    elseif(entry STREQUAL "all-major")
      list(APPEND entries ${CMAKE_CUDA_ARCHITECTURES_ALL_MAJOR})
    elseif(entry STREQUAL "native")
      list(APPEND entries ${CMAKE_CUDA_ARCHITECTURES_NATIVE})
    elseif(NOT entry STREQUAL "OFF")
      list(APPEND entries ${entry})
    endif()
  endforeach()
  set(${out} "${entries}" PARENT_SCOPE)
endfunction()

# devmr_check_cuda_architectures(<out> <name> <list>): sets <out> to an error message naming
# <name> when <list> holds an architecture below DEVMR_MINIMUM_CUDA_ARCHITECTURE, else to "".
function(devmr_check_cuda_architectures out name list)
  devmr_expand_cuda_architectures(entries "${list}")
  set(below "")
  foreach(entry IN LISTS entries)
    if(entry MATCHES "^([0-9]+)[a-z]?(-real|-virtual)?$"
       AND CMAKE_MATCH_1 LESS DEVMR_MINIMUM_CUDA_ARCHITECTURE)
      list(APPEND below ${entry})
    endif()
  endforeach()
  set(message "")
  if(below)
    list(JOIN below ", " below_text)
    set(minimum ${DEVMR_MINIMUM_CUDA_ARCHITECTURE})
    math(EXPR major "${minimum} / 10")
    math(EXPR minor "${minimum} % 10")
    string(CONCAT message
      "devmr: ${name} is \"${list}\", which holds GPU architectures older than devmr supports "
      "(${below_text}). devmr's device code needs compute capability ${major}.${minor} or newer "
      "(sm_${minimum} and up: Ampere, Ada, Hopper, Blackwell). Name architectures from "
      "${minimum} up, for example -D${name}=90 or -D${name}=native. (CMake takes nvcc's "
      "default, 75 with CUDA 13, when a project names none.) docs/architectures.md in devmr's "
      "sources lists the supported GPUs.")
  endif()
  set(${out} "${message}" PARENT_SCOPE)
endfunction()

# devmr_uncovered_cuda_architectures(<out> <wanted> <built>): the real architectures in <wanted>
# that no code in <built> runs on: real code runs on its own major version at the same or a newer
# minor one (arch-specific "a" code on its own architecture only), PTX on the same or a newer
# architecture. PTX-only entries of <wanted> and lists that are not known here ("native" where no
# GPU was found, OFF) are not checked.
function(devmr_uncovered_cuda_architectures out wanted built)
  devmr_expand_cuda_architectures(wanted_entries "${wanted}")
  devmr_expand_cuda_architectures(built_entries "${built}")
  set(uncovered "")
  if(built_entries)
    foreach(w IN LISTS wanted_entries)
      if(NOT w MATCHES "^([0-9]+)[a-z]?(-real|-virtual)?$" OR CMAKE_MATCH_2 STREQUAL "-virtual")
        continue()
      endif()
      set(w_arch ${CMAKE_MATCH_1})
      math(EXPR w_major "${w_arch} / 10")
      set(served OFF)
      foreach(b IN LISTS built_entries)
        if(NOT b MATCHES "^([0-9]+)([a-z]?)(-real|-virtual)?$")
          continue()
        endif()
        set(b_arch ${CMAKE_MATCH_1})
        set(b_variant "${CMAKE_MATCH_2}")
        set(b_kind "${CMAKE_MATCH_3}")
        math(EXPR b_major "${b_arch} / 10")
        if(NOT b_kind STREQUAL "-virtual")  # real code
          if(b_variant STREQUAL "a")
            if(b_arch EQUAL w_arch)
              set(served ON)
            endif()
          elseif(b_major EQUAL w_major AND b_arch LESS_EQUAL w_arch)
            set(served ON)
          endif()
        endif()
        if(NOT b_kind STREQUAL "-real" AND b_variant STREQUAL "" AND b_arch LESS_EQUAL w_arch)
          set(served ON)  # PTX, compiled by the driver
        endif()
      endforeach()
      if(NOT served)
        list(APPEND uncovered ${w})
      endif()
    endforeach()
  endif()
  set(${out} "${uncovered}" PARENT_SCOPE)
endfunction()
