#include "loadgen/benchmark.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

// A GET answer as JSON when it parses, as text otherwise, null when the server did not answer 200.
json get_json(const Endpoint& endpoint, const std::string& target, const std::string& api_key) {
  HttpResponse r = http_get(endpoint, target, api_key, 10);
  if (r.status != 200) return nullptr;
  json j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json(r.body) : j;
}

// Whether the server takes ignore_eos/min_tokens (vLLM, SGLang, moeserve do; OpenAI's API and strict proxies
// answer 400). One 1-token request with them; when it is refused and the same request without them is not,
// the run goes on without them and its output lengths are the model's own.
bool accepts_exact_length_fields(const Endpoint& endpoint, const BenchConfig& config) {
  json body = {{"model", config.workload.model},
               {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
               {"max_tokens", 1},
               {"stream", false}};
  json exact = body;
  exact["ignore_eos"] = true;
  exact["min_tokens"] = 1;
  const std::string target = endpoint.api("/chat/completions");
  HttpResponse with = http_post_json(endpoint, target, exact.dump(), config.load.api_key, 60);
  if (with.status != 400) return true;  // accepted, or a failure the run itself will report
  HttpResponse without = http_post_json(endpoint, target, body.dump(), config.load.api_key, 60);
  return without.status == 400;  // refused either way: not these fields' fault
}

}  // namespace

size_t default_num_requests(const WorkloadOptions& workload, size_t concurrency) {
  return std::max<size_t>(100, 4 * std::max<size_t>(concurrency, 1) * requests_per_conversation(workload));
}

json run_benchmark(BenchConfig config, const PromptGenerator& prompts,
                   const std::function<void(const json&, const json&)>& on_run) {
  Endpoint endpoint = Endpoint::parse(config.url);
  json server = {{"url", endpoint.url()},
                 {"version", get_json(endpoint, endpoint.prefix + "/version", config.load.api_key)},
                 {"models", get_json(endpoint, endpoint.api("/models"), config.load.api_key)}};
  if (config.workload.model.empty()) {
    const json& models = server["models"];
    check(
        models.is_object() && models.contains("data") && models["data"].is_array() && !models["data"].empty(),
        "{} does not list its models at {}; pass --model", endpoint.url(), endpoint.api("/models"));
    config.workload.model = models["data"][0].value("id", "");
  }
  if (config.label.empty()) {
    config.label = endpoint.host + ":" + endpoint.port;
    const json& v = server["version"];
    if (v.is_object() && v.contains("version")) config.label += " " + v["version"].dump();
    if (v.is_string()) config.label += " " + v.get<std::string>();
  }
  check(!config.scenarios.empty() && !config.concurrencies.empty(),
        "nothing to run: no scenario or load point");
  if (config.workload.ignore_eos && !accepts_exact_length_fields(endpoint, config)) {
    spdlog::warn("{} refuses ignore_eos/min_tokens: output lengths are the model's own, not --output-len",
                 endpoint.url());
    config.workload.ignore_eos = false;
  }

  json doc = {
      {"format", "moeserve-bench/1"},
      {"label", config.label},
      {"started_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::chrono::system_clock::now()))},
      {"config",
       {{"url", endpoint.url()},
        {"model", config.workload.model},
        {"scenarios", json::array()},
        {"concurrencies", config.concurrencies},
        {"request_rate", config.load.request_rate},
        {"num_requests", config.load.num_requests},
        {"duration_s", config.load.duration_s},
        {"input_len", config.workload.input_len},
        {"output_len", config.workload.output_len},
        {"long_output_len", config.workload.long_output_len},
        {"turns", config.workload.turns},
        {"tokenizer", config.tokenizer},
        {"exact_input_lengths", prompts.exact()},
        {"ignore_eos", config.workload.ignore_eos},
        {"temperature", config.workload.temperature},
        {"tool_choice", config.workload.tool_choice},
        {"extra_body", config.workload.extra_body},
        {"seed", config.load.seed},
        {"request_timeout_s", config.load.request_timeout_s}}},
      {"server", server},
      {"client", {{"name", "moeserve bench"}, {"version", "0.1.0"}}},
      {"runs", json::array()}};
  for (Scenario s : config.scenarios) doc["config"]["scenarios"].push_back(scenario_name(s));
  if (std::find(config.scenarios.begin(), config.scenarios.end(), Scenario::image) !=
      config.scenarios.end()) {
    const ImageShape& image = config.workload.image;
    doc["config"]["images_per_request"] = config.workload.images_per_request;
    doc["config"]["image_size"] = fmt::format("{}x{}", image.width, image.height);
    doc["config"]["image_format"] = std::string(image_encoding_name(image.encoding));
  }

  for (Scenario scenario : config.scenarios) {
    for (size_t concurrency : config.concurrencies) {
      WorkloadOptions workload = config.workload;
      workload.scenario = scenario;
      workload.prompt_set = doc["runs"].size();
      LoadOptions load = config.load;
      load.concurrency = concurrency;
      if (load.num_requests == 0 && load.duration_s == 0)
        load.num_requests = default_num_requests(workload, concurrency);
      size_t dialogues = load.num_requests / requests_per_conversation(workload);
      if (load.request_rate == 0 && load.num_requests > 0 && dialogues < concurrency)
        spdlog::warn(
            "{}: {} requests make only {} dialogues, fewer than concurrency {}; raise --num-requests",
            scenario_name(scenario), load.num_requests, dialogues, concurrency);
      // The image scenario's pictures, encoded before the clock starts (up to kPreparedImages: a long run's
      // later ones are encoded as it goes, not held all at once); new ones each run (a sweep's second run
      // must not find the first one's pictures in the prefix cache).
      constexpr size_t kPreparedImages = 512;
      std::optional<ImageSet> images;
      if (scenario == Scenario::image) {
        images.emplace(workload.image, config.load.seed * 1000003 + workload.prompt_set,
                       std::min(load.num_requests * workload.images_per_request, kPreparedImages));
        workload.images = &*images;
      }
      std::string title = std::string(scenario_name(scenario)) +
                          (load.request_rate > 0 ? fmt::format(" r={:g}/s", load.request_rate)
                                                 : fmt::format(" c={}", concurrency));
      ProgressBar bar(title, config.progress);
      LoadResult result =
          run_load(endpoint, load, workload, prompts, [&bar](const Progress& p) { bar.update(p); });
      json requests = json::array();
      for (const auto& r : result.records) requests.push_back(to_json(r));
      json run = {{"scenario", scenario_name(scenario)},
                  {"concurrency", load.request_rate > 0 ? load.concurrency : concurrency},
                  {"request_rate", load.request_rate},
                  {"num_requests", load.num_requests},
                  {"duration_limit_s", load.duration_s},
                  {"interrupted", result.interrupted},
                  {"summary", summarize(result.records, result.duration_s)},
                  {"requests", std::move(requests)}};
      doc["runs"].push_back(std::move(run));
      if (on_run) on_run(doc, doc["runs"].back());
      if (result.interrupted) return doc;
    }
  }
  return doc;
}

}  // namespace moeserve::loadgen
