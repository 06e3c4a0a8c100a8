// moeserve bench: load generator for any OpenAI-compatible endpoint (docs/bench.md).
//   moeserve bench --url URL --scenario single_turn|multi_turn|tool_call|long_gen|all|image [load] [lengths]
//   moeserve bench compare A.json B.json ...
//   moeserve bench plot result.json --out result.svg
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "command.h"
#include "common/error.h"
#include "loadgen/benchmark.h"
#include "loadgen/image.h"
#include "loadgen/plot.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"

namespace moeserve::app {
namespace {

using nlohmann::json;

struct Flags {
  std::string url, model, api_key, label, scenario = "single_turn", tokenizer, output, plot;
  std::string sweep, extra_body, tool_choice = "auto", image_size = "448", image_format = "png";
  size_t images_per_request = 1;
  size_t concurrency = 1, num_requests = 0, input_len = 256, output_len = 128, long_output_len = 4096,
         turns = 10;
  double request_rate = 0, duration = 0, timeout = 600, temperature = 0;
  uint64_t seed = 0;
  bool no_ignore_eos = false, quiet = false;
  std::vector<std::string> compare_files;
  std::string compare_metric = "output";
  std::string plot_input, plot_out;
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot open {}", path);
  json j = json::parse(in, nullptr, false);
  check(!j.is_discarded(), "{} is not valid JSON", path);
  return j;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  check(out.good(), "cannot write {}", path);
  out << text;
  check(out.good(), "writing {} failed", path);
}

std::vector<size_t> parse_sweep(const std::string& list) {
  std::vector<size_t> values;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    unsigned long v = 0;
    try {
      v = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == item.size() && v > 0, "--sweep: '{}' is not a positive integer (e.g. --sweep 1,4,16,64)",
          item);
    values.push_back(v);
  }
  check(!values.empty(), "--sweep needs at least one concurrency");
  return values;
}

int run_compare(const Flags& f) {
  std::vector<loadgen::CompareInput> inputs;
  for (const auto& path : f.compare_files) {
    json doc = read_json(path);
    std::string label = doc.value("label", path);
    for (const auto& in : inputs)
      if (in.label == label) label += " (" + path + ")";
    inputs.push_back({label, std::move(doc)});
  }
  std::cout << loadgen::compare_table(inputs, f.compare_metric);
  return 0;
}

int run_plot(const Flags& f) {
  write_file(f.plot_out, loadgen::plot_svg(read_json(f.plot_input)));
  std::cout << "wrote " << f.plot_out << "\n";
  return 0;
}

int run_bench(const Flags& f, bool concurrency_given, bool rate_given) {
  check(!f.url.empty(), "--url is required (e.g. --url http://127.0.0.1:30000)");
  check(!(rate_given && !f.sweep.empty()),
        "--sweep varies --concurrency and cannot be combined with --request-rate");
  loadgen::BenchConfig config;
  config.url = f.url;
  config.label = f.label;
  if (f.scenario == "all") {
    config.scenarios = loadgen::all_scenarios();
  } else {
    config.scenarios = {loadgen::parse_scenario(f.scenario)};
  }
  if (!f.sweep.empty()) {
    config.concurrencies = parse_sweep(f.sweep);
  } else {
    check(f.concurrency > 0 || rate_given, "--concurrency must be at least 1");
    // With a request rate the concurrency is only a cap, and there is none unless given.
    config.concurrencies = {rate_given && !concurrency_given ? 0 : f.concurrency};
  }
  config.load.request_rate = f.request_rate;
  config.load.num_requests = f.num_requests;
  config.load.duration_s = f.duration;
  config.load.request_timeout_s = f.timeout;
  config.load.seed = f.seed;
  config.load.api_key = f.api_key;
  config.workload.model = f.model;
  config.workload.input_len = f.input_len;
  config.workload.output_len = f.output_len;
  config.workload.long_output_len = f.long_output_len;
  config.workload.turns = f.turns;
  config.workload.ignore_eos = !f.no_ignore_eos;
  config.workload.temperature = f.temperature;
  config.workload.tool_choice = f.tool_choice;
  check(f.images_per_request > 0, "--images-per-request must be at least 1");
  config.workload.images_per_request = f.images_per_request;
  loadgen::parse_image_size(f.image_size, config.workload.image);
  config.workload.image.encoding = loadgen::parse_image_encoding(f.image_format);
  if (!f.extra_body.empty()) {
    config.workload.extra_body = json::parse(f.extra_body, nullptr, false);
    check(config.workload.extra_body.is_object(), "--extra-body must be a JSON object, got: {}",
          f.extra_body);
  }
  config.tokenizer = f.tokenizer;
  config.progress = !f.quiet && loadgen::stderr_is_terminal();
  loadgen::PromptGenerator prompts(
      f.seed, f.tokenizer.empty() ? loadgen::TokenCounter{} : loadgen::load_token_counter(f.tokenizer));

  json doc = loadgen::run_benchmark(config, prompts, [&](const json& document, const json& run) {
    std::cout << loadgen::format_run(run) << std::flush;
    if (!f.output.empty())
      write_file(f.output, document.dump(1) + "\n");  // after every run: partial results survive
  });
  if (!f.output.empty()) std::cout << "wrote " << f.output << "\n";
  if (!f.plot.empty()) {
    write_file(f.plot, loadgen::plot_svg(doc));
    std::cout << "wrote " << f.plot << "\n";
  }
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--url", f->url, "server base URL, e.g. http://127.0.0.1:30000 (a trailing /v1 is fine)");
  app.add_option("--model", f->model, "model name to send (default: the first of GET /v1/models)");
  app.add_option("--api-key", f->api_key, "sent as Authorization: Bearer KEY");
  app.add_option("--label", f->label,
                 "names this endpoint in compare tables and plots (default host:port + version)");
  app.add_option("--scenario", f->scenario,
                 "single_turn|multi_turn|tool_call|long_gen|all (the four), or image")
      ->capture_default_str();
  auto* conc = app.add_option("--concurrency", f->concurrency,
                              "requests in flight (closed loop); with "
                              "--request-rate, a cap")
                   ->capture_default_str();
  auto* rate =
      app.add_option("--request-rate", f->request_rate, "dialogues started per second, Poisson arrivals");
  app.add_option("--num-requests", f->num_requests,
                 "requests per run; multi_turn/tool_call round up to whole dialogues (default: max(100, "
                 "4 x concurrency x requests per dialogue))");
  app.add_option("--duration", f->duration, "stop starting requests after S seconds");
  app.add_option("--input-len", f->input_len, "tokens of each new user message")->capture_default_str();
  app.add_option("--output-len", f->output_len, "tokens generated per request")->capture_default_str();
  app.add_option("--long-output-len", f->long_output_len, "tokens generated per long_gen request")
      ->capture_default_str();
  app.add_option("--turns", f->turns, "turns of a multi_turn dialogue")->capture_default_str();
  app.add_option("--images-per-request", f->images_per_request, "pictures in each image-scenario request")
      ->capture_default_str();
  app.add_option("--image-size", f->image_size, "the image scenario's pictures: WIDTHxHEIGHT or one side")
      ->capture_default_str();
  app.add_option("--image-format", f->image_format, "the image scenario's pictures: png|jpeg")
      ->capture_default_str();
  app.add_option("--tokenizer", f->tokenizer,
                 "tokenizer.json (or its folder) for prompts of exact token length");
  app.add_option("--seed", f->seed, "prompt and arrival seed")->capture_default_str();
  app.add_option("--sweep", f->sweep, "comma-separated concurrencies, one run each (e.g. 1,4,16,64)");
  app.add_option("--output", f->output, "write the results JSON here");
  app.add_option("--plot", f->plot, "write an SVG plot here");
  app.add_option("--timeout", f->timeout, "seconds one request may take")->capture_default_str();
  app.add_option("--temperature", f->temperature, "sampling temperature sent")->capture_default_str();
  app.add_option("--tool-choice", f->tool_choice,
                 "tool_choice of the tool_call scenario (auto|required|none)")
      ->capture_default_str();
  app.add_option("--extra-body", f->extra_body, "JSON object merged into every request body");
  app.add_flag("--no-ignore-eos", f->no_ignore_eos,
               "do not send ignore_eos/min_tokens (for servers that reject unknown fields)");
  app.add_flag("--quiet", f->quiet, "no progress line");
  app.require_subcommand(0, 1);

  auto* compare =
      app.add_subcommand("compare", "table of several results files: throughput, difference %, latency");
  compare->add_option("files", f->compare_files, "results JSON files; the first is the baseline")
      ->required()
      ->check(CLI::ExistingFile);
  compare->add_option("--metric", f->compare_metric, "throughput the diff % compares: output|total|requests")
      ->capture_default_str();
  auto* plot = app.add_subcommand("plot", "draw a results file as SVG");
  plot->add_option("file", f->plot_input, "results JSON")->required()->check(CLI::ExistingFile);
  plot->add_option("--out", f->plot_out, "SVG to write")->required();

  return [f, compare, plot, conc, rate]() {
    if (compare->parsed()) return run_compare(*f);
    if (plot->parsed()) return run_plot(*f);
    return run_bench(*f, conc->count() > 0, rate->count() > 0);
  };
}

Registration reg{
    {"bench", "Benchmark an OpenAI-compatible endpoint (the deployment's four scenarios)", 30, setup}};

}  // namespace
}  // namespace moeserve::app
