// moeserve render: render a chat request with a model's chat template, exactly as the server would.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "command.h"
#include "common/error.h"
#include "text/chat_template.h"
#include "text/model_text.h"

namespace {

using ordered_json = nlohmann::ordered_json;

struct RenderFlags {
  std::string model_dir, template_file, request, messages, tools, enable_thinking;
  bool no_generation_prompt = false;
};

ordered_json read_json(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  moeserve::check(in.good(), "cannot open {} '{}'", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  auto j = ordered_json::parse(ss.str(), nullptr, false);
  moeserve::check(!j.is_discarded(), "{} '{}' is not valid JSON", flag, path);
  return j;
}

int run(const RenderFlags& f) {
  using namespace moeserve::text;
  std::string source, bos, eos;
  if (!f.template_file.empty()) {
    std::ifstream in(f.template_file, std::ios::binary);
    moeserve::check(in.good(), "cannot open --template '{}'", f.template_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    source = ss.str();
  } else {
    ModelText m = ModelText::load(f.model_dir);
    moeserve::check(!m.chat_template.empty(),
                    "'{}' has no chat template (tokenizer_config.json or chat_template.jinja)", f.model_dir);
    source = m.chat_template;
    bos = m.bos_token;
    eos = m.eos_token;
  }

  ordered_json messages, tools, kwargs = ordered_json::object();
  bool add_generation_prompt = !f.no_generation_prompt;
  if (!f.request.empty()) {
    ordered_json body = read_json(f.request, "--request");
    moeserve::check(body.is_object() && body.contains("messages"),
                    "--request '{}': expected an object with \"messages\"", f.request);
    messages = body["messages"];
    if (body.contains("tools")) tools = body["tools"];
    if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object())
      kwargs = body["chat_template_kwargs"];
    if (body.contains("add_generation_prompt") && body["add_generation_prompt"].is_boolean())
      add_generation_prompt = body["add_generation_prompt"].get<bool>() && !f.no_generation_prompt;
  }
  if (!f.messages.empty()) messages = read_json(f.messages, "--messages");
  if (!f.tools.empty()) tools = read_json(f.tools, "--tools");
  moeserve::check(messages.is_array(), "the messages must be a JSON array (give --request or --messages)");
  if (!f.enable_thinking.empty()) {
    moeserve::check(f.enable_thinking == "true" || f.enable_thinking == "false",
                    "--enable-thinking must be true or false, got '{}'", f.enable_thinking);
    kwargs["enable_thinking"] = f.enable_thinking == "true";
  }
  try {
    ChatTemplate t(source, bos, eos);
    std::string prompt =
        t.render(ChatTemplate::normalize_openai_messages(messages), tools, add_generation_prompt, kwargs);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  } catch (const jinja::TemplateError& e) {
    std::fprintf(stderr, "error: %s: %s\n", e.kind().c_str(), e.what());
    return 1;
  }
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto flags = std::make_shared<RenderFlags>();
  auto* dir = app.add_option("--model-dir,--tokenizer", flags->model_dir,
                             "model directory (tokenizer_config.json / chat_template.jinja)");
  auto* tmpl =
      app.add_option("--template", flags->template_file, "a chat template file instead of a model directory");
  dir->excludes(tmpl);
  app.add_option("--request", flags->request,
                 "an OpenAI chat request body (messages, tools, chat_template_kwargs)");
  app.add_option("--messages", flags->messages, "a JSON array of messages (overrides the request's)");
  app.add_option("--tools", flags->tools, "a JSON array of OpenAI tools (overrides the request's)");
  app.add_flag("--no-generation-prompt", flags->no_generation_prompt,
               "do not open an assistant turn at the end");
  app.add_option("--enable-thinking", flags->enable_thinking,
                 "true|false: the enable_thinking template variable");
  return [flags] {
    moeserve::check(!flags->model_dir.empty() || !flags->template_file.empty(),
                    "give --model-dir DIR or --template FILE");
    return run(*flags);
  };
}

moeserve::app::Registration reg{{"render", "Render a chat request with a model's chat template", 81, setup}};

}  // namespace
