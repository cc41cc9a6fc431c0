#include "compiler/codegen/templates.hpp"

#include "compiler/support/sha256.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

const TemplateSet& TemplateSet::embedded() {
  static const TemplateSet set{embedded_template_files()};
  return set;
}

const std::string& TemplateSet::text(const std::string& name) const {
  for (const TemplateFile& f : files)
    if (f.name == name) return f.text;
  ATTNJIT_CHECK(false, "template " + name + " is not embedded; add it to ATTNJIT_TEMPLATES in CMakeLists.txt");
}

std::string TemplateSet::blocks() const {
  std::string out;
  for (const char* name : kBlockFiles) out += text(name) + "\n";
  return out;
}

std::string TemplateSet::hash() const {
  Sha256 h;
  for (const TemplateFile& f : files) {
    h.update(f.name);
    h.update(std::string_view("\0", 1));
    h.update(f.text);
    h.update(std::string_view("\0", 1));
  }
  return h.hex_digest();
}

void TemplateSet::replace(const std::string& name, std::string text) {
  for (TemplateFile& f : files)
    if (f.name == name) {
      f.text = std::move(text);
      return;
    }
  files.push_back({name, std::move(text)});
}

}  // namespace attnjit
