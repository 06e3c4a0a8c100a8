#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace moeserve {
namespace {

using ::testing::HasSubstr;
using namespace moeserve::testing;

std::string parse_error(const std::string& header, const std::vector<uint8_t>& data) {
  auto image = safetensors_image(header, data);
  return error_of([&] { parse_safetensors(image, "bad.safetensors"); });
}

TEST(Safetensors, WriteThenReadRoundTripsNamesShapesBytesAndMetadata) {
  TempDir dir;
  std::vector<uint8_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<uint8_t> b = {42};
  std::vector<TensorWrite> tensors = {TensorWrite::copy_of("a.weight", DType::BF16, {2, 3}, a),
                                      TensorWrite::copy_of("b", DType::U8, {1}, b),
                                      TensorWrite::copy_of("empty", DType::F32, {0, 4}, {})};
  write_safetensors(dir / "x.safetensors", tensors, {{"format", "pt"}, {"k", "v"}});

  TensorSet set = TensorSet::open_file(dir / "x.safetensors");
  ASSERT_EQ(set.tensors().size(), 3u);
  const TensorInfo* t = set.find("a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::BF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), a);
  EXPECT_EQ(set.find("b")->data[0], 42);
  EXPECT_EQ(set.find("empty")->nbytes, 0u);
  EXPECT_EQ(set.find("nope"), nullptr);
  EXPECT_EQ(set.metadata().at("k"), "v");
  EXPECT_EQ(set.total_bytes(), 13u);

  // The independent reader agrees on the bytes.
  EXPECT_EQ(raw_tensor(dir / "x.safetensors", "a.weight").bytes, a);
}

TEST(Safetensors, WriterAlignsEveryTensorToItsElementSizeWithoutGaps) {
  TempDir dir;
  std::vector<uint8_t> odd(3, 7), f32(8, 1), bf16(4, 2);
  std::vector<TensorWrite> tensors = {TensorWrite::copy_of("odd", DType::U8, {3}, odd),
                                      TensorWrite::copy_of("f32", DType::F32, {2}, f32),
                                      TensorWrite::copy_of("bf16", DType::BF16, {2}, bf16)};
  write_safetensors(dir / "x.safetensors", tensors);
  auto file = read_bytes(dir / "x.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[size_t(i)];
  EXPECT_EQ((8 + n) % 8, 0u);  // the data section is 8-aligned
  TensorSet set = TensorSet::open_file(dir / "x.safetensors");
  size_t covered = 0;
  for (const auto& t : set.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << t.name;
    covered += t.nbytes;
  }
  EXPECT_EQ(8 + n + covered, file.size());
}

TEST(Safetensors, RejectsFileShorterThanItsLengthField) {
  std::vector<uint8_t> tiny = {1, 0, 0};
  EXPECT_THAT(error_of([&] { parse_safetensors(tiny, "t.safetensors"); }),
              HasSubstr("t.safetensors: 3 bytes is too short"));
}

TEST(Safetensors, RejectsHeaderLengthThatRunsPastTheFile) {
  auto image = safetensors_image("{}", {});
  image[0] = 200;  // claims a 200-byte header in a 10-byte file
  EXPECT_THAT(error_of([&] { parse_safetensors(image, "lying.safetensors"); }),
              HasSubstr("lying.safetensors: header length 200 runs past the end of the file"));
  image[0] = 0;
  image[7] = 0x80;  // 2^63: must not overflow the bounds check
  EXPECT_THAT(error_of([&] { parse_safetensors(image, "lying.safetensors"); }),
              HasSubstr("runs past the end"));
}

TEST(Safetensors, RejectsTruncatedDataNamingTheTensor) {
  TempDir dir;
  std::vector<uint8_t> bytes(64, 1);
  std::vector<TensorWrite> tensors = {TensorWrite::copy_of("w", DType::F32, {4, 4}, bytes)};
  write_safetensors(dir / "x.safetensors", tensors);
  auto file = read_bytes(dir / "x.safetensors");
  file.resize(file.size() - 10);
  EXPECT_THAT(
      error_of([&] { parse_safetensors(file, "cut.safetensors"); }),
      HasSubstr("cut.safetensors: tensor 'w': data_offsets [0,64] run past the data section (54 bytes)"));
}

TEST(Safetensors, RejectsBadJson) {
  EXPECT_THAT(parse_error("{\"a\": ", {}), HasSubstr("bad.safetensors: the header is not valid JSON"));
  EXPECT_THAT(parse_error("[1, 2]", {}), HasSubstr("must be a JSON object"));
  EXPECT_THAT(parse_error(std::string(50, '[') + std::string(50, ']'), {}), HasSubstr("nested too deeply"));
}

TEST(Safetensors, RejectsUnknownDtypeNamingTheTensorAndTheSupportedOnes) {
  EXPECT_THAT(parse_error(R"({"x.w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}})", {0}),
              HasSubstr("tensor 'x.w': unknown dtype 'F8_E5M2' (supported: F32, F16, BF16, F8_E4M3"));
}

TEST(Safetensors, RejectsOverlappingTensors) {
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          std::vector<uint8_t>(12)),
              HasSubstr("tensors 'a' and 'b' overlap"));
}

TEST(Safetensors, RejectsOffsetsThatDisagreeWithShapeTimesDtype) {
  EXPECT_THAT(
      parse_error(R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
      HasSubstr("tensor 'a': data_offsets [0,8] hold 8 bytes but BF16 [2, 3] needs 12"));
  EXPECT_THAT(
      parse_error(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[4,0]}})", std::vector<uint8_t>(8)),
      HasSubstr("tensor 'a': bad data_offsets"));
}

TEST(Safetensors, RejectsMalformedEntries) {
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", {}),
              HasSubstr("shape entry -1 is not a non-negative integer"));
  EXPECT_THAT(
      parse_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", {}),
      HasSubstr("overflows"));
  EXPECT_THAT(parse_error(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", std::vector<uint8_t>(4)),
              HasSubstr("tensor 'a': missing or non-string 'dtype'"));
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::vector<uint8_t>(4)),
              HasSubstr("'data_offsets' must be a list [begin, end]"));
  EXPECT_THAT(parse_error(R"({"a":7})", {}), HasSubstr("tensor 'a': header entry must be an object"));
  EXPECT_THAT(parse_error(R"({"__metadata__":{"format":1}})", {}),
              HasSubstr("'__metadata__' value 'format'"));
}

TEST(Safetensors, RejectsDuplicateNames) {
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          std::vector<uint8_t>(2)),
              HasSubstr("tensor 'a' appears twice in the header"));
}

std::vector<TensorWrite> numbered_tensors(int n) {
  std::vector<TensorWrite> tensors;
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> bytes(400, uint8_t(i));
    tensors.push_back(TensorWrite::copy_of("t" + std::to_string(i), DType::F32, {10, 10}, bytes));
  }
  return tensors;
}

TEST(Safetensors, ShardedDirectoryRoundTripsThroughTheIndex) {
  TempDir dir;
  auto tensors = numbered_tensors(5);
  write_safetensors_dir(dir.path(), tensors, 1000);  // two tensors per shard
  EXPECT_TRUE(fs::exists(dir / "model-00001-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "model-00003-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  auto index = read_json(dir / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");

  TensorSet set = TensorSet::open_dir(dir.path());
  ASSERT_EQ(set.tensors().size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(set.find("t" + std::to_string(i))->data[399], i);

  // Rewriting as a single file removes the old shards and index.
  write_safetensors_dir(dir.path(), tensors, 1 << 20);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00003.safetensors"));
  EXPECT_EQ(TensorSet::open_dir(dir.path()).tensors().size(), 5u);
}

TEST(Safetensors, MissingShardIsNamed) {
  TempDir dir;
  write_safetensors_dir(dir.path(), numbered_tensors(5), 1000);
  fs::remove(dir / "model-00002-of-00003.safetensors");
  EXPECT_THAT(error_of([&] { TensorSet::open_dir(dir.path()); }),
              HasSubstr("shard " + (dir / "model-00002-of-00003.safetensors") +
                        " (holding 't2' and others) is missing"));
}

TEST(Safetensors, IndexThatListsATensorItsShardLacksIsAnError) {
  TempDir dir;
  write_safetensors_dir(dir.path(), numbered_tensors(5), 1000);
  auto index = read_json(dir / "model.safetensors.index.json");
  index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  write_json(dir / "model.safetensors.index.json", index);
  EXPECT_THAT(
      error_of([&] { TensorSet::open_dir(dir.path()); }),
      HasSubstr("lists tensor 'ghost' in model-00001-of-00003.safetensors, but that shard does not hold it"));

  index["weight_map"].erase("ghost");
  index["weight_map"]["t0"] = "../elsewhere.safetensors";
  write_json(dir / "model.safetensors.index.json", index);
  EXPECT_THAT(error_of([&] { TensorSet::open_dir(dir.path()); }), HasSubstr("not a file beside the index"));
}

TEST(Safetensors, TensorInTwoShardsIsAnError) {
  TempDir dir;
  auto tensors = numbered_tensors(2);
  write_safetensors(dir / "model-00001-of-00002.safetensors", std::span(tensors).subspan(0, 1));
  std::vector<TensorWrite> second = {TensorWrite::copy_of("t0", DType::U8, {1}, std::vector<uint8_t>{1})};
  write_safetensors(dir / "model-00002-of-00002.safetensors", second);
  write_json(dir / "model.safetensors.index.json",
             {{"weight_map",
               {{"t0", "model-00001-of-00002.safetensors"}, {"x", "model-00002-of-00002.safetensors"}}}});
  EXPECT_THAT(error_of([&] { TensorSet::open_dir(dir.path()); }), HasSubstr("tensor 't0' appears in both"));
}

TEST(Safetensors, DirectoryWithoutWeightsIsAnError) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { TensorSet::open_dir(dir.path()); }),
              HasSubstr("no model.safetensors or model.safetensors.index.json"));
}

}  // namespace
}  // namespace moeserve
