// What the code generators share (codegen.cpp: the forward's; codegen_backward.cpp;
// codegen_paged.cpp): the arch's shared memory, the checks of a request, the instantiation header
// every kernel source starts with, and naming a kernel after its text. Internal: not installed.
#pragma once

#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"

namespace attnjit::codegen_detail {

// Shared memory a block may use on `arch` (bytes, with the opt-in above 48 KB where it exists).
int shared_limit(int arch);
std::string arch_name(int arch);  // "sm_80"
// A UserError naming `where` and the fix in `message` unless `ok`.
void require(bool ok, const std::string& where, const std::string& message);
bool hopper(KernelPath p);  // Sm90 or Sm90Tma
// The SIMT kernels' tiles: `c` validated (a UserError naming the fix), zeros their defaults.
KernelConfig resolve_simt_config(const KernelRequest& r, KernelConfig c);

// The instantiation header (head dims, dtype, tiles, stages, arch as constants) and the shared
// templates with the mask predicate `predicate`, then the templates `bodies`. `forward`: a forward
// or paged source (else a backward one, with backward_defines); `paged`: the paged forward's.
std::string render_prefix(const char* kind, const KernelSource& k, const KernelRequest& r, const Pattern& p,
                          const std::string& predicate, const TemplateSet& templates, const std::vector<std::string>& bodies,
                          bool forward = false, bool paged = false);
// The backward kernels' constants in that header (codegen_backward.cpp).
std::string backward_defines(const KernelSource& k, const KernelRequest& r);
// Names the kernel after the hash of its text: AJ_KERNEL_NAME becomes `prefix` + 12 hex digits
// everywhere, so equal sources share a name and different ones never do.
void name_by_hash(KernelSource& k, std::string source, const std::string& prefix);

}  // namespace attnjit::codegen_detail
