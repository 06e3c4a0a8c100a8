#pragma once
// One generation request in flight: waits for admission, submits one engine request per choice, hands engine
// events to each choice's ChoiceOutput and the deltas to the request's encoder (the wire format), ends the
// response, and reports metrics.
//
// Threads: engine events arrive on the engine thread and are only queued there (deliver); all text work
// (the choice pipelines and encoders) happens in poll(), on the connection's IO strand. Admission may call
// back from any thread; that path only submits to the engine.

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/admission.h"
#include "server/choice_output.h"
#include "server/encoders.h"
#include "server/http.h"
#include "server/job_spec.h"
#include "server/server_metrics.h"

namespace moeserve::text {
class Tokenizer;
}

namespace moeserve::server {

// What a job needs from the server; outlives every job.
struct GenerationContext {
  Engine* engine = nullptr;
  const text::Tokenizer* tokenizer = nullptr;  // null: token ids only, no text
  Admission* admission = nullptr;
  ServerMetrics* metrics = nullptr;
  std::string model_name;
};

class GenerationJob : public AsyncBody, public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(GenerationContext& ctx, JobSpec spec);
  ~GenerationJob() override;

  // Enters admission. Throws ApiError (429/503/400) when refused outright.
  void admit();

  void start(std::function<void()> wake) override;
  Step poll(Clock::time_point now) override;
  void cancel() override;

  // Server shutdown: stops generation; the response still ends properly (finish_reason "abort").
  void abort();
  bool finished() const { return done_.load(); }

 private:
  // A choice's engine request, beside its output.
  struct EngineSlot {
    std::string id;
    std::atomic<bool> done{false};  // read by cancel_engine_requests from other threads
    std::optional<Clock::time_point> last_token_at;
  };
  struct Event {
    int choice;
    GenerateOutput out;
    Clock::time_point at;
  };

  void on_admitted();
  void deliver(int choice, const GenerateOutput& out);
  void process(Event& ev, std::string& sse);
  void observe_tokens(EngineSlot& slot, const Event& ev);
  void complete(Step& step);
  void release();
  void cancel_engine_requests();

  GenerationContext& ctx_;
  JobSpec spec_;
  std::vector<ChoiceOutput> choices_;  // never resized after construction (the encoder reads it)
  std::deque<EngineSlot> slots_;       // one per choice
  std::unique_ptr<ResponseEncoder> encoder_;
  std::shared_ptr<Admission::Ticket> ticket_;
  std::optional<Clock::time_point> queue_deadline_;

  std::mutex mutex_;  // guards everything below it
  std::function<void()> wake_;
  std::deque<Event> inbox_;
  bool admitted_ = false;
  std::optional<Clock::time_point> admitted_at_;
  std::string submit_error_;
  bool abort_requested_ = false;

  // IO-strand only.
  bool head_sent_ = false;
  bool cancelled_ = false;
  std::atomic<bool> done_{false};
};

std::string random_id(const char* prefix);

}  // namespace moeserve::server
