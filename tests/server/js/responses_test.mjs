// Drives a running `moeserve serve --model demo` through the official OpenAI SDK's Responses API
// (client.responses): text, reasoning items, a function tool, streaming through the SDK's own event
// accumulator (which throws on events out of order), previous_response_id, and the stored responses
// (retrieve, inputItems.list, delete, cancel), and background responses (polled, their stream resumed,
// cancelled while queued and while generating).
// Usage: node responses_test.mjs BASE_URL MODEL API_KEY. Prints one line per check; exits 1 if any failed.
// The server must run with --max-concurrency 1 (a held slot keeps a background response queued).
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
let failures = 0;
function check(name, condition, detail = "") {
  console.log(`${condition ? "ok  " : "FAIL"} ${name}${condition ? "" : " " + detail}`);
  if (!condition) failures++;
}
const textOf = (item) => (item.content ?? []).map((p) => p.text).join("");

// Thinking on (the demo template opens <think>): the output is reasoning, cut by the token limit.
const thinking = await client.responses.create({ model, input: "Say hello.", max_output_tokens: 6, temperature: 0 });
check("responses: object, id and status", thinking.object === "response" && thinking.id.startsWith("resp_") &&
      thinking.status === "incomplete" && thinking.incomplete_details?.reason === "max_output_tokens",
      JSON.stringify(thinking));
const reasoning = thinking.output.find((i) => i.type === "reasoning");
check("responses: a reasoning item with text", reasoning && textOf(reasoning).length > 0, JSON.stringify(thinking.output));
check("responses: usage adds up", thinking.usage.output_tokens === 6 &&
      thinking.usage.total_tokens === thinking.usage.input_tokens + thinking.usage.output_tokens,
      JSON.stringify(thinking.usage));

// Thinking off: the answer is a message, and the SDK's output_text is its text.
const plain = { model, input: [{ role: "user", content: [{ type: "input_text", text: "Say hello." }] }],
                instructions: "Be brief.", reasoning: { effort: "none" }, max_output_tokens: 8, temperature: 0 };
const text = await client.responses.create(plain);
check("responses: output_text from a message item", text.output_text.length > 0 &&
      text.output.some((i) => i.type === "message" && i.role === "assistant"), JSON.stringify(text.output));
check("responses: instructions echoed", text.instructions === "Be brief.", JSON.stringify(text.instructions));

const stream = client.responses.stream(plain);
let deltas = "";
const types = new Set();
stream.on("response.output_text.delta", (e) => { deltas += e.delta; });
for await (const event of stream) types.add(event.type);
const streamed = await stream.finalResponse();
check("responses stream: created ... completed events", types.has("response.created") &&
      types.has("response.output_item.added") && types.has("response.output_item.done") &&
      (types.has("response.completed") || types.has("response.incomplete")), JSON.stringify([...types]));
const finalText = streamed.output.filter((i) => i.type === "message").map(textOf).join("");
check("responses stream: deltas, final response and non-streamed text agree",
      deltas === finalText && deltas === text.output_text,
      JSON.stringify({ deltas, final: finalText, whole: text.output_text }));

// A function tool, required: the answer is a call whose arguments are JSON.
const weather = { type: "function", name: "get_weather", description: "Current weather",
                  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };
const withTool = { model, input: "Weather in Paris?", tools: [weather], tool_choice: "required",
                   max_output_tokens: 24, temperature: 0 };
const called = await client.responses.create(withTool);
const call = called.output.find((i) => i.type === "function_call");
let argsOk = false;
try { argsOk = call && typeof JSON.parse(call.arguments) === "object"; } catch {}
check("responses tool: a function_call item", call?.name === "get_weather" && call.call_id.startsWith("call_") && argsOk,
      JSON.stringify(called.output));
const toolStream = client.responses.stream(withTool);
let argDeltas = "";
toolStream.on("response.function_call_arguments.delta", (e) => { argDeltas += e.delta; });
for await (const _ of toolStream) {}
const streamedCall = (await toolStream.finalResponse()).output.find((i) => i.type === "function_call");
check("responses tool stream: the same call, arguments from their deltas",
      streamedCall?.name === "get_weather" && streamedCall.arguments === argDeltas &&
          streamedCall.arguments === call?.arguments,
      JSON.stringify({ streamedCall, argDeltas, call }));

// The tool's result, continuing the stored conversation.
const next = await client.responses.create({
  model, previous_response_id: called.id, tools: [weather], max_output_tokens: 4, temperature: 0,
  input: [{ type: "function_call_output", call_id: call?.call_id ?? "x", output: "18 C, sunny" }] });
check("responses: previous_response_id continues the conversation",
      next.previous_response_id === called.id && next.usage.input_tokens > called.usage.input_tokens,
      JSON.stringify({ next: next.usage, first: called.usage }));
try {
  await client.responses.create({ model, previous_response_id: "resp_unknown", input: "hi", max_output_tokens: 2 });
  check("responses: an unknown previous_response_id is a 404", false, "no error");
} catch (e) {
  check("responses: an unknown previous_response_id is a 404", e instanceof OpenAI.NotFoundError, String(e));
}
// The stored response: retrieved as created, its input items listed (the SDK's cursor pages), deleted.
const retrieved = await client.responses.retrieve(next.id);
check("responses.retrieve: the object the create returned",
      JSON.stringify(retrieved) === JSON.stringify(next) && retrieved.output_text === next.output_text,
      JSON.stringify({ retrieved, next }));
const listed = [];
for await (const item of client.responses.inputItems.list(next.id, { order: "asc", limit: 1 })) listed.push(item);
check("responses.inputItems.list: earlier turns' items, then this input, paged one by one",
      listed.length === 1 + called.output.length + 1 && listed[0].content?.[0]?.text === "Weather in Paris?" &&
          listed.at(-1).type === "function_call_output" && listed.at(-1).call_id === call?.call_id &&
          new Set(listed.map((i) => i.id)).size === listed.length,
      JSON.stringify(listed));
const newestFirst = await client.responses.inputItems.list(next.id);
check("responses.inputItems.list: newest first by default", newestFirst.data[0]?.id === listed.at(-1)?.id &&
      newestFirst.data.length === listed.length && newestFirst.has_more === false, JSON.stringify(newestFirst));
const expectError = async (name, kind, promise) => {
  try {
    await promise;
    check(name, false, "no error");
  } catch (e) {
    check(name, e instanceof kind, String(e));
  }
};
await expectError("responses.cancel: a foreground response cannot be cancelled (400)", OpenAI.BadRequestError,
                  client.responses.cancel(next.id));
await client.responses.delete(next.id);
await expectError("responses.retrieve after delete: 404", OpenAI.NotFoundError, client.responses.retrieve(next.id));
await expectError("responses.delete twice: 404", OpenAI.NotFoundError, client.responses.delete(next.id));
await expectError("responses.inputItems.list after delete: 404", OpenAI.NotFoundError,
                  client.responses.inputItems.list(next.id));
const unstored = await client.responses.create({ ...plain, store: false });
await expectError("responses.retrieve of a store: false response: 404", OpenAI.NotFoundError,
                  client.responses.retrieve(unstored.id));

// Background: the same request as `plain`, run without the connection, polled until it ends.
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const running = (r) => r.status === "queued" || r.status === "in_progress";
const bg = await client.responses.create({ ...plain, background: true });
check("background: created at once, queued or in progress", bg.background === true && running(bg) &&
      bg.id.startsWith("resp_"), JSON.stringify(bg));
let polled = bg;
for (let i = 0; i < 3000 && running(polled); i++) {  // until it ends: the count bounds nothing that is checked
  await sleep(10);
  polled = await client.responses.retrieve(bg.id);
}
check("background: retrieve polled until it ended, with the foreground answer",
      polled.status === text.status && polled.output_text === text.output_text &&
          polled.usage?.output_tokens === text.usage.output_tokens,
      JSON.stringify({ polled, text }));
// Its event stream resumed after a sequence number: the raw events, then the SDK's own resumption.
const resumedRaw = await client.responses.retrieve(bg.id, { stream: true, starting_after: 2 });
const seqs = [];
let lastEvent;
for await (const e of resumedRaw) {
  seqs.push(e.sequence_number);
  lastEvent = e;
}
check("background stream: retrieve(stream, starting_after: 2) gives 3, 4, ... and the final response",
      seqs[0] === 3 && seqs.every((n, i) => n === 3 + i) && lastEvent?.type === `response.${polled.status}` &&
          JSON.stringify(lastEvent.response.output) === JSON.stringify(polled.output) &&
          JSON.stringify(lastEvent.response.usage) === JSON.stringify(polled.usage),
      JSON.stringify({ seqs, lastEvent }));
// The SDK fetches the whole stream and emits the events after starting_after; its accumulator replaces the
// snapshot on response.completed only, so this one (cut by max_output_tokens) is compared by its text.
const resumed = client.responses.stream({ response_id: bg.id, starting_after: 3 });
const resumedSeqs = [];
resumed.on("event", (e) => resumedSeqs.push(e.sequence_number));
for await (const _ of resumed) {}
const accumulated = await resumed.finalResponse();
check("background stream: responses.stream({response_id}) accumulates the retrieved response",
      accumulated.output.filter((i) => i.type === "message").map(textOf).join("") === polled.output_text &&
          accumulated.id === polled.id &&
          resumedSeqs[0] === 4 && resumedSeqs.at(-1) === seqs.at(-1),
      JSON.stringify({ accumulated, resumedSeqs }));

// Cancelled while queued: a completion stream holds the only generation slot (--max-concurrency 1).
const holder = new AbortController();
const hold = await client.completions.create(
    { model, prompt: "Hold the slot", max_tokens: 30000, ignore_eos: true, stream: true },
    { signal: holder.signal });  // returns once the server admitted it
const waiting = await client.responses.create({ ...plain, background: true });
const stillWaiting = await client.responses.retrieve(waiting.id);
check("background: queued while the slot is held", waiting.status === "queued" && stillWaiting.status === "queued",
      JSON.stringify({ waiting, stillWaiting }));
const cancelledQueued = await client.responses.cancel(waiting.id);
const cancelledAgain = await client.responses.cancel(waiting.id);
check("background: cancel while queued, and a second cancel answers the same",
      cancelledQueued.status === "cancelled" && JSON.stringify(cancelledAgain) === JSON.stringify(cancelledQueued) &&
          (await client.responses.retrieve(waiting.id)).status === "cancelled",
      JSON.stringify({ cancelledQueued, cancelledAgain }));
holder.abort();
try {
  for await (const chunk of hold) void chunk;  // ends with the abort
} catch (e) {
  if (!(e instanceof OpenAI.APIUserAbortError) && e?.name !== "AbortError") throw e;
}
await expectError("background: cancel of a completed response is a 400", OpenAI.BadRequestError,
                  client.responses.cancel(bg.id));

// Cancelled while generating: a string of a million characters cannot end within max_output_tokens, so it is
// still generating when the first delta has arrived and the cancel is sent.
async function runningRequests() {
  const metrics = await (await fetch(`${baseURL}/metrics`)).text();
  const line = metrics.split("\n").find((l) => l.startsWith("moeserve:num_requests_running{"));
  return line ? Number(line.split(" ").pop()) : -1;
}
const long = await client.responses.create({
  model, input: "Write a long story.", reasoning: { effort: "none" }, max_output_tokens: 20000, temperature: 0,
  background: true, stream: true,
  text: { format: { type: "json_schema", name: "story", strict: true,
                    schema: { type: "object", properties: { story: { type: "string", minLength: 1000000 } },
                              required: ["story"], additionalProperties: false } } } });
let longId;
let deltasBeforeCancel = 0;
const seenTypes = [];
let cancelled;
for await (const e of long) {
  seenTypes.push(e.type);
  if (e.type === "response.created") longId = e.response.id;
  if (e.type === "response.output_text.delta" && deltasBeforeCancel++ === 0) cancelled = await client.responses.cancel(longId);
}
let engineRunning = -1;
for (let i = 0; i < 3000 && engineRunning !== 0; i++) {  // until the engine has dropped the sequence
  engineRunning = await runningRequests();
  if (engineRunning !== 0) await sleep(10);
}
const afterCancel = await client.responses.retrieve(longId);
check("background: cancelled while generating; the stream ends without a terminal event and the engine stops",
      cancelled?.status === "cancelled" && afterCancel.status === "cancelled" && seenTypes.includes("response.in_progress") &&
          !seenTypes.some((t) => t === "response.completed" || t === "response.incomplete") && engineRunning === 0,
      JSON.stringify({ cancelled: cancelled?.status, after: afterCancel.status, engineRunning, last: seenTypes.slice(-3) }));
await expectError("background: store: false is a 400", OpenAI.BadRequestError,
                  client.responses.create({ ...plain, background: true, store: false }));

try {
  await client.responses.create({ model, input: "hi", tools: [{ type: "web_search" }] });
  check("responses: a hosted tool is a 400", false, "no error");
} catch (e) {
  check("responses: a hosted tool is a 400", e instanceof OpenAI.BadRequestError && /tools\[0\]/.test(e.message),
        String(e));
}

console.log(failures === 0 ? "all Responses checks passed" : `${failures} Responses checks failed`);
process.exit(failures === 0 ? 0 : 1);
