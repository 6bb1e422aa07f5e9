// CLI11 in the SMPI build: smpicxx defines exit(x) as a macro (smpi_helpers.h), which breaks
// CLI11's App::exit(e, out, err). CLI11 is included, and its exit called (cli_exit), with the
// macro out of the way. Include this before any other header of an SMPI program.
#pragma once
#pragma push_macro("exit")
#undef exit
#include <CLI/CLI.hpp>
inline int cli_exit(const CLI::App& app, const CLI::ParseError& e) { return app.exit(e); }
#pragma pop_macro("exit")
