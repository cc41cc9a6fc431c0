// The runtime side of emulator/emu_abi.h.
#pragma once

#include "emulator/emu_abi.h"

namespace attnjit::emu {

// The table handed to every kernel object the emulator loads.
const AjEmuApi& emu_api();

}  // namespace attnjit::emu
