# Cross-compile the native CPU kernels for POWER9 (VSX) and run their tests under qemu.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ppc64le)
set(CMAKE_C_COMPILER powerpc64le-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER powerpc64le-linux-gnu-g++)
set(ENGINE_ARCH_FLAGS "-mcpu=power9")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-ppc64le -cpu power9 -L /usr/powerpc64le-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Vector instructions that must be in the built kernels (VSX fp32 FMA; a silent scalar fallback fails).
set(ENGINE_OBJDUMP powerpc64le-linux-gnu-objdump)
set(ENGINE_VECTOR_INSNS xvmaddasp xvcvhpsp xvcvsphp)
