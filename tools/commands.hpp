// Each `attnjit` subcommand registers itself on the app and writes its exit code to `rc`.
#pragma once

#include <CLI/CLI.hpp>

namespace attnjit::cli {

void register_validate(CLI::App& app, int& rc);
void register_mask(CLI::App& app, int& rc);
void register_run(CLI::App& app, int& rc);
void register_grad(CLI::App& app, int& rc);
void register_info(CLI::App& app, int& rc);
void register_dump(CLI::App& app, int& rc);
void register_compile(CLI::App& app, int& rc);  // compile and precompile
void register_cache(CLI::App& app, int& rc);
void register_tune(CLI::App& app, int& rc);

}  // namespace attnjit::cli
