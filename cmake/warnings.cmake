# ckpt_set_warnings(target): the warning set every ckpt target builds with.
function(ckpt_set_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                                             -Wnon-virtual-dtor -Wno-unused-parameter)
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4)
  endif()
endfunction()

# ckpt_compile_as_test(target): the warning set, and -O1 where the build optimises. Tests,
# examples and doc snippets are glue around LibTorch's calls and ckpt's library (which stay
# optimised): at -O1 one of their files compiles in half the time of -O3 (checkpoint_errors_test.cpp,
# 20.3 s against 10.3 s with its precompiled header), and CI builds them twice. Floating-point
# results don't change: no -ffast-math at any level.
function(ckpt_compile_as_test target)
  ckpt_set_warnings(${target})
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<CONFIG:Release,RelWithDebInfo>:-O1>)
  endif()
endfunction()
