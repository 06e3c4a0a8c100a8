// moeserve serve: one node — the engine behind the OpenAI-compatible HTTP server, with admission control,
// Prometheus metrics and a graceful drain on SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "command.h"
#include "common/bounded_json.h"
#include "common/error.h"
#include "common/log.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "engine/tp_runner.h"
#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/tensor_parallel.h"
#include "server/admission.h"
#include "server/demo_model.h"
#include "server/http.h"
#include "server/memory_monitor.h"
#include "server/openai_service.h"
#include "server/server_metrics.h"
#include "shared_flags.h"
#include "storage/kv_cache.h"
#include "text/chat_template.h"
#include "text/model_text.h"
#include "text/output_parser.h"
#include "vision/tower.h"

namespace moeserve::app {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct ServeOptions {
  std::string model;
  std::string load_format = "auto";
  std::string preset;  // --load-format dummy: a built-in shape instead of --model's config.json
  std::string device = "auto";
  std::string tokenizer;
  std::string host = "0.0.0.0";
  uint16_t port = 30000;
  std::string served_model_name;
  std::string api_key;
  std::string allowed_origins;
  bool vllm_metrics = false;
  bool incremental_streaming_output = false;
  int max_running_requests = 0;  // an upper bound on what the cache budget holds; 0 = kMaxRunningRequests
  int max_queued_requests = 256;
  int max_concurrency = 0;
  double queue_timeout_s = 60;
  double memory_pressure_threshold = 0.86;
  int64_t max_model_len = 0;
  std::string chat_template;
  std::string tool_call_parser = "qwen3_coder";
  std::string reasoning_parser = "qwen3";
  double shutdown_timeout_s = 30;
  int http_threads = 0;
  double max_request_body_mb = 32;
  double keep_alive_timeout_s = 60;
  // What clients can make one node hold (docs/api.md, "Limits on connections and bodies"). nginx allows 512
  // connections per worker by default (worker_connections; Debian's nginx.conf: 768), one worker per core;
  // 1024 covers a router's keep-alive pools plus direct clients. A body may be 32 MB (vLLM and SGLang set no
  // limit; nginx's client_max_body_size is 1 MB; a 128K-token prompt is about 1 MB of JSON). All bodies
  // together: 256 MB, eight of the largest or thousands of ordinary chat requests; nginx keeps only 8-16 KB
  // of each in memory (client_body_buffer_size) and spools the rest to disk.
  int max_connections = 1024;
  double max_buffered_body_mb = 256;
  // Parsing, chat templates, tokenizing and schema compiling run here, off the IO threads; 2 keeps one large
  // request from delaying the next one's parse. The queue matches --max-queued-requests: past it, 503.
  int request_threads = 0;
  int request_queue = 256;
  // Engine.
  int page_size = 16;
  double mem_fraction = 0;
  double cache_memory_gb = 0;
  // SGLang's --mem-fraction-static / vLLM's --gpu-memory-utilization: the share of all memory the server may
  // take, weights included; the cache gets what the loaded weights leave of it. The flag's name, for
  // messages.
  double total_mem_fraction = 0;
  std::string total_mem_flag;
  int chunked_prefill_size = 0;    // 0: the step budget
  int max_num_batched_tokens = 0;  // tokens per step; 0: the engine's default for the device
  bool disable_prefix_cache = false;
  dist::GroupOptions group;  // --tp, --nnodes, --node-rank, --dist-init-addr (docs/tp.md)
  std::string schedule_policy = "fcfs";
  std::string schedule_policy_vllm;  // --scheduling-policy: fcfs or priority
  bool enable_priority = false;
  bool low_priority_values_first = false;  // SGLang's switch to vLLM's direction
  bool priority_larger_first = false;
  int snapshot_slots = -1;
  std::string gdn_state_dtype = "float32";
  std::string kv_cache_dtype = "auto";
  SpeculativeFlags speculative;  // SGLang's --speculative-* and vLLM's --speculative-config
  int speculative_steps = 0;     // what they resolve to (engine/speculative.h)
  uint64_t seed = 0;
  std::string quantization;       // "fp8": the checkpoint must be FP8 (nothing is quantized at load)
  std::string system_root = "/";  // where /proc and /sys are read (tests play a machine)
  // Images (docs/vision.md).
  std::string limit_mm_per_prompt;  // vLLM's '{"image": N}' (SGLang: --limit-mm-data-per-request)
  int max_images_per_prompt = 999;  // what it resolves to (vLLM's default)
  bool language_model_only = false;
  bool disable_image_fetch = false;
  double max_image_mb = 20;                         // encoded bytes per image (OpenAI's limit)
  int64_t max_image_pixels = 89'478'485;            // decoded, PIL's MAX_IMAGE_PIXELS
  double image_fetch_timeout_s = 5;                 // vLLM's VLLM_IMAGE_FETCH_TIMEOUT
  int64_t max_image_patches_per_request = 262'144;  // server::ServiceOptions says why
  std::string mm_processor_kwargs;       // vLLM's '{"max_pixels": N, "min_pixels": M}' over the processor's
  std::string allowed_local_media_path;  // vLLM's: file:// image URLs from under this directory only
  double mm_encoder_cache_mb = 512;      // features of images seen again (engine/encoder_cache.h); 0 = off
  // Peers' flags that change nothing here, as "--flag value: why", logged once each at start.
  std::vector<std::string> no_effect;
};

constexpr const char* kDemo = "demo";
// Without --max-running-requests, the cache budget decides how many sequences run, up to this many: the
// largest decode batch measured (docs/cuda.md); vLLM's default max_num_seqs is 256 too.
constexpr int kMaxRunningRequests = 256;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_text_file(const std::string& path, const char* flag) {
  std::ifstream in(path);
  check(static_cast<bool>(in), "{} {}: cannot read the file", flag, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits for SIGINT/SIGTERM on its own thread (the signals are blocked everywhere else, so no other thread is
// ever interrupted). The first signal asks for a drain; a second one cuts it short.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);                   // our own wake-up at exit
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any thread starts: they inherit the mask
    thread_ = std::thread([this] { loop(); });
  }
  ~SignalWatcher() {
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  // Called for the first signal while the model is still loading (nothing to drain).
  std::function<void()> on_signal_while_loading;

  // Blocks until a signal arrives or `until` passes; returns the number of signals so far.
  int wait(Clock::time_point until = Clock::time_point::max()) {
    std::unique_lock lock(mutex_);
    cv_.wait_until(lock, until, [&] { return signals_ > seen_; });
    seen_ = signals_;
    return signals_;
  }
  int count() {
    std::lock_guard lock(mutex_);
    return signals_;
  }

 private:
  void loop() {
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || sig == SIGUSR1) return;
      spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      std::function<void()> loading;
      {
        std::lock_guard lock(mutex_);
        ++signals_;
        loading = on_signal_while_loading;
      }
      if (loading) loading();
      cv_.notify_all();
    }
  }

  sigset_t set_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int signals_ = 0;
  int seen_ = 0;
};

// Logs every few seconds while a long step (loading weights) runs, so an operator sees it is alive.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), start_(Clock::now()) {
    spdlog::info("{} ...", what_);
    thread_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      while (!cv_.wait_for(lock, 5s, [&] { return done_; })) {
        spdlog::info("{} ... {:.0f} s", what_, seconds_since(start_));
      }
    });
  }
  ~Progress() { finish(""); }
  void finish(const std::string& result) {
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    spdlog::info("{}: done in {:.1f} s{}{}", what_, seconds_since(start_), result.empty() ? "" : ", ",
                 result);
  }

 private:
  std::string what_;
  Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// A connection is a file descriptor: with the usual soft limit of 1024, accept() would fail before
// --max-connections is reached (and the excess would wait unanswered in the backlog). Raised towards the hard
// limit, as vLLM and SGLang do at start (their set_ulimit).
void raise_open_files_limit(size_t connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t want = connections + 256;  // + weights, logs, the engine's threads
  if (limit.rlim_cur < want) {
    rlimit raised = limit;
    raised.rlim_cur = std::min(want, limit.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur < want) {
    spdlog::warn("open files are limited to {} (ulimit -n): --max-connections {} may not be reached",
                 static_cast<uint64_t>(limit.rlim_cur), connections);
  }
}

std::string dtype_name(const ModelConfig& c) {
  if (c.fp8) return "fp8_e4m3 (block-scaled)";
  return c.dtype.empty() ? "bfloat16" : c.dtype;
}

// The demo model: the tiny preset with the real Qwen3 vocabulary, random weights made in memory.
ModelWeights demo_weights(const text::Tokenizer& tokenizer, const text::ModelText& text, uint64_t seed,
                          bool mtp, bool vision) {
  ModelConfig config = preset_config("tiny");
  if (mtp) config.mtp_num_layers = 1;      // random like the rest: speculative decoding runs, its drafts fail
  if (vision) add_mrope_sections(config);  // text alone rotates as before: its three positions are equal
  config.vocab_size =
      (static_cast<int64_t>(tokenizer.vocab_size()) + 255) / 256 * 256;  // padded, as Qwen does
  // 32K context: the default cache budget (every running request at full length) stays ~256 MiB, so a demo
  // server (and a local cluster of them) starts in a second instead of reserving gigabytes.
  config.max_position_embeddings = 32768;
  config.eos_token_ids.clear();
  for (int32_t id : text.stop_ids) config.eos_token_ids.push_back(id);
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    auto id = tokenizer.token_id(name);
    if (id && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), *id) ==
                  config.eos_token_ids.end()) {
      config.eos_token_ids.push_back(*id);
    }
  }
  return make_dummy_weights(config, seed);
}

// A tensor-parallel rank other than 0: no HTTP, it runs rank 0's steps on its shard until rank 0 stops.
int serve_tp_follower(const ServeOptions& o, dist::Communicator& group) {
  check(o.model != kDemo, "--model demo runs on one rank: drop --tp");
  ModelWeights full = o.load_format == "dummy"
                          ? make_dummy_weights(ModelConfig::from_file(o.model + "/config.json"), o.seed)
                          : load_checkpoint(o.model);
  ModelWeights shard = shard_weights(full, group.rank(), group.size());
  full = {};
  auto backend = make_backend(o.device);
  spdlog::info("rank {} of {} follows rank 0 ({})", group.rank(), group.size(), group.describe());
  int64_t steps = run_tp_follower(shard, *backend, group);
  spdlog::info("rank {}: rank 0 stopped after {} steps", group.rank(), steps);
  return 0;
}

// The KV cache and GDN state budget for SGLang's --mem-fraction-static or vLLM's --gpu-memory-utilization F:
// the server may take F of all the memory where its caches live, and the weights are loaded, so the caches
// get F x total less what is in use now. This is SGLang's rule (free after loading - total x (1 - F)); vLLM
// counts only its own process's use, which is the same number on a GPU nobody else uses.
int64_t cache_budget_of_total_share(const ServeOptions& o, Backend& backend, server::MemoryMonitor& memory) {
  std::optional<server::MemoryReading> now;
  if (auto device = backend.device_memory()) {
    now = server::MemoryReading{device->total_bytes - std::min(device->free_bytes, device->total_bytes),
                                device->total_bytes, o.device};
  } else {
    now = memory.read_host();
  }
  check(now && now->limit_bytes > 0, "{} {}: the total memory is unknown here; give --cache-memory-gb",
        o.total_mem_flag, o.total_mem_fraction);
  const double gib = 1 << 30;
  const int64_t share = static_cast<int64_t>(double(now->limit_bytes) * o.total_mem_fraction);
  const int64_t budget = share - static_cast<int64_t>(now->used_bytes);
  check(budget > 0,
        "{} {}: {:.2f} of the {:.2f} GiB ({}) are in use after loading the weights, more than that share; "
        "raise it or free memory",
        o.total_mem_flag, o.total_mem_fraction, now->used_bytes / gib, now->limit_bytes / gib, now->source);
  spdlog::info(
      "cache memory {} bytes ({:.2f} GiB) = {} x {:.2f} GiB total ({}) - {:.2f} GiB in use ({}: a share "
      "of all memory, weights included)",
      budget, budget / gib, o.total_mem_fraction, now->limit_bytes / gib, now->source, now->used_bytes / gib,
      o.total_mem_flag);
  return budget;
}

// The engine's options as the flags give them; serve() adds what needs the backend and the model.
EngineOptions engine_options_of(const ServeOptions& o) {
  EngineOptions engine_options;
  engine_options.page_size = o.page_size;
  engine_options.max_running_requests =
      o.max_running_requests > 0 ? o.max_running_requests : kMaxRunningRequests;
  engine_options.running_from_memory = true;
  engine_options.mem_fraction = o.mem_fraction;
  engine_options.cache_memory_bytes = static_cast<int64_t>(o.cache_memory_gb * (1 << 30));
  engine_options.chunked_prefill_size = o.chunked_prefill_size;
  engine_options.max_num_batched_tokens = o.max_num_batched_tokens;
  engine_options.max_model_len = o.max_model_len;
  engine_options.enable_prefix_cache = !o.disable_prefix_cache;
  engine_options.policy = o.schedule_policy == "lpm" ? SchedulePolicy::Lpm : SchedulePolicy::Fcfs;
  engine_options.snapshot_slots = o.snapshot_slots;
  engine_options.state_dtype = o.gdn_state_dtype == "bfloat16" ? StateDtype::BF16 : StateDtype::F32;
  engine_options.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  engine_options.speculative_num_steps = o.speculative_steps;
  engine_options.encoder_cache_bytes = static_cast<size_t>(o.mm_encoder_cache_mb * (1 << 20));
  return engine_options;
}

// Every rule a flag decides alone, checked before anything is read or loaded: a typo in a 35B model's launch
// line surfaces at once, not after the weights load.
void check_flags(const ServeOptions& o) {
  // NCCL needs the CUDA backend's stream (dist::GroupOptions::cuda_stream), which it does not hand out yet.
  check(o.group.tp == 1 || o.device == "cpu", "--tp {} runs on the CPU backend for now (docs/tp.md)",
        o.group.tp);
  check(!o.model.empty() || !o.preset.empty(), "--model is required (or --load-format dummy --preset NAME)");
  check(o.speculative_steps == 0 || o.group.tp == 1,
        "speculative decoding runs without tensor parallelism so far: drop --tp or --speculative-algorithm");
  check(o.preset.empty() || o.load_format == "dummy",
        "--preset {} makes random weights: add --load-format dummy", o.preset);
  check(o.memory_pressure_threshold >= 0 && o.memory_pressure_threshold <= 1,
        "--memory-pressure-threshold {}: expected a fraction in [0, 1] (0 turns it off)",
        o.memory_pressure_threshold);
  server::parse_allowed_origins(o.allowed_origins);  // a malformed list fails here, before loading
  if (o.quantization == "fp8") {
    // vLLM and SGLang quantize a BF16 checkpoint at load with --quantization fp8; moeserve serves FP8
    // checkpoints as they are and converts nothing, so a BF16 one would silently take twice the memory.
    // With --load-format dummy it makes FP8 random weights (on a GPU), as vLLM's dummy loader does.
    check(
        o.load_format != "dummy" || o.device != "cpu",
        "--quantization fp8 --load-format dummy: FP8 random weights are made on a GPU only (--device cuda)");
    check(
        o.load_format == "dummy" ||
            (o.model != kDemo && ModelConfig::from_file(o.model + "/config.json").fp8.has_value()),
        "--quantization fp8: {} not an FP8 checkpoint and moeserve does not quantize at load; serve the FP8 "
        "release (e.g. Qwen/Qwen3.5-35B-A3B-FP8) or drop the flag",
        o.model == kDemo ? "the demo model's random weights are BF16," : o.model + " is");
  }
  text::OutputParserOptions parsers;
  parsers.reasoning_parser = o.reasoning_parser;
  parsers.tool_parser = o.tool_call_parser;
  text::validate_parser_names(parsers);
  check(
      static_cast<size_t>(o.max_buffered_body_mb * 1024 * 1024) >=
          static_cast<size_t>(o.max_request_body_mb * 1024 * 1024),
      "--max-buffered-body-mb {} is below --max-request-body-mb {}: the largest request could never be read",
      o.max_buffered_body_mb, o.max_request_body_mb);
  check(o.max_connections > 0, "--max-connections {}: expected at least 1", o.max_connections);
  if (!o.allowed_local_media_path.empty()) server::canonical_media_dir(o.allowed_local_media_path);
  check(o.mm_encoder_cache_mb >= 0, "--mm-encoder-cache-mb {}: expected 0 (off) or more",
        o.mm_encoder_cache_mb);
  check(o.max_image_mb > 0 && o.max_image_pixels > 0 && o.image_fetch_timeout_s > 0 &&
            o.max_image_patches_per_request > 0,
        "--max-image-mb, --max-image-pixels, --image-fetch-timeout and --max-image-patches-per-request must "
        "be positive");
  check_engine_options(engine_options_of(o));
}

// The checkpoint's text side: the tokenizer, the stop ids and the chat template (none: token ids only).
struct ServedText {
  std::optional<text::ModelText> text;
  std::shared_ptr<const text::ChatTemplate> chat_template;
};

ServedText load_text(const ServeOptions& o) {
  const bool demo = o.model == kDemo;
  ServedText served;
  auto& text = served.text;
  // The demo's Qwen3 tokenizer is looked for from the binary's location too (server/demo_model.h).
  std::string text_dir = !o.tokenizer.empty() ? o.tokenizer : demo ? server::find_demo_tokenizer() : o.model;
  if (std::filesystem::exists(text_dir + "/tokenizer.json")) {
    Progress p("loading the tokenizer from " + text_dir);
    text = text::ModelText::load(text_dir);
    p.finish(fmt::format("{} tokens", text->tokenizer.vocab_size()));
  } else {
    check(!demo, "--model demo: no tokenizer.json in --tokenizer {}", text_dir);
    spdlog::warn("no tokenizer.json in {}: serving token ids only (/v1/completions with token-id prompts)",
                 text_dir);
  }
  if (text) {
    std::string source =
        !o.chat_template.empty() ? read_text_file(o.chat_template, "--chat-template") : text->chat_template;
    if (!source.empty()) {
      served.chat_template = std::make_shared<text::ChatTemplate>(source, text->bos_token, text->eos_token);
    } else {
      spdlog::warn(
          "no chat template (tokenizer_config.json or --chat-template): /v1/chat/completions answers 400");
    }
  }
  return served;
}

// Why serve loads no vision tower under these flags ("" when it does, if the model has one).
std::string images_off_by_flags(const ServeOptions& o) {
  return o.language_model_only ? "this server runs with --language-model-only: images are not accepted"
         : o.group.tp > 1      ? "images are served on one rank so far (without --tp)"
                               : "";
}

// The tokenizer's vision tokens by name, or empty when it lacks one.
std::map<std::string, int64_t> vision_token_ids(const text::Tokenizer& tokenizer) {
  std::map<std::string, int64_t> ids;
  for (const char* name : {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"}) {
    auto id = tokenizer.token_id(name);
    if (!id) return {};
    ids[name] = *id;
  }
  return ids;
}

// A random tower's shape as the checkpoint's vision_config gives it (--load-format dummy --model DIR).
VisionShape vision_shape_of(const VisionConfig& c) {
  check(c.patch_size == 16 && c.temporal_patch_size == 2 && c.spatial_merge_size == 2,
        "--load-format dummy: random vision towers have patch 16, temporal patch 2 and merge 2 (Qwen3.5's); "
        "config.json's vision_config has {}, {} and {}",
        c.patch_size, c.temporal_patch_size, c.spatial_merge_size);
  return {c.depth, c.hidden_size, c.intermediate_size, c.num_heads, c.num_position_embeddings};
}

// The vision tower serve runs, or nullopt with `why_not` saying why there is none. The demo and a
// --load-format dummy preset get a random tower of the preset's shape (model/init_model.h: the release's 27
// blocks of 1152 for the full-size presets) with the tokenizer's vision tokens; a checkpoint directory's
// comes from its config.json (random weights of that shape under --load-format dummy).
std::optional<VisionConfig> served_vision(const ServeOptions& o, const std::optional<text::ModelText>& text,
                                          std::string& why_not) {
  why_not = images_off_by_flags(o);
  if (!why_not.empty()) return std::nullopt;
  const bool demo = o.model == kDemo;
  if (demo || o.model.empty()) {
    std::map<std::string, int64_t> ids;
    if (text) {
      ids = vision_token_ids(text->tokenizer);
      if (ids.empty()) {
        why_not = "the tokenizer has no vision tokens (<|vision_start|>, <|image_pad|>, ...)";
        return std::nullopt;
      }
    }
    ModelConfig config = preset_config(demo ? "tiny" : o.preset);
    return VisionConfig::from_json(dummy_vision_config(config, ids, default_vision_shape(config)));
  }
  auto config = VisionConfig::from_dir(o.model);
  if (!config) why_not = "this model takes text only (its checkpoint has no vision tower)";
  return config;
}

// vLLM's --mm-processor-kwargs: the resize bounds (min_pixels, max_pixels, or size's shortest_edge and
// longest_edge, pixel counts as in preprocessor_config.json) over the checkpoint's. Other keys are refused:
// they would change nothing here.
void apply_mm_processor_kwargs(const std::string& flag, ImageProcessorConfig& processor) {
  nlohmann::json kwargs;
  try {
    kwargs = nlohmann::json::parse(flag);
  } catch (const std::exception& e) {
    fail("--mm-processor-kwargs {}: not JSON ({})", flag, e.what());
  }
  check(kwargs.is_object(),
        R"(--mm-processor-kwargs {}: expected an object such as '{{"max_pixels": 1003520}}')", flag);
  for (const auto& item : kwargs.items()) {
    const std::string& key = item.key();
    check(key == "min_pixels" || key == "max_pixels" || key == "size",
          "--mm-processor-kwargs: {} is not taken (min_pixels, max_pixels and size are)", key);
  }
  // from_json reads size first and then min_pixels / max_pixels over it, as the processor does.
  nlohmann::json merged = kwargs;
  merged["size"] = {{"shortest_edge", processor.min_pixels}, {"longest_edge", processor.max_pixels}};
  if (kwargs.contains("size")) {
    check(kwargs["size"].is_object(), "--mm-processor-kwargs: size must be an object");
    merged["size"].update(kwargs["size"]);
  }
  try {
    ImageProcessorConfig bounds = ImageProcessorConfig::from_json(merged);
    processor.min_pixels = bounds.min_pixels, processor.max_pixels = bounds.max_pixels;
  } catch (const Error& e) {
    fail("--mm-processor-kwargs {}: {}", flag, e.what());
  }
}

void set_image_options(const ServeOptions& o, const std::optional<text::ModelText>& text,
                       server::ServiceOptions& service) {
  std::string why_not;
  if (auto vision = served_vision(o, text, why_not)) {
    const bool checkpoint = o.model != kDemo && !o.model.empty();
    service.image_processor = checkpoint ? ImageProcessorConfig::from_dir(o.model) : ImageProcessorConfig{};
    service.image_processor->merge_size = vision->spatial_merge_size;
    if (!o.mm_processor_kwargs.empty())
      apply_mm_processor_kwargs(o.mm_processor_kwargs, *service.image_processor);
    service.image_token_id = vision->image_token_id;
  }
  service.max_image_patches_per_request = o.max_image_patches_per_request;
  service.images_off = why_not;
  service.max_images_per_prompt = o.max_images_per_prompt;
  service.image_fetch.allow_fetch = !o.disable_image_fetch;
  service.image_fetch.max_bytes = static_cast<size_t>(o.max_image_mb * 1024 * 1024);
  service.image_fetch.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o.image_fetch_timeout_s * 1000));
  service.image_fetch.decode.max_pixels = o.max_image_pixels;
  if (!o.allowed_local_media_path.empty())
    service.image_fetch.allowed_local_media_path = server::canonical_media_dir(o.allowed_local_media_path);
}

server::ServiceOptions service_options_of(const ServeOptions& o, const std::optional<text::ModelText>& text,
                                          std::shared_ptr<const text::ChatTemplate> chat_template) {
  const bool demo = o.model == kDemo;
  server::ServiceOptions service_options;
  service_options.served_model_name = !o.served_model_name.empty() ? o.served_model_name
                                      : demo                       ? "moeserve-demo"
                                      : o.model.empty()            ? o.preset
                                                                   : o.model;
  service_options.model_path = o.model;
  std::string key_source;
  service_options.api_key = server::api_key_from_environment(o.api_key, &key_source);
  if (!service_options.api_key.empty()) spdlog::info("API key required (from {})", key_source);
  service_options.queue_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.queue_timeout_s * 1000));
  service_options.chat_template = std::move(chat_template);
  service_options.reasoning_parser = o.reasoning_parser;
  service_options.tool_call_parser = o.tool_call_parser;
  service_options.enable_priority = o.enable_priority;
  service_options.priority_larger_first = o.priority_larger_first;
  service_options.allowed_origins = server::parse_allowed_origins(o.allowed_origins);
  service_options.tokenizer_path = o.tokenizer;
  service_options.vllm_metrics = o.vllm_metrics;
  service_options.incremental_streaming_output = o.incremental_streaming_output;
  set_image_options(o, text, service_options);
  if (!demo && !o.model.empty()) {
    service_options.sampling_defaults = server::SamplingDefaults::load(o.model);
    if (!service_options.sampling_defaults.empty()) {
      spdlog::info("sampling defaults from generation_config.json: {}",
                   service_options.sampling_defaults.summary());
    }
  }
  return service_options;
}

server::AdmissionOptions admission_options_of(const ServeOptions& o,
                                              const server::ServiceOptions& service_options) {
  server::AdmissionOptions admission_options;
  // Until the engine has sized its running set (serve() then sets it): no request runs before that anyway.
  admission_options.max_running = o.max_concurrency > 0 ? o.max_concurrency : o.max_running_requests;
  admission_options.max_queued = o.max_queued_requests;
  admission_options.queue_timeout = service_options.queue_timeout;
  admission_options.memory_pressure_threshold = o.memory_pressure_threshold;
  return admission_options;
}

server::HttpServerOptions http_options_of(const ServeOptions& o, server::ServerMetrics& metrics) {
  server::HttpServerOptions http;
  http.host = o.host;
  http.port = o.port;
  http.threads = o.http_threads > 0
                     ? o.http_threads
                     : static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 1u, 8u));
  http.max_body_bytes = static_cast<size_t>(o.max_request_body_mb * 1024 * 1024);
  http.max_buffered_body_bytes = static_cast<size_t>(o.max_buffered_body_mb * 1024 * 1024);
  http.max_connections = static_cast<size_t>(o.max_connections);
  http.worker_threads = o.request_threads > 0
                            ? o.request_threads
                            : static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 2u, 8u));
  http.max_queued_work = static_cast<size_t>(std::max(0, o.request_queue));
  http.keep_alive_timeout = std::chrono::seconds(static_cast<int64_t>(o.keep_alive_timeout_s));
  http.on_protocol_error = [&metrics](int status) { metrics.request_error(status); };
  return http;
}

// A GPU's device memory is a memory-pressure source next to the host's; the most pressured one wins.
void watch_device_memory(const ServeOptions& o, Backend& backend, server::MemoryMonitor& memory) {
  if (auto m = backend.device_memory()) {
    spdlog::info("memory pressure: {} device memory is watched too ({:.1f} of {:.1f} GiB in use)", o.device,
                 double(m->total_bytes - std::min(m->free_bytes, m->total_bytes)) / (1 << 30),
                 double(m->total_bytes) / (1 << 30));
    Backend* b = &backend;
    memory.add_source(o.device, [b, name = o.device]() -> std::optional<server::MemoryReading> {
      auto now = b->device_memory();
      if (!now) return std::nullopt;
      return server::MemoryReading{now->total_bytes - std::min(now->free_bytes, now->total_bytes),
                                   now->total_bytes, name};
    });
  }
}

struct LoadedModel {
  ModelWeights weights;
  std::optional<VisionWeights> vision;  // the tower, when served_vision says so
};

LoadedModel load_model(const ServeOptions& o, const std::optional<text::ModelText>& text, Backend& backend) {
  std::string why_not;
  const std::optional<VisionConfig> vision_config = served_vision(o, text, why_not);
  // A random tower of that config's shape, its merger feeding the text model `config`.
  auto random_tower = [&](const ModelConfig& config) {
    Progress p(fmt::format("building a random vision tower ({} blocks of {})", vision_config->depth,
                           vision_config->hidden_size));
    DummyVision tower = make_dummy_vision(config, o.seed, {}, vision_shape_of(*vision_config));
    return load_vision_weights(tower.tensors, *vision_config);
  };
  if (o.model == kDemo) {
    LoadedModel demo;
    {
      Progress p("building the demo model (random weights, Qwen3 vocabulary)");
      demo.weights =
          demo_weights(text->tokenizer, *text, o.seed, o.speculative_steps > 0, vision_config.has_value());
    }
    if (vision_config) demo.vision = random_tower(demo.weights.config);
    return demo;
  }
  if (o.load_format == "dummy") {
    const std::string shape = o.preset.empty() ? o.model + "/config.json" : "preset " + o.preset;
    ModelConfig config =
        o.preset.empty() ? ModelConfig::from_file(o.model + "/config.json") : preset_config(o.preset);
    if (vision_config) add_mrope_sections(config);  // text alone rotates as before: its positions are equal
    LoadedModel dummy;
    {
      Progress p("building random weights for " + shape + " (--load-format dummy)");
      dummy.weights = make_dummy_weights_on(backend, config, o.seed, o.quantization == "fp8");
    }
    if (vision_config) dummy.vision = random_tower(dummy.weights.config);
    return dummy;
  }
  Progress p("loading weights from " + o.model);
  if (!vision_config) return {load_checkpoint(o.model), std::nullopt};
  Checkpoint checkpoint = open_checkpoint(o.model);
  VisionWeights vision = load_vision_weights(checkpoint.tensors, *vision_config);
  return {std::move(checkpoint.weights), std::move(vision)};
}

// Weights and caches are in place: a server already past its pressure threshold would answer every request
// 503, so it stops here with the numbers instead.
void check_memory_after_load(const ServeOptions& o, server::MemoryMonitor& memory) {
  if (o.memory_pressure_threshold > 0) {
    server::MemoryReading now = memory.reading();
    check(now.fraction() < o.memory_pressure_threshold,
          "{} memory is {:.1f} of {:.1f} GiB ({:.2f}) after loading the model and its caches, above "
          "--memory-pressure-threshold {}: every request would be refused. Lower --mem-fraction or "
          "--cache-memory-gb, or raise the threshold",
          now.source, double(now.used_bytes) / (1 << 30), double(now.limit_bytes) / (1 << 30), now.fraction(),
          o.memory_pressure_threshold);
  }
}

// After SIGTERM/SIGINT: no new requests, those in flight get until --shutdown-timeout (a second signal ends
// the wait), then the rest are aborted.
void drain(const ServeOptions& o, SignalWatcher& signals, server::OpenAiService& service,
           server::HttpServer& http_server, Engine& engine) {
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout_s * 1000));
  service.begin_drain();
  spdlog::info("draining: {} requests in flight, up to {:.0f} s (a second signal stops at once)",
               service.in_flight(), o.shutdown_timeout_s);
  while (service.in_flight() > 0 && Clock::now() < deadline && signals.count() < 2) {
    std::this_thread::sleep_for(20ms);
  }
  if (size_t left = service.in_flight(); left > 0) {
    spdlog::warn("shutdown: aborting {} requests still in flight", left);
    service.abort_all();
    auto abort_deadline = Clock::now() + 5s;
    while (service.in_flight() > 0 && Clock::now() < abort_deadline) std::this_thread::sleep_for(10ms);
  }
  http_server.stop(2s);  // lets the last responses finish writing
  engine.shutdown();
}

int serve(const ServeOptions& o) {
  check_flags(o);
  auto group = dist::open_group(o.group);
  if (group->rank() != 0) return serve_tp_follower(o, *group);
  std::atomic<bool> loading{true};  // before the watcher: its thread reads it until the watcher is gone
  SignalWatcher signals;
  bool demo = o.model == kDemo;
  signals.on_signal_while_loading = [&loading] {
    if (loading) {
      spdlog::info("stopped while loading");
      std::_Exit(0);
    }
  };

  // Text first (fast): the tokenizer, the chat template and the stop ids.
  ServedText served = load_text(o);
  std::optional<text::ModelText>& text = served.text;
  server::ServiceOptions service_options = service_options_of(o, served.text, served.chat_template);
  server::ServerMetrics metrics(service_options.served_model_name);
  auto memory = std::make_shared<server::MemoryMonitor>(o.system_root);
  server::Admission admission(admission_options_of(o, service_options), memory);
  metrics.set_sources(nullptr, &admission);
  server::OpenAiService service(service_options, nullptr, text ? &text->tokenizer : nullptr, admission,
                                metrics);

  // Declared before the HTTP server, so destroyed after it: its device memory is read from HTTP threads.
  std::unique_ptr<Backend> backend;
  // Start listening before loading weights: /health says 503 (loading) until the engine is up.
  server::HttpServerOptions http = http_options_of(o, metrics);
  raise_open_files_limit(http.max_connections);
  service.configure(http);
  server::HttpServer http_server(http, [&service](server::HttpRequest& r) { return service.handle(r); });
  http_server.start();
  std::string url =
      fmt::format("http://{}:{}", o.host == "0.0.0.0" ? "127.0.0.1" : o.host, http_server.port());
  spdlog::info("listening on {}:{} (/health answers 503 until the model is loaded)", o.host,
               http_server.port());

  backend = make_backend(o.device);  // outlives the engine
  EngineOptions engine_options = engine_options_of(o);
  engine_options.backend = backend.get();
  watch_device_memory(o, *backend, *memory);
  LoadedModel loaded = load_model(o, text, *backend);
  ModelWeights& weights = loaded.weights;
  if (loaded.vision) {
    engine_options.vision = &*loaded.vision;
    spdlog::info("vision tower: {} blocks of {}; images up to {} per prompt, fetching {}",
                 loaded.vision->config.depth, loaded.vision->config.hidden_size, o.max_images_per_prompt,
                 o.disable_image_fetch ? "off (data: URLs only)" : "on");
  } else {
    spdlog::info("images: off ({})", service_options.images_off);
  }

  if (o.total_mem_fraction > 0) {
    engine_options.cache_memory_bytes = cache_budget_of_total_share(o, *backend, *memory);
  }
  if (text && !text->stop_ids.empty() && weights.config.eos_token_ids.empty()) {
    engine_options.eos_token_ids = text->stop_ids;
  }
  // --tp N: this rank's shard; the followers mirror the engine's steps, not its prefix-cache state copies.
  if (group->size() > 1) {
    check(!demo, "--model demo runs on one rank: drop --tp");
    weights = shard_weights(weights, 0, group->size());
    engine_options.enable_prefix_cache = false;
    spdlog::info("tensor-parallel rank 0 of {} ({}); prefix cache off", group->size(), group->describe());
  }
  std::unique_ptr<Engine> engine;
  {
    Progress p("allocating the KV cache and GDN state slots");
    engine = group->size() > 1
                 ? Engine::create(make_tp_leader_runner(weights, *backend, *group), engine_options)
                 : Engine::create(weights, engine_options);
    p.finish(engine->capacity().summary());
  }
  const EngineCapacity& cap = engine->capacity();
  if (o.max_concurrency == 0) admission.set_max_running(cap.live_slots);

  Engine* engine_ptr = engine.get();
  metrics.set_sources([engine_ptr] { return std::optional<EngineStats>(engine_ptr->stats()); }, &admission);
  service.set_engine(engine_ptr, cap.max_model_len);
  check_memory_after_load(o, *memory);
  spdlog::info(
      "settings: model={} served as {}, device={}, tp={}, max_model_len={}, max_running_requests={}, "
      "max_num_batched_tokens={}, chunked_prefill_size={}, prefix_cache={}, reasoning_parser={}, "
      "tool_call_parser={}, priority={}",
      demo ? "demo" : o.model, service_options.served_model_name, o.device, group->size(), cap.max_model_len,
      cap.live_slots, cap.max_num_batched_tokens, cap.chunked_prefill_size,
      engine_options.enable_prefix_cache ? "on" : "off",
      o.reasoning_parser.empty() ? "off" : o.reasoning_parser,
      o.tool_call_parser.empty() ? "off" : o.tool_call_parser,
      !o.enable_priority        ? "off"
      : o.priority_larger_first ? "larger first"
                                : "smaller first");
  service.set_ready(true);
  loading = false;

  std::printf(
      "moeserve ready: model=%s dtype=%s kv_tokens=%lld kv_cache_dtype=%s state_slots=%d (+%d snapshots) "
      "max_model_len=%lld url=%s\n",
      service_options.served_model_name.c_str(), dtype_name(weights.config).c_str(),
      static_cast<long long>(cap.kv_tokens), std::string(kv_cache_dtype_name(cap.kv_dtype)).c_str(),
      cap.live_slots, cap.snapshot_slots, static_cast<long long>(cap.max_model_len), url.c_str());
  std::fflush(stdout);

  signals.wait();
  drain(o, signals, service, http_server, *engine);
  spdlog::info("stopped");
  return 0;
}

// One value of a choice-valued flag: a spelling (ours or a peer's) and the value it means, or the reason it
// is refused here.
struct Choice {
  std::string spelling;
  std::string value;  // "" with a refusal
  std::string refusal = {};
};

// Checked (and peers' spellings mapped to ours) while the command line is parsed, before anything loads;
// CLI11 puts the flag's name in front of the message.
CLI::Validator one_of(std::vector<Choice> choices) {
  std::vector<std::string> names;
  for (const auto& c : choices)
    if (c.refusal.empty()) names.push_back(c.spelling.empty() ? "''" : c.spelling);
  std::string list = fmt::format("{}", fmt::join(names, ", "));
  return CLI::Validator(
      [choices, list](std::string& v) -> std::string {
        for (const auto& c : choices) {
          if (c.spelling != v) continue;
          if (!c.refusal.empty()) return fmt::format("{}: {}", v, c.refusal);
          v = c.value;
          return "";
        }
        return fmt::format("'{}' is not one of {}", v, list);
      },
      "{" + list + "}");
}

std::vector<Choice> same(std::initializer_list<const char*> values) {
  std::vector<Choice> out;
  for (const char* v : values) out.push_back({v, v});
  return out;
}

constexpr const char* kNoEffect =
    "Accepted for SGLang and vLLM command lines, no effect here (one log line each)";

// The flags of `python -m sglang.launch_server` and `vllm serve` that change nothing in moeserve: accepted so
// a peer's launch line runs unchanged, and each one given says so in the log (docs/compat.md).
void add_no_effect_flags(CLI::App& cmd, const std::shared_ptr<ServeOptions>& o) {
  auto flag = [&](const std::string& name, const std::string& why) {
    cmd.add_flag_callback(
           name, [o, name, why] { o->no_effect.push_back(fmt::format("{}: {}", name, why)); }, why)
        ->group(kNoEffect);
  };
  auto option = [&](const std::string& name, const std::string& why) {
    cmd.add_option(name, why)
        ->each([o, name, why](const std::string& v) {
          o->no_effect.push_back(fmt::format("{} {}: {}", name, v, why));
        })
        ->group(kNoEffect);
  };
  flag("--trust-remote-code", "moeserve runs no code from the checkpoint; Qwen3.5 is built in");
  flag("--enable-metrics", "/metrics is always served");
  flag("--enable-auto-tool-choice", "tool_choice auto always works when a --tool-call-parser is set");
  flag("--enable-prefix-caching", "the prefix cache is on unless --disable-prefix-cache");
  flag("--enable-chunked-prefill", "prefill is always chunked (--chunked-prefill-size)");
  flag("--enable-cache-report", "usage.prompt_tokens_details.cached_tokens is always reported");
  flag("--enable-mixed-chunk", "the scheduler decides how prefill and decode share a step");
  flag("--disable-overlap-schedule", "the engine's step loop has no overlap switch");
  flag("--async-scheduling", "the engine's step loop has no overlap switch");
  flag("--disable-cuda-graph", "the CUDA backend decides where it uses graphs");
  flag("--enforce-eager", "the CUDA backend decides where it uses graphs");
  flag("--enable-torch-compile", "nothing is compiled at start");
  flag("--skip-server-warmup", "there is no warmup");
  flag("--enable-ep-moe", "the experts are sharded by --tp");
  flag("--enable-expert-parallel", "the experts are sharded by --tp");
  flag("--log-requests", "request logging follows --log-level");
  flag("--enable-log-requests", "request logging follows --log-level");
  flag("--disable-log-requests", "request logging follows --log-level");
  flag("--disable-log-stats", "statistics are on /metrics, not in the log");
  flag("--disable-uvicorn-access-log", "there is no access log");
  flag("--enable-request-id-headers", "X-Request-Id needs no flag");
  option("--attention-backend", "moeserve picks its own kernels");
  option("--moe-runner-backend", "moeserve picks its own kernels");
  option("--sampling-backend", "moeserve picks its own kernels");
  option("--grammar-backend", "structured output uses moeserve's own matcher");
  option("--cuda-graph-max-bs", "the CUDA backend decides where it uses graphs");
  option("--ep-size,--ep", "the experts are sharded by --tp");
  option("--mamba-scheduler-strategy", "GDN state snapshots are moeserve's own (--snapshot-slots)");
  option("--schedule-conservativeness", "admission has no such knob");
  option("--random-seed", "sampling seeds come with each request (seed)");
  option("--watchdog-timeout", "there is no watchdog");
  option("--dist-timeout", "the tensor-parallel group has its own timeouts");
  option("--nccl-port", "the tensor-parallel group meets at --dist-init-addr");
  option("--distributed-executor-backend", "ranks are processes of their own (docs/tp.md)");
  option("--swap-space", "the KV cache is never swapped to host memory");
  option("--compilation-config", "nothing is compiled at start");
  option("--generation-config", "no effect yet");
  option("--uvicorn-log-level", "use --log-level");
  option("--max-log-len", "request logging follows --log-level");
  option("--mm-encoder-tp-mode", "the vision tower runs on one device, unsharded");
  option("--mm-attention-backend", "the vision tower's attention is moeserve's own kernel");
  option("--mm-processor-cache-gb", "preprocessed images are not cached (the prefix cache keys on them)");
  flag("--disable-mm-preprocessor-cache",
       "preprocessed images are not cached (the prefix cache keys on them)");
  flag("--enable-multimodal", "a checkpoint with a vision tower serves images unless --language-model-only");
  option("--download-dir", "moeserve reads a local checkpoint directory");
  option("--revision", "moeserve reads a local checkpoint directory");
}

// Peers' flags with no counterpart: what to use instead (an unknown flag's error says it).
std::string serve_flag_hint(const std::string& flag) {
  static const std::vector<std::pair<std::vector<std::string>, std::string>> hints = {
      {{"--max-total-tokens"}, "--cache-memory-gb (the KV cache and GDN state budget in GiB)"},
      {{"--dp-size", "--dp", "--data-parallel-size"}, "one moeserve serve per GPU behind `moeserve route`"},
      {{"--pipeline-parallel-size", "--pp-size", "--pp"}, "--tp (there is no pipeline parallelism)"},
      {{"--enable-lora", "--lora-modules", "--lora-paths"}, "none: LoRA adapters are not supported"},
      {{"--cpu-offload-gb"}, "none: the weights stay where the backend runs"},
      {{"--enable-reasoning"}, "--reasoning-parser qwen3 (the default)"},
      {{"--guided-decoding-backend", "--structured-outputs-config"},
       "none: structured output uses moeserve's own matcher"},
  };
  for (const auto& [names, hint] : hints)
    if (std::find(names.begin(), names.end(), flag) != names.end()) return hint;
  return "";
}

// --limit-mm-per-prompt (vLLM) / --limit-mm-data-per-request (SGLang): a JSON object of counts per modality.
// Images are the one modality here; a limit on another is noted as having no effect.
int image_limit(const std::string& flag, std::vector<std::string>& no_effect) {
  nlohmann::json limits;
  try {
    limits = parse_bounded_json<nlohmann::json>(flag);
  } catch (const std::exception& e) {
    fail("--limit-mm-per-prompt {}: not JSON ({}); expected e.g. '{{\"image\": 4}}'", flag, e.what());
  }
  check(limits.is_object(), "--limit-mm-per-prompt {}: expected an object such as '{{\"image\": 4}}'", flag);
  int images = 999;
  for (const auto& [modality, value] : limits.items()) {
    check(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= 1'000'000,
          "--limit-mm-per-prompt: {} must be a count, got {}", modality, value.dump());
    if (modality == "image")
      images = value.get<int>();
    else
      no_effect.push_back(fmt::format("--limit-mm-per-prompt {}: this server takes images only", modality));
  }
  return images;
}

// What the peers' spellings mean once all flags are in: one model, one memory rule, one chunk size, one
// priority direction, and the device --device auto picks. Errors name the flags.
void resolve_peer_flags(ServeOptions& o, const CLI::App& cmd, const std::string& positional_model) {
  auto given = [&](const char* name) { return cmd.count(name) > 0; };
  if (!positional_model.empty()) {
    check(o.model.empty() || o.model == positional_model, "the model is given twice: {} and --model {}",
          positional_model, o.model);
    o.model = positional_model;
  }
  // vllm serve Qwen/Qwen3.5-35B-A3B names a Hugging Face repository; moeserve downloads nothing.
  if (!o.model.empty() && o.model != kDemo && !std::filesystem::exists(o.model) && o.model.front() != '/' &&
      o.model.front() != '.' && std::count(o.model.begin(), o.model.end(), '/') == 1) {
    fail(
        "--model {}: no such directory; moeserve reads a local checkpoint (download it first, e.g. "
        "`huggingface-cli download {} --local-dir DIR`, then --model DIR)",
        o.model, o.model);
  }

  for (const char* flag : {"--mem-fraction-static", "--gpu-memory-utilization"})
    if (given(flag)) o.total_mem_flag = flag;
  if (!o.total_mem_flag.empty()) {
    check(!given("--mem-fraction-static") || !given("--gpu-memory-utilization"),
          "--mem-fraction-static and --gpu-memory-utilization both given: they mean the same, give one");
    check(!given("--mem-fraction") && !given("--cache-memory-gb"), "{} and {} both size the cache: give one",
          o.total_mem_flag, given("--mem-fraction") ? "--mem-fraction" : "--cache-memory-gb");
    check(o.total_mem_fraction > 0 && o.total_mem_fraction <= 1, "{} {}: expected a share in (0, 1]",
          o.total_mem_flag, o.total_mem_fraction);
    // The server is meant to reach that share: the memory-pressure refusal starts above it, as plan sets it.
    if (!given("--memory-pressure-threshold")) {
      o.memory_pressure_threshold = std::min(1.0, o.total_mem_fraction + 0.10);
    }
  }

  check(!given("--max-running-requests") || o.max_running_requests > 0,
        "max running requests must be positive, got {}", o.max_running_requests);
  if (given("--chunked-prefill-size")) {
    check(o.chunked_prefill_size > 0 || o.chunked_prefill_size == -1,
          "--chunked-prefill-size {}: expected a positive token count, or -1 (off)", o.chunked_prefill_size);
    // SGLang's -1: every prompt is prefilled whole, in one step.
    if (o.chunked_prefill_size == -1) o.chunked_prefill_size = 1 << 30;
    // SGLang's chunk is its prefill step: it bounds the step too, unless --max-prefill-tokens does.
    if (!given("--max-prefill-tokens")) o.max_num_batched_tokens = o.chunked_prefill_size;
  }
  if (given("--max-num-batched-tokens")) {
    check(!given("--chunked-prefill-size") && !given("--max-prefill-tokens"),
          "--max-num-batched-tokens and {} both set the prefill step: give one",
          given("--chunked-prefill-size") ? "--chunked-prefill-size" : "--max-prefill-tokens");
  }
  for (const char* flag : {"--max-num-batched-tokens", "--max-prefill-tokens"})
    if (given(flag))
      check(o.max_num_batched_tokens > 0, "{} {}: expected a positive token count", flag,
            o.max_num_batched_tokens);

  // vLLM's priority: smaller first (ours). SGLang's: larger first unless
  // --schedule-low-priority-values-first.
  const bool vllm_priority = cmd.count("--scheduling-policy") > 0 && o.schedule_policy_vllm == "priority";
  const bool low_first = o.low_priority_values_first;
  if (o.enable_priority) {
    check(
        !vllm_priority || low_first,
        "--enable-priority-scheduling (SGLang: larger values first) and --scheduling-policy priority (vLLM: "
        "smaller first) disagree: give one, or add --schedule-low-priority-values-first");
    o.priority_larger_first = !low_first && !vllm_priority;
  } else if (low_first) {
    o.no_effect.push_back("--schedule-low-priority-values-first: without --enable-priority-scheduling");
  }
  if (vllm_priority) o.enable_priority = true;

  if (o.device == "auto") {
    o.device = cuda_available() ? "cuda" : "cpu";
    spdlog::info("--device auto: {}", o.device == "cuda" ? "cuda (a GPU is visible and this build has CUDA)"
                                                         : "cpu (no GPU visible, or a build without CUDA)");
  }
  o.speculative_steps = speculative_steps(o.speculative);
  if (!o.limit_mm_per_prompt.empty())
    o.max_images_per_prompt = image_limit(o.limit_mm_per_prompt, o.no_effect);
  std::sort(o.no_effect.begin(), o.no_effect.end());
  o.no_effect.erase(std::unique(o.no_effect.begin(), o.no_effect.end()), o.no_effect.end());
  for (const auto& line : o.no_effect) spdlog::info("no effect here: {}", line);
}

void add_serve_flags(CLI::App& cmd, const std::shared_ptr<ServeOptions>& o, std::string& positional_model) {
  // As argparse does (SGLang and vLLM): a flag given twice takes its last value, so a launch line can be
  // extended by appending flags.
  cmd.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("model", positional_model, "the model, as `vllm serve MODEL` takes it (same as --model)");
  cmd.add_option("--model,--model-path", o->model,
                 "checkpoint directory, or 'demo' for the built-in demo model");
  cmd.add_option(
      "--preset", o->preset,
      "with --load-format dummy: random weights of a built-in shape (e.g. 35b-a3b; made on the GPU "
      "with --device cuda) instead of --model's config.json");
  cmd.add_option("--load-format", o->load_format,
                 "auto (read the safetensors; vLLM's safetensors, fastsafetensors and instanttensor mean the "
                 "same) or dummy (random weights of config.json's shape)")
      ->transform(one_of({{"auto", "auto"},
                          {"safetensors", "auto"},
                          {"fastsafetensors", "auto"},
                          {"instanttensor", "auto"},
                          {"dummy", "dummy"}}))
      ->capture_default_str();
  cmd.add_option("--device", o->device,
                 "backend: auto (the GPU when this build and the host have one), cpu or cuda")
      ->transform(one_of(same({"auto", "cpu", "cuda"})))
      ->capture_default_str();
  cmd.add_option("--tokenizer,--tokenizer-path", o->tokenizer,
                 "directory with tokenizer.json (default: the model's)");
  cmd.add_option("--dtype", "weights and activations: auto or bfloat16 (FP8 checkpoints stay FP8)")
      ->transform(one_of({{"auto", "auto"},
                          {"bfloat16", "bfloat16"},
                          {"bf16", "bfloat16"},
                          {"half", "", "moeserve computes in bfloat16 (use auto)"},
                          {"float16", "", "moeserve computes in bfloat16 (use auto)"},
                          {"float", "", "moeserve computes in bfloat16 (use auto)"},
                          {"float32", "", "moeserve computes in bfloat16 (use auto)"}}));
  cmd.add_option("-q,--quantization", o->quantization,
                 "fp8: the checkpoint must be FP8 (moeserve does not quantize at load); none: as it is")
      ->transform(one_of({{"fp8", "fp8"}, {"none", ""}}));
  cmd.add_option(
         "--kv-cache-dtype", o->kv_cache_dtype,
         "KV cache elements: auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16 or fp8_e4m3 "
         "(FP8 scaled by the checkpoint's k_scale/v_scale where it has them, else 1.0)")
      ->transform(one_of({{"auto", "auto"},
                          {"float32", "float32"},
                          {"fp32", "float32"},
                          {"bfloat16", "bfloat16"},
                          {"bf16", "bfloat16"},
                          {"fp8", "fp8_e4m3"},
                          {"fp8_e4m3", "fp8_e4m3"},
                          {"fp8_e5m2", "", "only the e4m3 FP8 KV cache is supported (use fp8_e4m3)"}}))
      ->capture_default_str();
  cmd.add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd.add_option("--port", o->port, "port to listen on (0: any free port)")->capture_default_str();
  cmd.add_option("--served-model-name", o->served_model_name,
                 "the model name clients send (default: the --model argument)");
  // serve() reads the environment (api_key_from_environment): two names, after the flag.
  cmd.add_option(
      "--api-key", o->api_key,
      "require 'Authorization: Bearer KEY' on the API (else env MOESERVE_API_KEY, then VLLM_API_KEY)");
  cmd.add_option(
      "--allowed-origins", o->allowed_origins,
      "CORS: origins allowed to call the API, as vLLM takes them ('[\"*\"]', or a comma-separated list)");
  cmd.add_flag(
      "--vllm-metrics", o->vllm_metrics,
      "also export /metrics under vLLM's names (vllm:num_requests_running, ...) for vLLM dashboards");
  cmd.add_flag("--incremental-streaming-output", o->incremental_streaming_output,
               "SGLang's: each streamed chunk of /generate carries only its new text, ids and logprobs "
               "(default: everything so far, as SGLang's default)");
  cmd.add_option("--max-running-requests,--max-num-seqs", o->max_running_requests,
                 "the most sequences the engine runs at once (GDN state slots); fewer when the cache budget "
                 "holds fewer at 8K tokens each (default: what it holds, up to 256)");
  cmd.add_option(
      "--max-concurrency", o->max_concurrency,
      "generations admitted at once; more wait in the queue (default: the engine's running requests)");
  cmd.add_option("--max-queued-requests", o->max_queued_requests,
                 "requests that may wait for admission; more get 429")
      ->capture_default_str();
  cmd.add_option("--queue-timeout", o->queue_timeout_s,
                 "seconds a request may wait for admission before a 503")
      ->capture_default_str();
  cmd.add_option(
         "--memory-pressure-threshold", o->memory_pressure_threshold,
         "refuse new requests with 503 while used/total memory is above this (0: off; default 0.86, or "
         "--mem-fraction-static + 0.10)")
      ->capture_default_str();
  cmd.add_option("--max-model-len,--context-length", o->max_model_len,
                 "prompt + output limit (default: the model's max_position_embeddings)");
  cmd.add_option("--chat-template", o->chat_template,
                 "Jinja chat template file (default: the model's tokenizer_config.json)");
  cmd.add_option("--tool-call-parser", o->tool_call_parser,
                 "qwen3_coder (vLLM's qwen3_xml too), hermes (SGLang's qwen and qwen25 too), or '' (off)")
      ->transform(one_of({{"qwen3_coder", "qwen3_coder"},
                          {"qwen3_xml", "qwen3_coder"},
                          {"hermes", "hermes"},
                          {"qwen", "hermes"},
                          {"qwen25", "hermes"},
                          {"", ""}}))
      ->capture_default_str();
  cmd.add_option("--reasoning-parser", o->reasoning_parser,
                 "qwen3 (SGLang's qwen3-thinking and deepseek-r1, vLLM's deepseek_r1 too: the same <think> "
                 "blocks), or '' (off)")
      ->transform(one_of({{"qwen3", "qwen3"},
                          {"qwen3-thinking", "qwen3"},
                          {"deepseek-r1", "qwen3"},
                          {"deepseek_r1", "qwen3"},
                          {"", ""}}))
      ->capture_default_str();
  cmd.add_option("--shutdown-timeout", o->shutdown_timeout_s,
                 "seconds SIGTERM waits for in-flight requests before aborting them")
      ->capture_default_str();
  cmd.add_option("--http-threads", o->http_threads, "IO threads (default: cores / 4, 1..8)");
  cmd.add_option("--max-request-body-mb", o->max_request_body_mb, "larger bodies get 413")
      ->capture_default_str();
  cmd.add_option("--keep-alive-timeout", o->keep_alive_timeout_s,
                 "seconds an idle keep-alive connection stays open")
      ->capture_default_str();
  cmd.add_option("--max-connections", o->max_connections,
                 "open connections; more are answered 503 and closed")
      ->capture_default_str();
  cmd.add_option(
         "--max-buffered-body-mb", o->max_buffered_body_mb,
         "request bodies held at once, all connections together; more get 503 before their body is read")
      ->capture_default_str();
  cmd.add_option(
      "--request-threads", o->request_threads,
      "threads that parse requests and render prompts, off the IO threads (default: cores / 4, 2..8)");
  cmd.add_option("--request-queue", o->request_queue,
                 "requests that may wait for a request thread; more get 503")
      ->capture_default_str();
  cmd.add_option("--page-size,--block-size", o->page_size, "tokens per KV page")->capture_default_str();
  cmd.add_option("--mem-fraction", o->mem_fraction,
                 "fraction of the memory free after loading the weights for the KV cache and state slots");
  for (const char* name : {"--mem-fraction-static", "--gpu-memory-utilization"}) {
    cmd.add_option(
        name, o->total_mem_fraction,
        "SGLang's and vLLM's meaning: the share of all memory the server may take, weights included; "
        "the cache gets that share less what is in use once the weights are loaded");
  }
  cmd.add_option("--cache-memory-gb", o->cache_memory_gb,
                 "memory for the KV cache and state slots (wins over --mem-fraction)");
  cmd.add_option("--chunked-prefill-size", o->chunked_prefill_size,
                 "prompt tokens per request per step, and tokens per step unless --max-prefill-tokens is "
                 "given (-1: whole prompts; default: the step's)");
  cmd.add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                 "tokens per step: every decode, then prefill chunks in the rest (default 8192 on a GPU, "
                 "2048 on the CPU)");
  cmd.add_option("--max-prefill-tokens", o->max_num_batched_tokens, "SGLang's: --max-num-batched-tokens");
  cmd.add_flag("--disable-prefix-cache,--disable-radix-cache,--no-enable-prefix-caching",
               o->disable_prefix_cache, "turn the radix prefix cache off");
  cmd.add_option("--tp,--tp-size,--tensor-parallel-size", o->group.tp,
                 "tensor-parallel ranks (CPU: under mpirun -np N; docs/tp.md); -tp too")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--nnodes", o->group.nnodes, "hosts of the tensor-parallel group");
  cmd.add_option("--node-rank", o->group.node_rank, "this host's index in the group");
  cmd.add_option("--dist-init-addr", o->group.dist_init_addr, "HOST:PORT of rank 0 (no mpirun)");
  cmd.add_option("--schedule-policy", o->schedule_policy, "fcfs or lpm (longest prefix match)")
      ->transform(one_of(same({"fcfs", "lpm"})))
      ->capture_default_str();
  cmd.add_flag("--enable-priority-scheduling", o->enable_priority,
               "requests' priority orders the queue and preemption, larger first as in SGLang (smaller first "
               "with --schedule-low-priority-values-first)");
  cmd.add_flag("--schedule-low-priority-values-first", o->low_priority_values_first,
               "with --enable-priority-scheduling: smaller first");
  cmd.add_option("--scheduling-policy", o->schedule_policy_vllm,
                 "vLLM's: priority (requests' priority orders the queue, smaller first) or fcfs")
      ->transform(one_of(same({"fcfs", "priority"})));
  cmd.add_option("--snapshot-slots", o->snapshot_slots,
                 "GDN state snapshots the prefix cache may keep (default 2 x running requests)");
  cmd.add_option("--gdn-state-dtype,--mamba-ssm-dtype", o->gdn_state_dtype,
                 "float32, or bfloat16 (half the state memory)")
      ->transform(one_of(same({"float32", "bfloat16"})))
      ->capture_default_str();
  add_speculative_flags(
      cmd, o->speculative,
      "MTP or NEXTN: speculative decoding with the checkpoint's own MTP layer (docs/engine.md)");
  cmd.add_option("--speculative-config", o->speculative.config_json,
                 R"(vLLM's: '{"method":"mtp","num_speculative_tokens":N}')");
  cmd.add_option("--limit-mm-per-prompt,--limit-mm-data-per-request", o->limit_mm_per_prompt,
                 R"(images per prompt: '{"image": N}' (default 999; 0 refuses images))");
  cmd.add_flag("--language-model-only", o->language_model_only,
               "skip the vision tower (less memory); requests with images get 400");
  cmd.add_flag("--disable-image-fetch", o->disable_image_fetch,
               "images only as data: URLs; http(s) image URLs get 400");
  cmd.add_option("--allowed-local-media-path", o->allowed_local_media_path,
                 "file:// image URLs are read from under this directory only (default: refused)");
  cmd.add_option("--max-image-mb", o->max_image_mb, "encoded bytes per image (data: or fetched)")
      ->capture_default_str();
  cmd.add_option("--max-image-pixels", o->max_image_pixels,
                 "decoded pixels per image, checked before decoding")
      ->capture_default_str();
  cmd.add_option("--image-fetch-timeout", o->image_fetch_timeout_s, "seconds for one image URL's whole fetch")
      ->capture_default_str();
  cmd.add_option("--max-image-patches-per-request", o->max_image_patches_per_request,
                 "vision patches (4 per image token) all images of a request may take, checked from each "
                 "image's header before decoding; the context caps it too")
      ->capture_default_str();
  cmd.add_option("--mm-processor-kwargs", o->mm_processor_kwargs,
                 R"(the image processor's resize bounds, vLLM's '{"max_pixels": N, "min_pixels": M}')");
  cmd.add_option("--mm-encoder-cache-mb", o->mm_encoder_cache_mb,
                 "MiB of vision features kept for images seen again (the tower skipped); 0 = off")
      ->capture_default_str();
  cmd.add_option("--seed", o->seed, "seed of random weights (demo, --load-format dummy)")
      ->capture_default_str();
  cmd.add_option("--system-root", o->system_root,
                 "read /proc and /sys/fs/cgroup under this directory (tests play a machine)")
      ->capture_default_str();
  add_no_effect_flags(cmd, o);
}

Registration reg{{"serve",
                  "Serve a model over an OpenAI-compatible HTTP API (one node)",
                  10,
                  [](CLI::App& cmd) {
                    auto o = std::make_shared<ServeOptions>();
                    auto positional_model = std::make_shared<std::string>();
                    add_serve_flags(cmd, o, *positional_model);
                    return [o, positional_model, &cmd] {
                      resolve_peer_flags(*o, cmd, *positional_model);
                      return serve(*o);
                    };
                  },
                  serve_flag_hint,
                  {{"-tp", "--tp"}, {"-pp", "--pp"}, {"-dp", "--dp"}}}};

}  // namespace
}  // namespace moeserve::app
