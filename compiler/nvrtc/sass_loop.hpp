// A generated kernel's main loop in its SASS (the text disassemble_cubin returns): what each tile
// executes at most, and whether it touches local memory. The autotuner asks this of a candidate
// that spills: ptxas, short of registers, parks values the loop never reads (the batch index, from
// the prologue to the epilogue) in local memory, which costs a few loads a block, not a tile.
// bench/sass_mainloop.py reads the loop the same way for the benchmarks and the lit tests.
#pragma once

#include <optional>
#include <string>

namespace attnjit {

struct SassLoop {
  int instructions = 0;    // in the loop's body, both sides of every branch in it
  int hmma = 0;            // m16n8k16-equivalents per warp (an HGMMA.64xNx16 counts N / 8; FP8's QMMA 2, QGMMA.64xNx32 N / 4)
  int local_accesses = 0;  // LDL and STL in the body: spill traffic every tile pays
};

// The backward branch whose body holds the most HMMA (the shortest body on a tie) and no EXIT (a
// back edge from a cold retry path at the kernel's end spans the whole kernel); nullopt when no
// loop holds an MMA.
std::optional<SassLoop> find_main_loop(const std::string& sass);

}  // namespace attnjit
