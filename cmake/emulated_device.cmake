# ckpt_emulated_device (ckpt::emulated_device): <ckpt/emulated_device.h>, an emulated accelerator
# registered as c10::DeviceType::PrivateUse1, for tests of device-generic LibTorch code. It needs
# LibTorch only (not ckpt::ckpt). src/compat/device_backend.cpp holds its version differences.
add_library(ckpt_emulated_device
  src/compat/device_backend.cpp
  src/emulated_device/allocator.cpp
  src/emulated_device/devices.cpp
  src/emulated_device/fallback.cpp
  src/emulated_device/generator.cpp
  src/emulated_device/guard.cpp
  src/emulated_device/install.cpp
  src/emulated_device/kernels.cpp
  src/emulated_device/recurrent.cpp
  src/emulated_device/streams.cpp
)
add_library(ckpt::emulated_device ALIAS ckpt_emulated_device)
target_include_directories(ckpt_emulated_device PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_include_directories(ckpt_emulated_device PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(ckpt_emulated_device PUBLIC torch Threads::Threads)
foreach(dir IN LISTS CKPT_TORCH_NVIDIA_LIBRARY_DIRS)  # as for ckpt: the wheel's CUDA libraries
  get_filename_component(dir "${dir}" REALPATH)
  target_link_options(ckpt_emulated_device INTERFACE "LINKER:-rpath-link,${dir}")
endforeach()
target_compile_features(ckpt_emulated_device PUBLIC cxx_std_17)
set_target_properties(ckpt_emulated_device PROPERTIES EXPORT_NAME emulated_device)
ckpt_set_warnings(ckpt_emulated_device)
ckpt_unity_build(ckpt_emulated_device)
