// CLI flags whose value is a mode (core/modes.h): the word is parsed here, once, by the mode's
// parser (an unknown word is a moe::Error naming the flag and the accepted words), and --help
// shows the default by its name.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "core/modes.h"

namespace moe::apps {

template <class E>
CLI::Option* add_mode_option(CLI::App* app, const std::string& flag, E& value, const std::string& help) {
  return app
      ->add_option_function<std::string>(
          flag, [&value, flag](const std::string& s) { value = parse_mode<E>(s, flag.c_str()); }, help)
      ->default_str(name(value));
}

// A mode that may also be "auto" (std::nullopt).
template <class E>
CLI::Option* add_mode_option(CLI::App* app, const std::string& flag, std::optional<E>& value,
                             const std::string& help) {
  return app
      ->add_option_function<std::string>(
          flag, [&value, flag](const std::string& s) { value = parse_mode_or_auto<E>(s, flag.c_str()); }, help)
      ->default_str(name_or_auto(value));
}

}  // namespace moe::apps
