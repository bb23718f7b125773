# Cross-compile the native CPU kernels for RISC-V 64 (clang-19: gcc 12 has no riscv_vector.h) and run
# their tests under qemu. The baseline is rv64gc, as a wheel is built; the RVV 1.0 kernels (*_rvv.cpp)
# get ENGINE_RVV_FLAGS and are picked at run time from AT_HWCAP. ctest runs the tests on a CPU with V at
# VLEN 256, and the RVV kernel tests again at every ENGINE_RVV_VLENS and on a CPU without V.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_CXX_COMPILER clang++-19)
set(CMAKE_C_COMPILER_TARGET riscv64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET riscv64-linux-gnu)
set(ENGINE_ARCH_FLAGS "-march=rv64gc")
set(ENGINE_RVV_FLAGS "-march=rv64gcv_zfh")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(ENGINE_QEMU_RVV qemu-riscv64 -L /usr/riscv64-linux-gnu -cpu rv64,v=true,vext_spec=v1.0,Zfh=true,vlen=)
set(CMAKE_CROSSCOMPILING_EMULATOR ${ENGINE_QEMU_RVV}256)
set(ENGINE_RVV_VLENS 128 512 1024)
set(ENGINE_BASELINE_EMULATOR qemu-riscv64 -cpu rv64,v=false -L /usr/riscv64-linux-gnu)
set(ENGINE_BASELINE_TESTS "^test_(gguf_linear|gguf_q8act|small_ops)$")  # kernels with an RVV path (V off)
# Vector instructions that must be in the RVV kernel tests' binaries (a silent scalar fallback fails).
set(ENGINE_OBJDUMP riscv64-linux-gnu-objdump)
set(ENGINE_VECTOR_INSNS vsetvli vsetivli vfmacc.vv vwmul.vv vrgather.vv vfredusum.vs)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
