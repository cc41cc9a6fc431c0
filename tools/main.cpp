// attnjit: the command-line front end. One subcommand per pipeline job.
#include <CLI/CLI.hpp>

#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attnjit: a just-in-time compiler for structured sparse attention"};
  app.set_version_flag("--version", std::string("attnjit ") + ATTNJIT_VERSION);
  app.require_subcommand(1);
  int rc = 0;
  attnjit::cli::register_validate(app, rc);
  attnjit::cli::register_mask(app, rc);
  attnjit::cli::register_run(app, rc);
  attnjit::cli::register_info(app, rc);
  CLI11_PARSE(app, argc, argv);
  return rc;
}
