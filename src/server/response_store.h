#pragma once
// The Responses API's stored responses: what POST /v1/responses keeps (unless `store: false`), and the
// endpoints over it (GET and DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel). The store is
// this server's memory, bounded, and a continuation (previous_response_id) reads it too.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/http.h"

namespace moeserve::server {

// One stored response.
struct StoredResponse {
  nlohmann::ordered_json response;  // the response object as the client received it
  nlohmann::ordered_json
      input_items;  // the items used to generate it (earlier turns' too), oldest first, ids set
  nlohmann::ordered_json messages;  // the conversation up to and including its answer, in chat form
};

// A response created with `background: true`, from its creation to its end and after: its status (queued,
// in_progress, then completed, incomplete, failed or cancelled), its output items so far, and every event
// of its stream, kept so that a client can resume the stream after any sequence number. The generation
// publishes events here (the Responses encoder); clients read a snapshot or the events, from any thread.
class BackgroundResponse {
 public:
  // `queued` is the response object as created (status "queued"); it is the stream's first two events,
  // response.created and response.queued.
  explicit BackgroundResponse(nlohmann::ordered_json queued, nlohmann::ordered_json input_items);

  // An event of the run (with its sequence_number, the next one). response.in_progress and the terminal
  // events set the status, output_item.done adds an item. Ignored once the response has ended.
  void publish(const nlohmann::ordered_json& event);
  // The run ended without a terminal event (refused in the queue, the engine failed): status failed.
  void fail(const std::string& message);
  // Stops it: true when it was queued or in progress (now cancelled, and `stop` is called), false when it
  // had already ended. `stop` (set by whoever runs it) stops the generation and frees its cache.
  bool cancel();
  void set_stop(std::function<void()> stop);

  int64_t next_sequence() const;
  std::string status() const;
  bool ended() const;
  // The response object now: status, output items finished so far, usage once ended.
  nlohmann::ordered_json snapshot() const;
  const nlohmann::ordered_json& input_items() const { return input_items_; }
  // The events after sequence number `after` (-1: all) as SSE text, the sequence number of the last one
  // given (or `after`), and whether the stream is over (the response ended and no event is left).
  struct Events {
    std::string sse;
    int64_t last;
    bool end;
  };
  Events events_after(int64_t after) const;
  // `wake` is called (on the publishing thread) after each new event and at the end, until unwatch(id).
  int watch(std::function<void()> wake);
  void unwatch(int id);
  // The JSON text it holds (events and snapshot), for the store's byte bound.
  size_t bytes() const;

 private:
  void append(const nlohmann::ordered_json& event);  // mutex_ held
  std::vector<std::function<void()>> wakers();       // mutex_ held
  void notify(std::vector<std::function<void()>> wake);

  const nlohmann::ordered_json input_items_;
  mutable std::mutex mutex_;
  nlohmann::ordered_json response_;  // status and fields; output is output_
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  std::vector<std::string> events_;  // SSE text; index = sequence_number
  size_t bytes_ = 0;
  bool ended_ = false;
  std::function<void()> stop_;
  int next_watch_ = 0;
  std::vector<std::pair<int, std::function<void()>>> watchers_;
};

// Responses by id: at most max_entries and max_bytes of their JSON text, the oldest dropped first. vLLM keeps
// every stored response until restart (unbounded); a bound keeps a long-running node's memory flat, and a
// dropped id is a 404 the client can act on. Background responses are kept too: never dropped while they
// run (at most max_running of them run at once), counted against the bounds once they end.
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 4096, size_t max_bytes = size_t{256} << 20,
                         size_t max_running = 64)
      : max_entries_(max_entries), max_bytes_(max_bytes), max_running_(max_running) {}
  // A finished response; a background response's record under the same id is kept beside it.
  void put(const std::string& id, StoredResponse response);
  // A background response starting. Throws ApiError 429 when max_running already run.
  void start_background(const std::string& id, std::shared_ptr<BackgroundResponse> background);
  std::shared_ptr<const StoredResponse> get(const std::string& id) const;
  std::shared_ptr<BackgroundResponse> background(const std::string& id) const;
  // false when the store does not hold `id`. A running background response is cancelled first.
  bool erase(const std::string& id);
  size_t size() const;
  size_t running();  // background responses queued or in progress

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const StoredResponse> response;  // null while a background response has not completed
    std::shared_ptr<BackgroundResponse> background;  // null for a foreground response
    size_t bytes;
  };
  // mutex_ held for these.
  void insert(Entry entry);  // replaces an entry of the same id, then evicts the oldest beyond the bounds
  void settle();             // counts the bytes of background responses that have ended since insertion
  size_t running_locked();
  size_t max_entries_, max_bytes_, max_running_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
  std::vector<std::string> unsettled_;  // ids of background responses that had not ended when inserted
};

// The request to /v1/responses/{id}[/input_items|/cancel]: `rest` is the path after "/v1/responses/".
// Answers from the store, as OpenAI does: the response object, the deletion object, the input items as a
// list page (`limit` 1-100, `order` asc/desc, `after`/`before` an item id), or for a cancel the cancelled
// response. A background response answers with its state now; a cancel of one that already ended is a 400
// (a second cancel returns the cancelled object, as OpenAI does), and of a foreground response a 400.
// `GET ?stream=true&starting_after=N` of a background response is its event stream from N + 1, live
// until it ends (an AsyncBody in the reply). Throws ApiError: 404 for an id the store does not hold, 405
// for a wrong method, 400 for a bad query parameter.
Reply stored_response_request(ResponseStore& store, const HttpRequest& request, std::string_view rest);

// The live event stream of a background response from after sequence number `after` (-1: from the start),
// as an SSE body that ends when the response does. Closing it leaves the response running.
std::shared_ptr<AsyncBody> background_event_stream(std::shared_ptr<BackgroundResponse> background,
                                                   int64_t after);

}  // namespace moeserve::server
