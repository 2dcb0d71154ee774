# ckpt_unity_build(target): compiles the target's files in batches of eight (CMake's unity
# build), so that LibTorch's headers are parsed once per batch instead of once per file: the
# library builds in 55 s instead of 156 s on 2 cores. The LibTorch test programs and the `ckpt`
# program too: each of their files spends about 6 s loading the precompiled header before its own
# code (GCC's -ftime-report on tests/support/main.cpp), and the four test programs of the 2.x
# build take 139 s instead of 268 (255 CPU-s instead of 530, no compiler cache). Each test file
# keeps its helpers in a namespace named after the file, so that the files of a batch don't clash.
# -DCKPT_UNITY_BUILD=OFF compiles every file alone, which also shows an include a file forgot.
option(CKPT_UNITY_BUILD "Compile ckpt's libraries and programs in batches of files" ON)
function(ckpt_unity_build target)
  if(CKPT_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()
