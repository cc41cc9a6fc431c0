// The building blocks of every kernel (templates/blocks/): kernels use these and nothing else that
// touches the hardware. Each block has two bodies: the hardware one (inline PTX or a CUDA
// intrinsic, what NVRTC compiles) and its emulation twin, selected by AJ_EMULATE, which the CPU
// emulator (emulator/) defines when it compiles the same kernel text with the host compiler. The
// twins call the emulator's runtime (emulator/emu_abi.h), which gives each instruction the
// semantics of the PTX ISA; tests/gpu/probes/ runs one probe per block on both and compares them
// bit for bit. By role, in the order they are included: base.cuh (types, indices, rare-path
// accounting), memory.cuh (shared memory, cp.async, ldmatrix, reductions, TMA), sync.cuh
// (barriers, shuffles, mbarriers), mma.cuh (mma.sync, wgmma), math.cuh (conversions, exp2/log2).
//
// The element types, and where a thread is.

typedef unsigned short aj_u16;
typedef unsigned int aj_u32;
typedef unsigned long long aj_u64;
typedef long long aj_i64;

#ifndef AJ_EMULATE  // ---- hardware bodies (inline PTX) ----

__device__ __forceinline__ int aj_thread_idx() { return (int)threadIdx.x; }
__device__ __forceinline__ int aj_block_idx_x() { return (int)blockIdx.x; }
__device__ __forceinline__ int aj_block_idx_y() { return (int)blockIdx.y; }
__device__ __forceinline__ int aj_block_idx_z() { return (int)blockIdx.z; }
__device__ __forceinline__ int aj_grid_dim_x() { return (int)gridDim.x; }

// Marks rare path `path` taken (AJ_RARE_*, common.cuh: the exact sums after a non-finite value):
// nothing on a GPU; the emulator counts them, so tests can tell that finite inputs never take one.
__device__ __forceinline__ void aj_rare_path(int) {}

#else  // ---- emulation twins (the emulator's runtime, emulator/emu_abi.h) ----
// The aj_emu_* functions come from the emulator's prelude; each passes its caller's address on,
// so a report names the kernel line.

__device__ __forceinline__ int aj_thread_idx() { return (int)aj_emu_thread_idx(0); }
__device__ __forceinline__ int aj_block_idx_x() { return (int)aj_emu_block_idx(0); }
__device__ __forceinline__ int aj_block_idx_y() { return (int)aj_emu_block_idx(1); }
__device__ __forceinline__ int aj_block_idx_z() { return (int)aj_emu_block_idx(2); }
__device__ __forceinline__ int aj_grid_dim_x() { return (int)aj_emu_grid_dim(0); }
__device__ __forceinline__ void aj_rare_path(int path) { aj_emu_rare_path(path); }

#endif  // AJ_EMULATE
