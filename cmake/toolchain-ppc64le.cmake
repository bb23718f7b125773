# Cross-compile the native CPU kernels for POWER9 (VSX) and run their tests under qemu.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ppc64le)
set(CMAKE_C_COMPILER powerpc64le-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER powerpc64le-linux-gnu-g++)
# As a native build (CMakeLists.txt): the VSX kernels (*_vsx.cpp) at POWER9 (ISA 3.0 fp16 conversions),
# the rest at the ppc64le baseline (POWER8), checked on a POWER8 model (the vsx variant must be absent).
set(ENGINE_ARCH_FLAGS "-mcpu=power8")
set(ENGINE_VSX_FLAGS "-mcpu=power9")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-ppc64le -cpu power9 -L /usr/powerpc64le-linux-gnu)
set(ENGINE_PRESENT_ISAS vsx)
set(ENGINE_BASELINE_EMULATOR qemu-ppc64le -cpu power8 -L /usr/powerpc64le-linux-gnu)
set(ENGINE_BASELINE_TESTS "^test_(isa|small_ops|fp16_linear|paged_attention)$")  # fp16 paths with a VSX variant
set(ENGINE_BASELINE_MISSING_ISAS vsx)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Vector instructions that must be in the built kernels (VSX fp32 FMA; a silent scalar fallback fails).
set(ENGINE_OBJDUMP powerpc64le-linux-gnu-objdump)
set(ENGINE_VECTOR_INSNS xvmaddasp xvcvhpsp xvcvsphp)
