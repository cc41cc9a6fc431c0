// attnjit: the command-line front end. One subcommand per pipeline job.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attnjit: a just-in-time compiler for structured sparse attention"};
  app.set_version_flag("--version", std::string("attnjit ") + ATTNJIT_VERSION);
  app.require_subcommand(1);
  int rc = 0;
  attnjit::cli::register_validate(app, rc);
  attnjit::cli::register_mask(app, rc);
  attnjit::cli::register_run(app, rc);
  attnjit::cli::register_grad(app, rc);
  attnjit::cli::register_dump(app, rc);
  attnjit::cli::register_compile(app, rc);
  attnjit::cli::register_cache(app, rc);
  attnjit::cli::register_tune(app, rc);
  attnjit::cli::register_info(app, rc);
  // CLI11 answers a mistyped subcommand with "A subcommand is required"; name it and the choices instead.
  const CLI::App& defined = app;
  if (argc > 1 && argv[1][0] != '-' &&
      defined.get_subcommands([&](const CLI::App* s) { return s->check_name(argv[1]); }).empty()) {
    std::string names;
    for (const CLI::App* s : defined.get_subcommands({})) names += (names.empty() ? "" : ", ") + s->get_name();
    std::cerr << "error: unknown subcommand \"" << argv[1] << "\"; the subcommands are " << names << "\n";
    return 1;
  }
  // CLI11's own errors (a value that does not convert or check, an unknown option) read as the
  // others do, "error: ...", and exit with the same code 1 (CLI11's are 100 and up); --help and
  // --version still exit 0.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) { return "error: " + CLI::FailureMessage::simple(a, e); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  return rc;
}
