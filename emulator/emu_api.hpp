// The runtime side of emulator/emu_abi.h.
#pragma once

#include <cstdint>

#include "emulator/emu_abi.h"

namespace attnjit::emu {

// The table handed to every kernel object the emulator loads.
const AjEmuApi& emu_api();

// How many times emulated kernels took rare path `path` (aj_rare_path in the templates, which
// numbers them: the exact sums after a non-finite value), or any with -1, since the process
// started, all threads together. Tests read it before and after a call: finite inputs must never
// take one.
uint64_t rare_paths_taken(int path = -1);

}  // namespace attnjit::emu
