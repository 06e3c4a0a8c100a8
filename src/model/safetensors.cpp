#include "model/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "common/error.h"
#include "common/mapped_file.h"

namespace moeserve {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Real headers are a few MB at most (a 100k-tensor checkpoint); anything larger is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr const char* kKnownDTypes = "F32, F16, BF16, F8_E4M3, F64, I64, I32, I16, I8, U8, BOOL";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A non-negative integer JSON value, or nullopt (negative, fractional, too large, or not a number).
std::optional<uint64_t> as_count(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

// Streams over the header JSON without building it: top-level keys must be unique and nesting at most
// kMaxDepth deep (a real header is 3: header object, tensor entry, shape list).
class HeaderScan : public nlohmann::json_sax<json> {
 public:
  static constexpr int kMaxDepth = 3;
  std::string duplicate;
  bool too_deep = false;
  std::string syntax_error;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& name) override {
    if (depth_ != 1 || seen_.insert(name).second) return true;
    duplicate = name;
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_error = e.what();
    return false;
  }

 private:
  bool enter() {
    too_deep = ++depth_ > kMaxDepth;
    return !too_deep;
  }
  int depth_ = 0;
  std::unordered_set<std::string> seen_;
};

TensorInfo parse_entry(const std::string& label, const std::string& name, const json& entry,
                       const uint8_t* data_section, uint64_t data_size) {
  check(entry.is_object(), "{}: tensor '{}': header entry must be an object", label, name);
  TensorInfo t;
  t.name = name;
  t.file = label;

  auto dt = entry.find("dtype");
  check(dt != entry.end() && dt->is_string(), "{}: tensor '{}': missing or non-string 'dtype'", label, name);
  auto dtype = parse_dtype(dt->get_ref<const std::string&>());
  check(dtype.has_value(), "{}: tensor '{}': unknown dtype '{}' (supported: {})", label, name,
        dt->get_ref<const std::string&>(), kKnownDTypes);
  t.dtype = *dtype;

  // Messages that show JSON are built only on failure: dump() per tensor would dominate large headers.
  auto sh = entry.find("shape");
  check(sh != entry.end() && sh->is_array(), "{}: tensor '{}': missing or non-list 'shape'", label, name);
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    auto dim = as_count(d);
    if (!dim || *dim > uint64_t(INT64_MAX))
      fail("{}: tensor '{}': shape entry {} is not a non-negative integer", label, name, d.dump());
    if (__builtin_mul_overflow(numel, *dim, &numel))
      fail("{}: tensor '{}': shape {} overflows", label, name, sh->dump());
    t.shape.push_back(int64_t(*dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes))
    fail("{}: tensor '{}': shape {} overflows", label, name, sh->dump());

  auto off = entry.find("data_offsets");
  check(off != entry.end() && off->is_array() && off->size() == 2,
        "{}: tensor '{}': 'data_offsets' must be a list [begin, end]", label, name);
  auto begin = as_count((*off)[0]), end = as_count((*off)[1]);
  if (!begin || !end || *begin > *end) fail("{}: tensor '{}': bad data_offsets {}", label, name, off->dump());
  if (*end > data_size)
    fail("{}: tensor '{}': data_offsets {} run past the data section ({} bytes); truncated file?", label,
         name, off->dump(), data_size);
  if (*end - *begin != nbytes)
    fail("{}: tensor '{}': data_offsets {} hold {} bytes but {} {} needs {}", label, name, off->dump(),
         *end - *begin, dtype_name(t.dtype), shape_string(t.shape), nbytes);
  t.data = data_section + *begin;
  t.nbytes = size_t(nbytes);
  return t;
}

// Opens a file for writing, failing with the path and the OS reason.
struct OutFile {
  explicit OutFile(const std::string& p) : path(p), f(std::fopen(p.c_str(), "wb")) {
    check(f != nullptr, "cannot create {}: {}", path, std::strerror(errno));
  }
  ~OutFile() {
    if (f) std::fclose(f);
  }
  void write(const void* data, size_t n) {
    check(std::fwrite(data, 1, n, f) == n, "cannot write {}: {}", path, std::strerror(errno));
  }
  void close() {
    int rc = std::fclose(f);
    f = nullptr;
    check(rc == 0, "cannot write {}: {}", path, std::strerror(errno));
  }
  std::string path;
  std::FILE* f;
};

}  // namespace

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string TensorInfo::describe() const {
  return fmt::format("{} {}", dtype_name(dtype), shape_string(shape));
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> bytes, const std::string& label) {
  check(bytes.size() >= 8, "{}: {} bytes is too short for a safetensors file (truncated?)", label,
        bytes.size());
  uint64_t header_len = read_u64_le(bytes.data());
  check(header_len <= bytes.size() - 8,
        "{}: header length {} runs past the end of the file ({} bytes): truncated or not a safetensors file",
        label, header_len, bytes.size());
  check(header_len <= kMaxHeaderBytes, "{}: header length {} is implausibly large (limit {})", label,
        header_len, kMaxHeaderBytes);
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);

  // A first, streaming pass refuses what the DOM parse would hide or choke on: duplicate names (nlohmann
  // keeps the last silently), deep nesting, and syntax errors. (nlohmann's callback parser could do this
  // in one pass, but it rescans the enclosing object at every '}', which is quadratic in the tensor count.)
  HeaderScan scan;
  if (!json::sax_parse(text, text + header_len, &scan)) {
    if (!scan.duplicate.empty()) fail("{}: tensor '{}' appears twice in the header", label, scan.duplicate);
    if (scan.too_deep) fail("{}: header JSON is nested too deeply", label);
    fail("{}: the header is not valid JSON: {}", label, scan.syntax_error);
  }
  json root;
  try {
    root = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    fail("{}: the header is not valid JSON: {}", label, e.what());
  }
  check(root.is_object(), "{}: the header must be a JSON object", label);

  const uint8_t* data_section = bytes.data() + 8 + header_len;
  uint64_t data_size = bytes.size() - 8 - header_len;
  SafetensorsHeader h;
  h.tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      check(entry.is_object(), "{}: '__metadata__' must be an object", label);
      for (const auto& [k, v] : entry.items()) {
        check(v.is_string(), "{}: '__metadata__' value '{}' must be a string", label, k);
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(label, name, entry, data_section, data_size));
  }

  // No two tensors may share bytes (zero-size tensors occupy none).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : h.tensors)
    if (t.nbytes) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    check(by_offset[i]->data >= prev.data + prev.nbytes,
          "{}: tensors '{}' and '{}' overlap in the data section", label, prev.name, by_offset[i]->name);
  }
  return h;
}

void TensorSet::add(TensorInfo tensor) {
  auto [it, inserted] = index_.emplace(tensor.name, tensors_.size());
  // Not check(): its arguments are evaluated first, and it->second is one past the end when inserted.
  if (!inserted)
    fail("tensor '{}' appears in both {} and {}", tensor.name, tensors_[it->second].file, tensor.file);
  tensors_.push_back(std::move(tensor));
}

const TensorInfo* TensorSet::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

size_t TensorSet::total_bytes() const {
  size_t total = 0;
  for (const auto& t : tensors_) total += t.nbytes;
  return total;
}

void TensorSet::add_file(const std::string& path, const std::string& label) {
  auto file = std::make_shared<MappedFile>(path);
  auto header = parse_safetensors(file->bytes(), label);
  for (auto& t : header.tensors) add(std::move(t));
  if (metadata_.empty()) metadata_ = std::move(header.metadata);
  keep_alive(std::move(file));
}

TensorSet TensorSet::open_file(const std::string& path) {
  TensorSet set;
  set.add_file(path, path);
  return set;
}

TensorSet TensorSet::open_dir(const std::string& dir) {
  fs::path index_path = fs::path(dir) / kIndexName;
  if (!fs::exists(index_path)) {
    fs::path single = fs::path(dir) / "model.safetensors";
    check(fs::exists(single), "{}: no model.safetensors or {} in this directory", dir, kIndexName);
    return open_file(single.string());
  }

  const std::string index_name = index_path.string();
  json index;
  {
    std::ifstream in(index_path);
    check(in.good(), "cannot open {}", index_name);
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      fail("{} is not valid JSON: {}", index_name, e.what());
    }
  }
  auto wm = index.is_object() ? index.find("weight_map") : index.end();
  check(wm != index.end() && wm->is_object(), "{}: missing 'weight_map' object", index_name);

  // Shards in order of first mention; each one a plain file name beside the index.
  std::vector<std::string> shards;
  std::unordered_map<std::string, std::string> first_tensor;
  for (const auto& [name, file] : wm->items()) {
    check(file.is_string(), "{}: weight_map entry '{}' must be a file name", index_name, name);
    const auto& f = file.get_ref<const std::string&>();
    check(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
          "{}: weight_map entry '{}' names '{}', which is not a file beside the index", index_name, name, f);
    if (first_tensor.emplace(f, name).second) shards.push_back(f);
  }
  TensorSet set;
  for (const auto& shard : shards) {
    fs::path p = fs::path(dir) / shard;
    check(fs::exists(p), "{}: shard {} (holding '{}' and others) is missing", index_name, p.string(),
          first_tensor[shard]);
    set.add_file(p.string(), p.string());
  }
  for (const auto& [name, file] : wm->items()) {
    const TensorInfo* t = set.find(name);
    std::string expected = (fs::path(dir) / file.get<std::string>()).string();
    check(t != nullptr && t->file == expected, "{}: lists tensor '{}' in {}, but that shard does not hold it",
          index_name, name, file.get<std::string>());
  }
  return set;
}

size_t TensorWrite::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

TensorWrite TensorWrite::copy_of(std::string name, DType dtype, std::vector<int64_t> shape,
                                 std::span<const uint8_t> bytes) {
  TensorWrite t{std::move(name), dtype, std::move(shape), {}};
  check(bytes.size() == t.nbytes(), "tensor '{}': {} bytes given, {} needed", t.name, bytes.size(),
        t.nbytes());
  auto copy = std::make_shared<std::vector<uint8_t>>(bytes.begin(), bytes.end());
  t.fill = [copy](uint8_t* dst) { std::memcpy(dst, copy->data(), copy->size()); };
  return t;
}

void write_safetensors(const std::string& path, std::span<const TensorWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0, largest = 0;
  for (size_t i : order) {
    const auto& t = tensors[i];
    check(!header.contains(t.name), "{}: tensor '{}' given twice", path, t.name);
    size_t n = t.nbytes();
    header[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    largest = std::max(largest, n);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-aligned

  // Written beside the target and renamed at the end, so a crash never leaves a half-written checkpoint.
  std::string tmp = path + ".tmp";
  OutFile out(tmp);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<uint8_t> buffer(largest);
  for (size_t i : order) {
    size_t n = tensors[i].nbytes();
    if (n == 0) continue;
    tensors[i].fill(buffer.data());
    out.write(buffer.data(), n);
  }
  out.close();
  fs::rename(tmp, path);
}

void write_safetensors_dir(const std::string& dir, std::span<const TensorWrite> tensors,
                           size_t max_shard_bytes) {
  fs::create_directories(dir);
  fs::path index_path = fs::path(dir) / kIndexName;
  size_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();

  // Leftovers of an earlier write would be read instead of (or beside) the new files.
  std::error_code ignored;
  fs::remove(index_path, ignored);
  fs::remove(fs::path(dir) / "model.safetensors", ignored);
  for (const auto& entry : fs::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.starts_with("model-") && name.ends_with(".safetensors")) fs::remove(entry.path(), ignored);
  }

  if (total <= max_shard_bytes) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
    return;
  }
  // Greedy split in the given order, as save_pretrained does.
  std::vector<std::pair<size_t, size_t>> ranges;  // [begin, end) into tensors
  size_t begin = 0, bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t n = tensors[i].nbytes();
    if (i > begin && bytes + n > max_shard_bytes) {
      ranges.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += n;
  }
  ranges.emplace_back(begin, tensors.size());

  json weight_map = json::object();
  for (size_t s = 0; s < ranges.size(); ++s) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, ranges.size());
    auto [b, e] = ranges[s];
    write_safetensors((fs::path(dir) / name).string(), tensors.subspan(b, e - b));
    for (size_t i = b; i < e; ++i) weight_map[tensors[i].name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(index_path);
  out << index.dump(2) << "\n";
  check(out.good(), "cannot write {}", index_path.string());
}

}  // namespace moeserve
