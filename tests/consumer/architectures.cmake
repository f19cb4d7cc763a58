# Checks cmake/devmrArchitectures.cmake, the GPU-architecture checks that devmr's build and its
# installed package run at configure time, in CMake's script mode (no compiler needed), and that
# its minimum matches the one the headers check (include/devmr/detail/config.hpp).
# Usage: cmake -DDEVMR_SOURCE_DIR=<devmr's sources> -P tests/consumer/architectures.cmake
cmake_minimum_required(VERSION 3.25)
include(${DEVMR_SOURCE_DIR}/cmake/devmrArchitectures.cmake)

set(failures 0)
macro(expect_error list wanted)
  devmr_check_cuda_architectures(problem CMAKE_CUDA_ARCHITECTURES "${list}")
  if(${wanted} AND NOT problem)
    message(SEND_ERROR "\"${list}\": expected an error, got none")
    math(EXPR failures "${failures} + 1")
  elseif(NOT ${wanted} AND problem)
    message(SEND_ERROR "\"${list}\": unexpected error: ${problem}")
    math(EXPR failures "${failures} + 1")
  endif()
endmacro()
macro(expect_uncovered wanted built expected)
  devmr_uncovered_cuda_architectures(uncovered "${wanted}" "${built}")
  if(NOT "${uncovered}" STREQUAL "${expected}")
    message(SEND_ERROR
      "code for \"${built}\" on \"${wanted}\": uncovered \"${uncovered}\", expected \"${expected}\"")
    math(EXPR failures "${failures} + 1")
  endif()
endmacro()

# The minimum: numbered entries, CMake's keywords, and what is not known here.
set(CMAKE_CUDA_ARCHITECTURES_ALL "75-real;80-real;86-real;90")
set(CMAKE_CUDA_ARCHITECTURES_ALL_MAJOR "80-real;90")
set(CMAKE_CUDA_ARCHITECTURES_NATIVE "")
expect_error("75" ON)
expect_error("75-real;90" ON)
expect_error("70-virtual" ON)
expect_error("all" ON)
expect_error("80" OFF)
expect_error("80-real;90-real;100-real;110-real;120" OFF)
expect_error("${DEVMR_DEFAULT_CUDA_ARCHITECTURES}" OFF)
expect_error("90a-real;100f" OFF)
expect_error("all-major" OFF)
expect_error("native" OFF)
expect_error("OFF" OFF)
expect_error("" OFF)

# Coverage: real code runs on later minor versions of its major one, PTX on anything as new.
set(default "${DEVMR_DEFAULT_CUDA_ARCHITECTURES}")
expect_uncovered("80;86-real;89;90;100;103;110;120;121-real" "${default}" "")
expect_uncovered("130" "${default}" "")  # compute_120 PTX, compiled by the driver
expect_uncovered("90" "90" "")
expect_uncovered("100" "90" "")  # compute_90 PTX
expect_uncovered("100" "90-real" "100")
expect_uncovered("89-real;90" "90" "89-real")
expect_uncovered("86" "80-real" "")
expect_uncovered("80" "86-real" "80")
expect_uncovered("90a-real" "90a-real" "")
expect_uncovered("90-real;100" "90a-real" "100")  # 90a code runs on 9.0 GPUs only
expect_uncovered("90-virtual" "80-real" "")  # PTX-only consumers are not checked
expect_uncovered("90" "native" "")  # no GPU found here: nothing to check against

# The headers check the same minimum, as __CUDA_ARCH__ spells it.
file(STRINGS ${DEVMR_SOURCE_DIR}/include/devmr/detail/config.hpp header_minimum
  REGEX "^#define DEVMR_MINIMUM_CUDA_ARCH [0-9]+$")
math(EXPR cmake_minimum "${DEVMR_MINIMUM_CUDA_ARCHITECTURE} * 10")
if(NOT header_minimum STREQUAL "#define DEVMR_MINIMUM_CUDA_ARCH ${cmake_minimum}")
  message(SEND_ERROR "config.hpp says \"${header_minimum}\", CMake ${cmake_minimum}")
  math(EXPR failures "${failures} + 1")
endif()

if(failures GREATER 0)
  message(FATAL_ERROR "architectures: ${failures} checks failed")
endif()
message(STATUS "architectures: the checks of cmake/devmrArchitectures.cmake pass")
