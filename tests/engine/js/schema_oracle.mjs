// The oracle of tests/engine/schema_differential_test.cpp: ajv 8 (draft 2020-12, ajv-formats' full formats)
// judges JSON documents against schemas, and zod 4 writes schemas the way applications send them.
//
//   node schema_oracle.mjs cases SEED OUT   schemas (zod-written, hand-written as pydantic writes them, and
//                                           random ones) and documents for each, valid and not, with ajv's
//                                           verdict: {"schemas": [...], "docs": [[schema, text, valid], ...]}
//   node schema_oracle.mjs judge IN OUT     IN {"schemas", "docs": [[schema, text], ...]}; OUT: ajv's verdicts
//   node schema_oracle.mjs finite SEED OUT  the schemas of `cases`, finite for a writer that never chooses to
//                                           stop (random weights): {"schemas": [...]}
import { readFileSync, writeFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import * as z from "zod";

// multipleOfPrecision: ajv divides in doubles, where 0.07 / 0.01 is 7.000000000000001 and so "not a
// multiple"; with a tolerance of 1e-6 on the quotient it judges decimals as written, as the matcher does
// (exactly). The documents here have at most three decimals and the matcher's multiples stay below 10^9 of
// the step's units (json_number.h), so the tolerance never decides a case: no quotient lands within 1e-6
// of an integer without being one, and the doubles' error stays far below it.
function makeAjv() {
  const ajv = new Ajv2020({ strict: false, unicodeRegExp: true, allowUnionTypes: true, multipleOfPrecision: 6 });
  addFormats(ajv);
  return ajv;
}

// A seeded generator (mulberry32): the same cases for the same seed.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The matcher's documented default: properties listed and additionalProperties absent means no other keys
// (xgrammar's strict mode). Written out so that ajv judges the same schema.
function strict(s) {
  if (Array.isArray(s)) return s.map(strict);
  if (!s || typeof s !== "object") return s;
  const out = {};
  for (const [k, v] of Object.entries(s)) out[k] = k === "const" || k === "enum" ? v : strict(v);
  if (out.properties && !("additionalProperties" in out)) out.additionalProperties = false;
  return out;
}

// Strings a format or pattern of the random schemas takes, and some it does not.
const SAMPLES = {
  "date-time": ["2024-02-29T12:30:00Z", "1999-12-31t23:59:59.5+05:30", "2023-02-29T00:00:00Z", "2024-01-01T24:00:00Z",
    "2024-01-01 10:00:00-0130", "2024-01-01T10:00:00"],
  date: ["2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29", "2024-04-31", "2024-12-01", "24-12-01"],
  time: ["10:20:30Z", "23:59:60Z", "10:20:30", "25:00:00Z", "10:20:30.25-08:00"],
  uuid: ["123e4567-e89b-12d3-a456-426614174000", "urn:uuid:123E4567-E89B-12D3-A456-426614174000",
    "123e4567-e89b-12d3-a456-42661417400", "not-a-uuid"],
  email: ["ann@example.com", "a.b+c@mail.example.org", "ann@example", "@example.com", "ann@-x.com", "x@y.co"],
  uri: ["https://example.com/a?b=1#c", "mailto:ann@example.com", "urn:isbn:0451450523", "example.com", "http://a b",
    "ftp://[2001:db8::1]:21/x", "http:"],
  ipv4: ["192.168.0.1", "256.1.1.1", "1.2.3", "10.0.0.255"],
};
const PATTERNS = {
  "^[a-z]+$": ["abc", "a", "", "aB", "abc1"],
  "^\\d{3}-\\d{4}$": ["555-1234", "55-1234", "555-12345", "abc-defg"],
  "ab+c": ["xabbbcx", "ac", "abc", "ABC"],
  "^(?:[A-Z]{2}|\\d{2})[-_]?x*$": ["AB-xx", "12x", "A1", "AB__x"],
  "^[^\\s@]+@[^\\s@]+$": ["a@b", "a @b", "a@@b", "é@ü"],
  "^\\p": null, // not used: Unicode property escapes are refused
  "^(?!\\.)(?!.*\\.\\.)[a-z.]+$": ["a.b", ".ab", "a..b", "ab."],
  "colou?r": ["color", "colour", "colr", "my colour!"],
  "^\\u00e9+\\S?$": ["é", "éé!", "e", "é "],
};
delete PATTERNS["^\\p"];

function pick(r, list) {
  return list[Math.floor(r() * list.length)];
}

function randomString(r, min, max) {
  const alphabet = ["a", "b", "Z", "0", "7", " ", "-", "é", "😀", "\"", "\\", "\n", "x", "."];
  const n = min + Math.floor(r() * (Math.min(max, min + 8) - min + 1));
  let s = "";
  for (let i = 0; i < n; ++i) s += pick(r, alphabet);
  return s;
}

// A random schema of the supported keywords, `depth` levels of containers at most; `only` a kind (allOf,
// or a number with a decimal step), as extraSchemas draws them.
function randomSchema(r, depth, only) {
  const kinds = depth > 0 ? ["object", "array", "string", "number", "integer", "boolean", "enum", "nullable", "const", "union"]
                          : ["string", "number", "integer", "boolean", "enum", "nullable", "const"];
  const kind = only ?? pick(r, kinds);
  const bound = () => pick(r, [-100, -7.5, -1, 0, 0.25, 1, 3, 10, 99.5, 1000]);
  switch (kind) {
    case "object": {
      const properties = {};
      const required = [];
      const n = 1 + Math.floor(r() * 4);
      for (let i = 0; i < n; ++i) {
        const name = pick(r, ["id", "name", "when", "tags", "n", "x", "é", "a b"]) + (i ? i : "");
        properties[name] = randomSchema(r, depth - 1);
        if (r() < 0.6) required.push(name);
      }
      const s = { type: "object", properties, required };
      if (r() < 0.2) s.additionalProperties = randomSchema(r, 0);
      else if (r() < 0.2) s.additionalProperties = true;
      return s;
    }
    case "array": {
      const s = { type: "array", items: randomSchema(r, depth - 1) };
      if (r() < 0.3) s.prefixItems = [randomSchema(r, 0), randomSchema(r, 0)];
      if (r() < 0.4) s.minItems = Math.floor(r() * 3);
      if (r() < 0.4) s.maxItems = (s.minItems || 0) + Math.floor(r() * 3);
      return s;
    }
    case "string": {
      // Lengths that leave the pattern some strings (a schema no string passes is a 400, not a case here).
      const s = { type: "string" };
      const what = r();
      if (what < 0.3) s.format = pick(r, Object.keys(SAMPLES));
      else if (what < 0.6) s.pattern = pick(r, Object.keys(PATTERNS));
      if (!s.format && r() < 0.4) s.minLength = Math.floor(r() * 4);
      if (!s.format && r() < 0.4) s.maxLength = (s.minLength || 0) + (s.pattern ? 12 : 0) + Math.floor(r() * 12);
      return s;
    }
    case "number":
    case "integer": {
      const s = { type: kind };
      let lo = bound(), hi = bound();
      if (lo > hi) [lo, hi] = [hi, lo];
      if (r() < 0.7) s[r() < 0.5 ? "minimum" : "exclusiveMinimum"] = lo;
      if (r() < 0.7) s[r() < 0.5 ? "maximum" : "exclusiveMaximum"] = hi;
      // Some value must pass (no integer in (0.25, 1), nothing in (3, 3)).
      const first = "exclusiveMinimum" in s ? (kind === "integer" ? Math.floor(lo) + 1 : lo) : kind === "integer" ? Math.ceil(lo) : lo;
      const last = "exclusiveMaximum" in s ? (kind === "integer" ? Math.ceil(hi) - 1 : hi) : kind === "integer" ? Math.floor(hi) : hi;
      const open = "exclusiveMinimum" in s || "exclusiveMaximum" in s;
      if (("minimum" in s || "exclusiveMinimum" in s) && ("maximum" in s || "exclusiveMaximum" in s) &&
          (first > last || (kind === "number" && first === last && open))) {
        delete s.maximum;
        delete s.exclusiveMaximum;
      }
      if (r() < 0.25 || only) {  // steps; the bounds dropped where no multiple is within them
        const decimal = kind === "number" ? [0.01, 0.25, 0.5, 2.5, 0.001] : [0.5, 1.5];
        s.multipleOf = pick(r, only ? decimal : [2, 3, 5, 10]);
        // The first multiple above the lower bound (on integers, of the step's least integer multiple).
        let step = s.multipleOf;
        if (kind === "integer") for (let k = 1; !Number.isInteger(+(k * s.multipleOf).toFixed(6)); ++k) step = +((k + 1) * s.multipleOf).toFixed(6);
        const lowest = "minimum" in s ? s.minimum : "exclusiveMinimum" in s ? s.exclusiveMinimum : -Infinity;
        let m = Number.isFinite(lowest) ? Math.ceil(+(lowest / step).toFixed(6)) * step : 0;
        if ("exclusiveMinimum" in s && m <= lowest) m += step;
        if (("maximum" in s && m > s.maximum) || ("exclusiveMaximum" in s && m >= s.exclusiveMaximum)) {
          delete s.maximum;
          delete s.exclusiveMaximum;
        }
      }
      return s;
    }
    case "boolean":
      return { type: "boolean" };
    case "allOf": {  // as pydantic and zod write it: parts that merge (a bound split off, objects intersected)
      const roll = r();
      if (roll < 0.4) {
        // A bound split off into a part of its own (the string rules stay with their type, where finite()
        // bounds the length as it would without allOf).
        const inner = randomSchema(r, 0);
        const k = Object.keys(inner).find((key) => !["type", "pattern", "format", "minLength", "anyOf", "enum", "const"].includes(key));
        if (!inner.type || !k) return { allOf: [inner] };
        const { [k]: bound, ...rest } = inner;
        return { allOf: [rest, { [k]: bound }], description: "split" };
      }
      const part = () => {
        const properties = {};
        for (let k = 0; k < 1 + Math.floor(r() * 2); ++k) properties[pick(r, ["a", "b", "c"])] = randomSchema(r, 0);
        const names = Object.keys(properties);
        return { type: "object", properties, required: names.filter(() => r() < 0.5), additionalProperties: true };
      };
      // The second part lists some of the first's keys, with the same schema again: closed or open, and
      // closed by finite() too, the parts leave objects every part passes. (Bounds that tighten come from
      // zod's loose intersection above.)
      const first = part(), second = part();
      for (const k of Object.keys(second.properties)) {
        if (k in first.properties) second.properties[k] = first.properties[k];
        else delete second.properties[k];
      }
      second.required = second.required.filter((k) => k in first.properties);
      // Closed (open ones, which take any key and so end a walk late, come from zod's loose intersection).
      first.additionalProperties = false;
      return { allOf: [first, second] };
    }
    case "enum":
      return { enum: pick(r, [["a", "b", "c"], [1, 2.5, "x", null, true], ["é", "ab", "abc"]]) };
    case "const":
      return { const: pick(r, ["fixed", 42, false, null]) };
    case "union": {  // objects as pydantic's and zod's unions write them: anyOf, or oneOf by a const discriminator
      const oneOf = r() < 0.5;
      const alternatives = [];
      const n = 2 + Math.floor(r() * 2);
      for (let i = 0; i < n; ++i) {
        const alt = randomSchema(r, 0);
        const properties = {};
        const required = [];
        if (oneOf) {
          properties.kind = { type: "string", const: "k" + i };
          required.push("kind");
        }
        for (let k = 0; k < 1 + Math.floor(r() * 3); ++k) {
          const name = pick(r, ["id", "name", "n", "x"]);
          properties[name] = randomSchema(r, Math.max(depth - 1, 0));
          if (r() < 0.5 && !required.includes(name)) required.push(name);
        }
        alternatives.push(r() < 0.2 ? alt : { type: "object", properties, required });
      }
      if (oneOf) return { oneOf: alternatives.filter((a) => a.type === "object").concat([{ type: "null" }]) };
      return { anyOf: alternatives };
    }
    default: {  // Optional[X]: X of a type other than null
      let inner;
      do inner = randomSchema(r, 0);
      while (!inner.type || inner.type === "null");
      return { anyOf: [inner, { type: "null" }] };
    }
  }
}

// Schemas as zod 4 writes them for ordinary models (z.toJSONSchema).
function zodSchemas() {
  const models = [
    z.object({ id: z.number().int(), name: z.string().min(1).max(20) }),
    z.object({ email: z.email(), when: z.iso.datetime(), day: z.iso.date() }),
    z.object({ id: z.uuid(), url: z.url(), tags: z.array(z.string().regex(/^[a-z]+$/)).max(3) }),
    z.object({ kind: z.enum(["a", "b"]), opt: z.number().positive().optional(), nul: z.string().nullable() }),
    z.object({ pair: z.tuple([z.string(), z.number()]), lit: z.literal(5), rec: z.record(z.string(), z.boolean()) }),
    z.object({ age: z.number().int().min(0).max(150), score: z.number().gte(0).lte(1), rank: z.int().lt(10) }),
    z.object({ nested: z.object({ a: z.boolean(), b: z.array(z.number().int().nonnegative()).min(1) }) }),
    z.object({ code: z.string().length(4), note: z.string().max(0).optional(), level: z.number().int().negative() }),
    z.object({ items: z.array(z.object({ sku: z.string().regex(/^[A-Z]{3}-\d{3}$/), qty: z.int().positive() })) }),
    z.object({ status: z.union([z.literal("ok"), z.literal("error")]), code: z.number().int().nullable() }),
    z.object({ shape: z.union([z.object({ r: z.number().positive() }), z.object({ w: z.int(), h: z.int() })]) }),
    z.object({ event: z.discriminatedUnion("type", [z.object({ type: z.literal("click"), x: z.int(), y: z.int() }),
      z.object({ type: z.literal("key"), key: z.string().max(1) })]), step: z.int().multipleOf(5).max(100) }),
  ];
  return models.map((m) => z.toJSONSchema(m));
}

// Hand-written, as pydantic 2 writes models (Optional[X] as anyOf with null, $defs and $ref, titles).
const PYDANTIC = [
  { $defs: { Pet: { properties: { name: { title: "Name", type: "string" }, age: { anyOf: [{ type: "integer", minimum: 0 }, { type: "null" }], default: null } }, required: ["name"], title: "Pet", type: "object" } },
    properties: { owner: { title: "Owner", type: "string", maxLength: 10 }, pets: { items: { $ref: "#/$defs/Pet" }, title: "Pets", type: "array" } },
    required: ["owner", "pets"], title: "Household", type: "object" },
  { properties: { when: { format: "date-time", type: "string" }, price: { exclusiveMinimum: 0, type: "number" } }, required: ["when", "price"], type: "object" },
  { properties: { color: { enum: ["red", "green"], type: "string" }, size: { const: "L" } }, required: ["color", "size"], type: "object" },
  // Union[date, datetime] and Union[int, float]: alternatives of one type.
  { properties: { when: { anyOf: [{ format: "date", type: "string" }, { format: "date-time", type: "string" }] },
    n: { anyOf: [{ type: "integer" }, { type: "number" }] } }, required: ["when", "n"], type: "object" },
  // Union[Cat, Dog] and a discriminated union (Field(discriminator="pet_type")), a linked list
  // (next: Optional["Node"]), conint(multiple_of=3).
  { $defs: { Cat: { properties: { pet_type: { const: "cat", title: "Pet Type", type: "string" }, meows: { title: "Meows", type: "integer" } },
      required: ["pet_type", "meows"], title: "Cat", type: "object" },
    Dog: { properties: { pet_type: { const: "dog", title: "Pet Type", type: "string" }, barks: { title: "Barks", type: "number" } },
      required: ["pet_type", "barks"], title: "Dog", type: "object" },
    Node: { properties: { v: { type: "integer", multipleOf: 3 }, next: { anyOf: [{ $ref: "#/$defs/Node" }, { type: "null" }], default: null } },
      required: ["v"], title: "Node", type: "object" } },
    properties: { pet: { discriminator: { mapping: { cat: "#/$defs/Cat", dog: "#/$defs/Dog" }, propertyName: "pet_type" },
      oneOf: [{ $ref: "#/$defs/Cat" }, { $ref: "#/$defs/Dog" }], title: "Pet" },
    either: { anyOf: [{ $ref: "#/$defs/Cat" }, { $ref: "#/$defs/Dog" }, { type: "string", maxLength: 3 }], title: "Either" },
    list: { $ref: "#/$defs/Node" } },
    required: ["pet", "either"], title: "Owner", type: "object" },
];

// allOf and decimal multipleOf, drawn after the cases above (from their own seed) so that those stay as
// they were: zod's decimal steps and intersection of loose objects (of z.object()s an intersection admits no
// object, each part's additionalProperties being false, which the matcher refuses naming allOf), pydantic's
// one-part allOf around a $ref with a description or default, and random ones.
function extraSchemas(r) {
  const out = [
    z.toJSONSchema(z.object({ price: z.number().multipleOf(0.01).nonnegative().max(10000), rate: z.number().multipleOf(0.25) })),
    z.toJSONSchema(z.intersection(z.looseObject({ a: z.string().max(5), n: z.int().min(0) }), z.looseObject({ n: z.int().max(9) }))),
    { $defs: { Size: { enum: ["S", "M", "L"], title: "Size", type: "string" },
      Box: { properties: { w: { type: "number", multipleOf: 0.5, exclusiveMinimum: 0 }, size: { allOf: [{ $ref: "#/$defs/Size" }], default: "M" } },
        required: ["w"], title: "Box", type: "object" } },
      properties: { box: { allOf: [{ $ref: "#/$defs/Box" }], description: "The box" }, boxes: { items: { $ref: "#/$defs/Box" }, type: "array", maxItems: 3 } },
      required: ["box"], title: "Order", type: "object" },
  ];
  for (let i = 0; i < 24; ++i) out.push(randomSchema(r, 1, "allOf"));
  for (let i = 0; i < 16; ++i)
    out.push({ type: "object", properties: { v: randomSchema(r, 0, pick(r, ["number", "integer"])) }, required: ["v"] });
  return out;
}

// allOf's parts as one schema to generate from (properties and required joined); ajv judges what comes out.
function joined(parts, root) {
  const out = {};
  for (const p of parts.map((x) => (x.$ref ? root.$defs[x.$ref.split("/").pop()] : x))) {
    for (const [k, v] of Object.entries(p)) {
      if (k === "properties") out.properties = { ...(out.properties || {}), ...v };
      else if (k === "required") out.required = [...new Set([...(out.required || []), ...v])];
      else out[k] = v;
    }
  }
  return out;
}

// A number with at most `decimals` decimals, as the decimal it is written as (no 0.30000000000000004).
const decimal = (v, decimals = 3) => Number(v.toFixed(decimals));

function generate(r, s, root, depth = 0) {
  if (s === true || s === undefined) return pick(r, [1, "x", null, true, { k: 1 }, [2]]);
  if (s.allOf) {
    const { allOf, ...own } = s;
    return generate(r, joined([own, ...allOf], root), root, depth);
  }
  if (s.$ref) return generate(r, root.$defs[s.$ref.split("/").pop()], root, depth);
  if (s.anyOf || s.oneOf) return generate(r, pick(r, s.anyOf || s.oneOf), root, depth);
  if ("const" in s) return s.const;
  if (s.enum) return pick(r, s.enum);
  const type = Array.isArray(s.type) ? pick(r, s.type) : s.type;
  switch (type) {
    case "object": {
      const o = {};
      for (const [k, v] of Object.entries(s.properties || {}))
        if ((s.required || []).includes(k) || r() < 0.5) o[k] = generate(r, v, root, depth + 1);
      if (s.additionalProperties && r() < 0.5) o["extra" + Math.floor(r() * 9)] = generate(r, s.additionalProperties, root, depth + 1);
      return o;
    }
    case "array": {
      const min = s.minItems || 0, max = s.maxItems ?? min + 3;
      const n = min + Math.floor(r() * (max - min + 1));
      const out = [];
      for (let i = 0; i < n; ++i) out.push(generate(r, (s.prefixItems || [])[i] || s.items, root, depth + 1));
      return out;
    }
    case "string": {
      if (s.format && SAMPLES[s.format] && r() < 0.8) return pick(r, SAMPLES[s.format]);
      if (s.pattern && PATTERNS[s.pattern] && r() < 0.8) return pick(r, PATTERNS[s.pattern]);
      return randomString(r, s.minLength || 0, s.maxLength ?? 12);
    }
    case "integer":
    case "number": {
      const lo = s.minimum ?? s.exclusiveMinimum ?? -50, hi = s.maximum ?? s.exclusiveMaximum ?? 50;
      const span = Math.max(Math.min(hi, 1e6) - Math.max(lo, -1e6), 1);
      const v = Math.max(lo, -1e6) + r() * span;
      if (s.multipleOf && r() < 0.8) return decimal(Math.round(v / s.multipleOf) * s.multipleOf);
      if (type === "integer") return Math.round(v);
      return r() < 0.3 ? Math.round(v) : decimal(v);
    }
    case "boolean":
      return r() < 0.5;
    case "null":
      return null;
    default:
      return pick(r, [1, "x", null]);
  }
}

// One random change of a document: a value swapped, a number nudged, a key added or dropped.
function mutate(r, v) {
  if (Array.isArray(v) && v.length && r() < 0.7) {
    const i = Math.floor(r() * v.length);
    return v.map((x, j) => (j === i ? mutate(r, x) : x));
  }
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const keys = Object.keys(v);
    const roll = r();
    if (keys.length && roll < 0.5) {
      const k = pick(r, keys);
      return { ...v, [k]: mutate(r, v[k]) };
    }
    if (keys.length && roll < 0.7) {
      const { [pick(r, keys)]: _, ...rest } = v;
      return rest;
    }
    return { ...v, surprise: 1 };
  }
  if (typeof v === "number") {
    const changed = pick(r, [v + 1, v - 1, v * 10, -v, v + 0.5, 0, "1"]);
    // As a decimal (0.07 - 1 is -0.9299999999999999 in doubles), at the precision the value had.
    return typeof changed === "number" && Math.abs(changed) < 1e15 ? Number(changed.toPrecision(15)) : changed;
  }
  // (by code points: a surrogate pair cut in half is not a string a model can write)
  if (typeof v === "string") return pick(r, [v + "x", Array.from(v).slice(1).join(""), "", v.toUpperCase(), 5, v + v]);
  return pick(r, [0, "s", null, false, [], {}]);
}

// Every value of the schema has a bounded length, so that a writer that never chooses to end a string or an
// array (a model with random weights) still ends: strings get a maxLength, arrays a maxItems, and keys other
// than the listed properties are not allowed (a key is a free string).
function finite(s) {
  if (Array.isArray(s)) return s.map(finite);
  if (!s || typeof s !== "object") return s;
  const out = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === "const" || k === "enum") out[k] = v;
    else if (k === "properties" || k === "$defs") out[k] = Object.fromEntries(Object.entries(v).map(([n, x]) => [n, finite(x)]));
    else if (k !== "propertyNames") out[k] = finite(v);
  }
  const types = Array.isArray(s.type) ? s.type : [s.type];
  if (types.includes("string") && !("maxLength" in s) && !("enum" in s) && !("const" in s))
    out.maxLength = (s.minLength || 0) + (s.format ? 40 : s.pattern ? 20 : 8);
  if (types.includes("array")) out.maxItems = Math.min(s.maxItems ?? Infinity, (s.minItems || 0) + 2);
  if (types.includes("object") || "properties" in s) out.additionalProperties = false;
  // allOf's object parts: closing every part would leave only the keys all of them list. The part that
  // lists every key is closed (that bounds the merged object); the others keep what they allowed.
  if (Array.isArray(s.allOf)) {
    const keys = new Set(s.allOf.flatMap((p) => Object.keys(p?.properties || {})));
    out.allOf.forEach((f, i) => {
      const part = s.allOf[i];
      if (part?.properties && Object.keys(part.properties).length < keys.size)
        f.additionalProperties = part.additionalProperties === false ? false : true;
    });
  }
  return out;
}

const [mode, a, b] = process.argv.slice(2);
if (mode === "cases") {
  const r = rng(Number(a));
  const schemas = [...zodSchemas(), ...PYDANTIC];
  while (schemas.length < 300) schemas.push(randomSchema(r, 2));
  schemas.push(...extraSchemas(rng(Number(a) + 1)));
  const ajv = makeAjv();
  const docs = [];
  const out = schemas.map(strict);
  out.forEach((schema, i) => {
    const validate = ajv.compile(schema);
    for (let k = 0; k < 30; ++k) {
      let v = generate(r, schema, schema);
      if (k % 2) v = mutate(r, v);
      const text = JSON.stringify(v, null, k % 3 === 0 ? 2 : undefined);
      if (text === undefined) continue;
      docs.push([i, text, validate(v)]);
    }
  });
  writeFileSync(b, JSON.stringify({ schemas: out, docs }));
} else if (mode === "finite") {
  const r = rng(Number(a));
  const schemas = [...zodSchemas(), ...PYDANTIC];
  while (schemas.length < 300) schemas.push(randomSchema(r, 2));
  schemas.push(...extraSchemas(rng(Number(a) + 1)));
  writeFileSync(b, JSON.stringify({ schemas: schemas.map(strict).map(finite) }));
} else if (mode === "judge") {
  const input = JSON.parse(readFileSync(a, "utf8"));
  const ajv = makeAjv();
  const validators = input.schemas.map((s) => ajv.compile(s));
  writeFileSync(b, JSON.stringify(input.docs.map(([i, text]) => validators[i](JSON.parse(text)))));
} else {
  console.error("usage: schema_oracle.mjs cases SEED OUT | finite SEED OUT | judge IN OUT");
  process.exit(2);
}
