#include "text/jinja.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace moeserve::text::jinja {
namespace {

using ordered_json = nlohmann::ordered_json;

// tests/text/jinja-goldens.json holds Python Jinja2's own output for each case (make_jinja_goldens.py).
TEST(Jinja, MatchesPythonJinja2Goldens) {
  auto goldens = ordered_json::parse(testing::read_text("tests/text/jinja-goldens.json"));
  ASSERT_GE(goldens["cases"].size(), 50u);
  for (const auto& c : goldens["cases"]) {
    std::string name = c["name"];
    std::string got, kind;
    try {
      got = Template(c["template"].get<std::string>()).render(goldens["variables"]);
    } catch (const TemplateError& e) {
      kind = e.kind();
      got = e.what();
    }
    if (c.contains("rendered")) {
      EXPECT_EQ(kind, "") << name << ": " << got;
      EXPECT_EQ(got, c["rendered"].get<std::string>()) << name;
    } else {
      EXPECT_EQ(kind, c["error_kind"].get<std::string>()) << name << ": " << got;
      // Syntax errors are worded our own way (with the line); runtime errors use Python's words.
      if (kind != "TemplateSyntaxError") {
        EXPECT_EQ(got, c["error"].get<std::string>()) << name;
      }
    }
  }
}

TEST(Jinja, GenerationBlockRendersItsBody) {
  EXPECT_EQ(Template("a{% generation %}b{% endgeneration %}c").render({}), "abc");
}

TEST(Jinja, KeepTrailingNewlineOption) {
  EXPECT_EQ(Template("x\n").render({}), "x");
  EXPECT_EQ(Template("x\n", Options{true, true, true}).render({}), "x\n");
}

TEST(Jinja, DeepMacroRecursionIsAnErrorNotACrash) {
  Template t("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  try {
    t.render({});
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), "RecursionError");
  }
}

TEST(Jinja, SyntaxErrorsSayWhereAndWhat) {
  auto error_of = [](const std::string& src) {
    try {
      Template t(src);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("{{ x | nofilter }}"), ::testing::HasSubstr("no filter named 'nofilter'"));
  EXPECT_THAT(error_of("a\nb\n{{ x is notatest }}"),
              ::testing::HasSubstr("line 3: no test named 'notatest'"));
  EXPECT_THAT(error_of("{% for x in y %}"), ::testing::HasSubstr("expected 'else' or 'endfor'"));
  EXPECT_THAT(error_of("{{ 'unterminated }}"), ::testing::HasSubstr("unterminated string"));
  EXPECT_THAT(error_of("{{ x "), ::testing::HasSubstr("expected '}}'"));
  EXPECT_THAT(error_of("{% call m %}x{% endcall %}"),
              ::testing::HasSubstr("expected a macro call after 'call'"));
  EXPECT_THAT(error_of("{% call(a m() %}x{% endcall %}"), ::testing::HasSubstr("line 1"));
}

}  // namespace
}  // namespace moeserve::text::jinja
