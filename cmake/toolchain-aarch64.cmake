# Cross-compile the native CPU kernels for AArch64 and run their tests under qemu. Baseline Armv8-A, as a
# wheel is built: kernels that use later extensions (dotprod) enable them per function and check the CPU at run
# time. The tests run twice: on a CPU with every extension (-cpu max) and on a Cortex-A53 (Armv8.0, no dotprod).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(ENGINE_ARCH_FLAGS "-march=armv8-a")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu)
set(ENGINE_BASELINE_EMULATOR qemu-aarch64 -cpu cortex-a53 -L /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Vector instructions that must be in the built kernels (NEON fp32 FMA, the dotprod int8 dot).
set(ENGINE_OBJDUMP aarch64-linux-gnu-objdump)
set(ENGINE_VECTOR_INSNS fmla sdot)
