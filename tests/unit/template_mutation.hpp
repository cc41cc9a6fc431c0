// A deliberately broken kernel for the mutation tests: the embedded templates with the first
// occurrence of `from` in template `file` replaced by `to`.
#pragma once

#include <memory>
#include <string>

#include "compiler/codegen/templates.hpp"

namespace attnjit::testing {

// Null when `file` does not contain `from` (the template changed: update the mutation).
inline std::shared_ptr<TemplateSet> mutated_templates(const std::string& file, const std::string& from, const std::string& to) {
  auto t = std::make_shared<TemplateSet>(TemplateSet::embedded());
  std::string text = t->text(file);
  const size_t at = text.find(from);
  if (at == std::string::npos) return nullptr;
  text.replace(at, from.size(), to);
  t->replace(file, std::move(text));
  return t;
}

}  // namespace attnjit::testing
