#pragma once
// A Jinja2 interpreter for Hugging Face chat templates. It follows Jinja2 3.x as transformers configures it
// (trim_blocks, lstrip_blocks, no autoescape, keep_trailing_newline off, the loopcontrols extension) with
// Python semantics for the values templates handle: str/list/dict methods, truthiness, repr, json.dumps.
// Errors carry the Jinja2 exception kind and message so an API user sees what Hugging Face would show.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace moeserve::text::jinja {

// kind is the Jinja2 exception class: "TemplateSyntaxError" (parse), "TemplateError" (raise_exception),
// "UndefinedError", "TypeError", ... what() is the message alone, without the kind.
class TemplateError : public Error {
 public:
  TemplateError(std::string kind, const std::string& message) : Error(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

struct Options {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

class Template {
 public:
  // Parses the source; throws TemplateError("TemplateSyntaxError", "line N: ...") on bad syntax.
  explicit Template(const std::string& source, Options options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the members of `variables` (a JSON object; key order is kept, as in Python dicts) as the
  // template's variables, plus the globals raise_exception, namespace, range, dict and strftime_now.
  std::string render(const nlohmann::ordered_json& variables) const;

  struct Program;

 private:
  std::unique_ptr<Program> program_;
};

}  // namespace moeserve::text::jinja
