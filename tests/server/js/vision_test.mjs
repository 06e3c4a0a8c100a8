// Sends images through `moeserve serve --model demo` (its random vision tower) or a router in front of it
// with the official OpenAI SDK: a data-URL PNG in a chat message, a second turn about the same image that the
// prefix cache serves past the image, two images in one message, and a malformed image as the SDK's 400.
// Usage: node vision_test.mjs BASE_URL MODEL [API_KEY]
// Prints one line per check; exits 1 if any failed.
import OpenAI from "openai";
import { readFileSync } from "node:fs";

const [baseURL, model, apiKey = "none"] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
let failures = 0;

function check(name, condition, detail = "") {
  console.log(`${condition ? "ok  " : "FAIL"} ${name}${condition ? "" : " " + detail}`);
  if (!condition) failures++;
}

// 100x72 pixels: smart_resize makes it 224x320, 14x20 patches, 70 image tokens.
const png = readFileSync("tests/fixtures/models/tiny-moe-vl-image/image1.png");
const image = { type: "image_url", image_url: { url: `data:image/png;base64,${png.toString("base64")}` } };
const kImageTokens = 70;

const first = [{ role: "user", content: [{ type: "text", text: "What is in this picture?" }, image] }];
const a = await client.chat.completions.create({ model, messages: first, max_tokens: 4, temperature: 0 });
check("an image: one choice", a.choices.length === 1 && a.choices[0].message.role === "assistant", JSON.stringify(a));
check("an image: the prompt holds its tokens", a.usage.prompt_tokens > kImageTokens, JSON.stringify(a.usage));

const second = [...first, { role: "assistant", content: a.choices[0].message.content ?? "" },
                { role: "user", content: "And its colours?" }];
const b = await client.chat.completions.create({ model, messages: second, max_tokens: 4, temperature: 0 });
const cached = b.usage.prompt_tokens_details?.cached_tokens ?? 0;
check("the next turn about the same image hits the cache past it", cached > kImageTokens, JSON.stringify(b.usage));

const two = [{ role: "user", content: [image, { type: "text", text: "and" }, image] }];
const c = await client.chat.completions.create({ model, messages: two, max_tokens: 2, temperature: 0 });
check("two images in one message", c.usage.prompt_tokens > 2 * kImageTokens, JSON.stringify(c.usage));

try {
  await client.chat.completions.create({
    model, max_tokens: 2,
    messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } }] }],
  });
  check("a malformed image is a 400", false, "no error thrown");
} catch (e) {
  check("a malformed image is a 400", e instanceof OpenAI.BadRequestError && e.status === 400,
        `${e?.constructor?.name} status=${e?.status} ${e?.message}`);
}

if (failures === 0) console.log("all vision SDK checks passed");
process.exit(failures === 0 ? 0 : 1);
