// Hostile files (issue 15), unit level: checked size arithmetic, number parsing without
// exceptions, the JSON depth bound, checkpoint folder names, the manifest rules (names, shards,
// sizes, checksums, symlinks), overflowing configs and layouts, non-finite tensors refused on
// read; (issue 42) data files opened as plain files inside their folder, error messages that quote
// no file's bytes, bounded tensor names, outputs that never clobber a link, FIFO or input. The same
// classes end to end through the CLI: tests/hostile_files.sh.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "test_util.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "io/output_file.h"
#include "io/parse_number.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "train/checkpoint_manifest.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fresh_dir(const std::string& name) { return moe::test_util::fresh_scratch_dir("hf", name); }

using moe::test_util::error_of;

#define EXPECT_ERROR_HAS(expr, text)                                            \
  do {                                                                          \
    const std::string err_ = error_of([&] { (void)(expr); });                   \
    EXPECT_NE(err_.find(text), std::string::npos) << "error: '" << err_ << "'"; \
  } while (0)

TEST(CheckedMath, DetectsOverflow) {
  int64_t out = 0;
  EXPECT_TRUE(moe::checked_mul<int64_t>(int64_t{1} << 31, int64_t{1} << 31, &out));
  EXPECT_EQ(out, int64_t{1} << 62);
  EXPECT_FALSE(moe::checked_mul<int64_t>(int64_t{1} << 32, int64_t{1} << 32, &out));
  size_t u = 0;
  EXPECT_FALSE(moe::checked_add<size_t>(std::numeric_limits<size_t>::max(), 1, &u));
  EXPECT_ERROR_HAS(moe::mul_or_throw<int64_t>(int64_t{1} << 40, int64_t{1} << 40, "bytes of x"),
                   "bytes of x overflows (1099511627776 * 1099511627776)");
  EXPECT_EQ(moe::add_or_throw<int>(2, 3, "n"), 5);
}

TEST(ParseNumber, WholeStringsInRangeOnly) {
  using moe::io::try_parse_int;
  EXPECT_EQ(try_parse_int<uint64_t>("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(try_parse_int<uint64_t>("18446744073709551616"));
  EXPECT_FALSE(try_parse_int<uint64_t>("-1"));
  EXPECT_FALSE(try_parse_int<int>(""));
  EXPECT_FALSE(try_parse_int<int>("12abc"));
  EXPECT_FALSE(try_parse_int<int>(" 12"));
  EXPECT_FALSE(try_parse_int<int>("+12"));
  EXPECT_FALSE(try_parse_int<int>("0x10"));
  EXPECT_EQ(try_parse_int<int>("-5"), -5);
  EXPECT_FALSE(try_parse_int<int>("5", 6, 10));
  // The error names what was parsed, never the bare word "stoi".
  EXPECT_ERROR_HAS(moe::io::parse_int<int>("99999999999", "ck/manifest.json: field \"step\""),
                   "ck/manifest.json: field \"step\": \"99999999999\" is not an integer in [-2147483648, 2147483647]");
}

TEST(JsonDepth, BoundedAtEveryLevelNotInStrings) {
  using moe::io::check_json_depth;
  const std::string ok = std::string(256, '[') + std::string(256, ']');
  EXPECT_NO_THROW(check_json_depth(ok, "f.json"));
  EXPECT_NO_THROW(moe::io::parse_json(ok, "f.json"));
  const std::string deep = std::string(257, '[') + std::string(257, ']');
  EXPECT_ERROR_HAS(check_json_depth(deep, "f.json"), "f.json: JSON nested deeper than 256 levels (at byte 256)");
  // Brackets inside strings (and escaped quotes) do not count.
  const std::string in_string = "{\"k\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}";
  EXPECT_NO_THROW(moe::io::parse_json(in_string, "s.json"));
  // 100000 levels, the size that overflowed the stack: an error, fast.
  const std::string huge = std::string(100000, '{') + std::string(100000, '}');
  EXPECT_ERROR_HAS(moe::io::parse_json(huge, "h.json"), "h.json: JSON nested deeper than 256 levels");
  EXPECT_ERROR_HAS(moe::io::parse_json("{\"a\": [1,", "t.json"), "t.json: not valid JSON (");
}

TEST(JsonFile, RefusesFoldersAndUnboundedFiles) {
  const std::string d = fresh_dir("jsonfile");
  EXPECT_ERROR_HAS(moe::io::read_json_file(d, "config file"), "is a folder, not a config file");
  EXPECT_ERROR_HAS(moe::io::read_file_bounded("/dev/zero", "profile", 1 << 20),
                   "/dev/zero: profile is more than the limit of 1048576 bytes");
  std::ofstream(d + "/big.json") << std::string(2000, ' ') << "{}";
  EXPECT_ERROR_HAS(moe::io::read_file_bounded(d + "/big.json", "config file", 1000),
                   "big.json: config file is 2002 bytes, more than the limit of 1000");
  fs::create_symlink(d + "/big.json", d + "/link.json");
  EXPECT_ERROR_HAS(moe::io::read_file_bounded(d + "/link.json", "manifest", 1 << 20, /*no_follow=*/true),
                   "link.json: is a symbolic link");
  EXPECT_ERROR_HAS(moe::io::read_json_file(d + "/none.json", "config file"),
                   "none.json: cannot open config file");
}

TEST(CheckpointNames, OnlyCanonicalStepFolders) {
  using moe::train::checkpoint_step_of;
  EXPECT_EQ(checkpoint_step_of("step-0"), 0);
  EXPECT_EQ(checkpoint_step_of("step-12"), 12);
  EXPECT_EQ(checkpoint_step_of("step-2147483647"), INT_MAX);
  for (const char* n : {"step-2147483648", "step-99999999999", "step-abc", "step-", "step-007",
                        "step--3", "step-+3", "step-5.tmp", "step-5 ", "Step-5", "x-step-5"})
    EXPECT_EQ(checkpoint_step_of(n), -1) << n;
}

TEST(CheckpointNames, PlainShardAndTensorNames) {
  using moe::train::is_plain_shard_name;
  using moe::train::is_plain_tensor_name;
  EXPECT_TRUE(is_plain_shard_name("shard-00000.safetensors"));
  for (const char* n : {"../shard.safetensors", "/etc/shard.safetensors", "a/b.safetensors",
                        "a\\b.safetensors", ".hidden.safetensors", "shard.bin", ".safetensors",
                        "a..b.safetensors", "", "sh\nard.safetensors"})
    EXPECT_FALSE(is_plain_shard_name(n)) << n;
  EXPECT_FALSE(is_plain_shard_name(std::string(300, 'a') + ".safetensors"));
  EXPECT_TRUE(is_plain_tensor_name("model.layers.3.mlp.experts.5.up_proj.weight"));
  for (const char* n : {"../../etc/passwd", "a/b", "a..b", "", "a b"})
    EXPECT_FALSE(is_plain_tensor_name(n)) << n;
}

// A valid manifest; tests break one rule at a time.
json manifest_json() {
  return {{"format", moe::train::kCheckpointFormat},
          {"step", 2},
          {"data_rng_state", "123"},
          {"seed", "42"},
          {"bad_steps", 0},
          {"config", {{"hidden_size", 32}}},
          {"tensors", {{"w", "shard-00000.safetensors"}}},
          {"shards", {{"shard-00000.safetensors", {{"bytes", 100}, {"fnv1a64", "0123456789abcdef"}}}}}};
}

TEST(Manifest, ValidParses) {
  moe::train::Manifest m = moe::train::parse_manifest(manifest_json().dump(), "ck/manifest.json");
  EXPECT_EQ(m.meta.step, 2);
  EXPECT_EQ(m.meta.data_rng_state, 123u);
  EXPECT_EQ(m.meta.seed, 42u);
  EXPECT_EQ(m.tensors.at("w"), "shard-00000.safetensors");
  EXPECT_EQ(m.shards.at("shard-00000.safetensors").bytes, 100u);
}

TEST(Manifest, EveryRuleNamesTheField) {
  auto err = [](const std::function<void(json&)>& edit) {
    json j = manifest_json();
    edit(j);
    return error_of([&] { moe::train::parse_manifest(j.dump(), "ck/manifest.json"); });
  };
  auto has = [](const std::string& e, const std::string& want) {
    return e.find(want) != std::string::npos && e.rfind("ck/manifest.json", 0) == 0;
  };
  EXPECT_PRED2(has, err([](json& j) { j["shards"] = json::object(); }),
               "tensor w is in shard shard-00000.safetensors, which \"shards\" does not list");
  EXPECT_PRED2(has, err([](json& j) { j["tensors"]["w"] = "../x.safetensors"; }),
               "shard name \"../x.safetensors\" is not a plain file name");
  EXPECT_PRED2(has, err([](json& j) {
                 j["shards"]["/abs/x.safetensors"] = j["shards"]["shard-00000.safetensors"];
               }),
               "shard name \"/abs/x.safetensors\" is not a plain file name");
  EXPECT_PRED2(has, err([](json& j) { j["tensors"]["a/../b"] = "shard-00000.safetensors"; }),
               "tensor name \"a/../b\" is not a plain tensor name");
  EXPECT_PRED2(has, err([](json& j) { j["tensors"]["w"] = 7; }), "tensor w: its shard must be a file name");
  EXPECT_PRED2(has, err([](json& j) { j["shards"]["shard-00000.safetensors"]["bytes"] = -1; }),
               "\"bytes\" must be a non-negative integer");
  EXPECT_PRED2(has, err([](json& j) { j["shards"]["shard-00000.safetensors"]["bytes"] = 1e300; }),
               "\"bytes\" must be a non-negative integer");
  EXPECT_PRED2(has, err([](json& j) { j["shards"]["shard-00000.safetensors"]["fnv1a64"] = "xyz"; }),
               "\"fnv1a64\" must be 16 lowercase hex digits");
  EXPECT_PRED2(has, err([](json& j) { j["step"] = -1; }), "field \"step\" must be an integer in [0, 2147483647], got -1");
  EXPECT_PRED2(has, err([](json& j) { j["step"] = 4294967298ull; }), "field \"step\" must be an integer");
  EXPECT_PRED2(has, err([](json& j) { j["step"] = "2"; }), "field \"step\" must be an integer");
  EXPECT_PRED2(has, err([](json& j) { j.erase("step"); }), "field \"step\" is missing");
  EXPECT_PRED2(has, err([](json& j) { j["bad_steps"] = 0.5; }), "field \"bad_steps\" must be an integer");
  EXPECT_PRED2(has, err([](json& j) { j["seed"] = "-1"; }), "field \"seed\": \"-1\" is not an integer");
  EXPECT_PRED2(has, err([](json& j) { j["seed"] = 42; }), "field \"seed\" must be a decimal string");
  EXPECT_PRED2(has, err([](json& j) { j["config"] = json::array(); }), "field \"config\" must be a JSON object");
  EXPECT_PRED2(has, err([](json& j) { j["tensors"] = json::array(); }), "field \"tensors\" must be a JSON object");
  EXPECT_PRED2(has, err([](json& j) { j.erase("shards"); }), "field \"shards\" must be a JSON object");
  EXPECT_PRED2(has, err([](json& j) { j["format"] = 5; }), "format \"\" is not moetrain-checkpoint-1");
  EXPECT_PRED2(has, err([](json& j) { j["parallel"] = 3; }), "\"parallel\" and \"expert_placement\" must be JSON objects");
  EXPECT_PRED2(has, err([](json& j) { j = json::array(); }), "not a JSON object");
}

TEST(Manifest, ShardsArePlainFilesOfTheRecordedSizeAndChecksum) {
  const std::string d = fresh_dir("shards");
  const std::string outside = fresh_dir("shards_outside");
  // A shard of weights w and AdamW moments; `v0` is the first second moment, `w1` a weight.
  auto write_shard = [](const std::string& path, float w1, float v0) {
    const float w[2] = {1.0f, w1}, mo[2] = {0.0f, 0.0f}, v[2] = {v0, 1.0f};
    moe::io::SafetensorsWriter sw;
    sw.add_f32("w", {2}, w);
    sw.add_f32("adam_m.w", {2}, mo);
    sw.add_f32("adam_v.w", {2}, v);
    sw.write(path);
  };
  auto info_of = [](const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    const moe::train::ShardInfo i{fs::file_size(path), moe::train::hex64(moe::train::fd_checksum(fd, path))};
    ::close(fd);
    return i;
  };
  const std::string shard = d + "/shard-00000.safetensors";
  write_shard(outside + "/s.safetensors", 2.0f, 0.5f);
  write_shard(shard, 2.0f, 0.5f);
  const moe::train::ShardInfo good = info_of(shard);
  moe::train::Manifest m;
  m.shards["shard-00000.safetensors"] = good;
  EXPECT_NO_THROW(moe::train::verify_shards(d, m));
  m.shards["shard-00000.safetensors"].bytes = std::numeric_limits<uint64_t>::max();
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m),
                   "shard shard-00000.safetensors has " + std::to_string(good.bytes) +
                       " bytes, the manifest says 18446744073709551615");
  m.shards["shard-00000.safetensors"] = {good.bytes, "0000000000000000"};
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m), "shard shard-00000.safetensors checksum mismatch");
  // Consistent size and checksum, but a NaN weight or a negative second moment inside.
  write_shard(shard, std::nanf(""), 0.5f);
  m.shards["shard-00000.safetensors"] = info_of(shard);
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m), "tensor \"w\" holds NaN at [1]");
  write_shard(shard, 2.0f, -0.25f);
  m.shards["shard-00000.safetensors"] = info_of(shard);
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m),
                   "tensor \"adam_v.w\" holds a negative second moment -0.25 at element 0");
  // Same bytes behind a symlink out of the folder: refused, although size and checksum match.
  fs::remove(shard);
  fs::create_symlink(outside + "/s.safetensors", shard);
  m.shards["shard-00000.safetensors"] = good;
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m), "shard shard-00000.safetensors is a symbolic link");
  fs::remove(shard);
  EXPECT_ERROR_HAS(moe::train::verify_shards(d, m), "shard shard-00000.safetensors is missing");
  // A manifest that is a symlink, or absent.
  std::ofstream(outside + "/manifest.json") << manifest_json().dump();
  fs::create_symlink(outside + "/manifest.json", d + "/manifest.json");
  EXPECT_ERROR_HAS(moe::train::read_manifest(d), "manifest.json: is a symbolic link");
  EXPECT_ERROR_HAS(moe::train::read_manifest(outside + "/nothing"), "no manifest (not a complete checkpoint)");
}

moe::model::ModelConfig small_config() {
  moe::model::ModelConfig c = moe::model::preset("test-dense");
  return c;
}

TEST(ConfigSizes, OverflowNamesTheFields) {
  moe::model::ModelConfig c = small_config();
  c.vocab_size = INT_MAX;
  c.hidden_size = 1 << 30;
  EXPECT_ERROR_HAS(c.validate("big.json"),
                   "big.json: vocab_size * hidden_size = 2147483647 * 1073741824 exceeds");
  c = small_config();
  c.hidden_size = 1 << 30;
  c.num_attention_heads = 1 << 20;
  c.num_hidden_layers = 4;  // 4 layers * 4 * H^2 = 2^64 exactly: wrapped to 0 before
  EXPECT_ERROR_HAS(c.validate("wrap.json"), "wrap.json: 4 * hidden_size * hidden_size");
  c = small_config();
  c.intermediate_size = INT_MAX;
  c.hidden_size = 1 << 26;  // attention 4 * H^2 = 2^54 fits; 3 * H * I ~ 2^58.6 does not
  c.num_attention_heads = 1 << 16;
  c.vocab_size = 256;
  EXPECT_ERROR_HAS(c.validate("i.json"), "i.json: 3 * hidden_size * intermediate_size");
  c = moe::model::preset("test-moe");
  c.n_routed_experts = 1 << 21;
  EXPECT_ERROR_HAS(c.validate("e.json"), "e.json: n_routed_experts = 2097152 over 2 MoE layers gives more than 1048576 named tensors");
  c = small_config();
  c.num_hidden_layers = INT_MAX;
  EXPECT_ERROR_HAS(c.validate("l.json"), "l.json: \"num_hidden_layers\" = 2147483647 gives more than");
  // count_params is checked too (for configs that skipped validate).
  c = small_config();
  c.vocab_size = INT_MAX;
  c.hidden_size = INT_MAX;
  c.num_hidden_layers = 8;
  EXPECT_ERROR_HAS(moe::model::count_params(c), "parameter count overflows");
  // The same through JSON: the error names the file.
  json j = moe::model::config_to_json(small_config());
  j["vocab_size"] = INT_MAX;
  j["hidden_size"] = 1 << 30;
  EXPECT_ERROR_HAS(moe::model::config_from_json(j, "hf.json"), "hf.json: vocab_size * hidden_size");
}

TEST(ConfigSizes, LayoutOfAnUnvalidatedConfigDoesNotWrap) {
  moe::model::ModelConfig c = small_config();
  c.num_hidden_layers = 0;  // only the embedding, final norm and head
  c.hidden_size = INT_MAX;
  c.vocab_size = INT_MAX;
  EXPECT_ERROR_HAS(moe::model::ParamLayout(c),
                   "parameter model.embed_tokens.weight: shape [2147483647, 2147483647] is too large");
  c.vocab_size = 1 << 30;
  c.hidden_size = 1 << 29;  // each [V, H] is 2^59 elements; the two together pass 2^64 / 16
  EXPECT_ERROR_HAS(moe::model::ParamLayout(c), "parameter lm_head.weight: the model's parameter count overflows");
}

TEST(SafetensorsFinite, NonFiniteFloatsRefusedNamingTheElement) {
  const std::string d = fresh_dir("finite");
  std::vector<float> emb(4 * 3, 0.5f), ok(2, 1.0f);
  emb[3 * 3 + 1] = std::numeric_limits<float>::infinity();  // row 3, col 1
  std::vector<double> d64 = {1.0, std::nan("")};
  moe::io::SafetensorsWriter w;
  w.add_f32("model.embed_tokens.weight", {4, 3}, emb.data());
  w.add_f32("ok", {2}, ok.data());
  w.add("d", "F64", {2}, d64.data(), sizeof(double) * 2);
  w.write(d + "/w.safetensors");
  moe::io::SafetensorsFile f = moe::io::SafetensorsFile::open(d + "/w.safetensors");
  EXPECT_ERROR_HAS(f.read_f32("model.embed_tokens.weight"),
                   "w.safetensors: tensor \"model.embed_tokens.weight\" holds +Inf at [3, 1] (1 non-finite of 12 elements)");
  EXPECT_EQ(f.read_f32("ok"), ok);
  std::vector<double> back(2);
  EXPECT_ERROR_HAS(f.read("d", "F64", back.data(), {2}), "tensor \"d\" holds NaN at [1]");
}

TEST(SafetensorsFinite, DeepHeaderIsAnError) {
  const std::string d = fresh_dir("deep_header");
  const std::string h = std::string(100000, '[') + std::string(100000, ']');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::ofstream(d + "/deep.safetensors", std::ios::binary) << bytes << h;
  EXPECT_ERROR_HAS(moe::io::SafetensorsFile::open(d + "/deep.safetensors"),
                   "deep.safetensors: header: JSON nested deeper than 256 levels");
}

// --- issue 42: files read as data, outputs -------------------------------------------------------

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(DataFile, InFolderRefusesLinksFifosAndFolders) {
  const std::string d = fresh_dir("datafile");
  std::ofstream(d + "/outside") << "root:x:0:0:secret";
  fs::create_directories(d + "/m");
  std::ofstream(d + "/m/plain") << "abc";
  fs::create_symlink(d + "/outside", d + "/m/link");
  ASSERT_EQ(::mkfifo((d + "/m/fifo").c_str(), 0600), 0);
  fs::create_directories(d + "/m/sub");
  EXPECT_EQ(moe::io::open_in_folder(d + "/m", "plain", "weight file", "a model folder").size(), 3u);
  EXPECT_ERROR_HAS(moe::io::open_in_folder(d + "/m", "link", "weight file", "a model folder"),
                   "m: weight file link is a symbolic link (refused: a model folder reads only plain files inside its folder)");
  EXPECT_ERROR_HAS(moe::io::open_in_folder(d + "/m", "fifo", "weight file", "a model folder"),
                   "weight file fifo is not a regular file");  // and no blocking open
  EXPECT_ERROR_HAS(moe::io::open_in_folder(d + "/m", "sub", "weight file", "a model folder"), "is not a regular file");
  EXPECT_ERROR_HAS(moe::io::open_in_folder(d + "/m", "none", "weight file", "a model folder"), "weight file none is missing");
  EXPECT_ERROR_HAS(moe::io::open_in_folder(d + "/m", "../outside", "weight file", "a model folder"),
                   "is not a plain file name inside the folder");
  EXPECT_ERROR_HAS(moe::io::open_data_file(d + "/m/link", "dataset index", moe::io::Origin::kInFolder),
                   "m/link: is a symbolic link (refused: a dataset index is read only as a plain file inside its folder");
  // A path the user named is followed; either way a FIFO is refused, not waited on.
  EXPECT_EQ(moe::io::open_data_file(d + "/m/link", "x", moe::io::Origin::kNamed).size(), 17u);
  EXPECT_ERROR_HAS(moe::io::open_data_file(d + "/m/fifo", "x", moe::io::Origin::kNamed),
                   "x is not a regular file (it is a FIFO (named pipe))");
  EXPECT_TRUE(moe::io::entry_exists(d + "/m/link"));
  EXPECT_FALSE(moe::io::entry_exists(d + "/m/none"));
}

TEST(DataFile, ErrorsQuoteNoFileBytes) {
  const std::string d = fresh_dir("nobytes");
  const std::string secret = "root:x:0:0:root:/root:/bin/bash\n";
  std::ofstream(d + "/config.json") << secret;
  std::ofstream(d + "/w.safetensors") << secret;
  std::string e = error_of([&] { moe::model::load_config(d + "/config.json", true); });
  EXPECT_NE(e.find("config.json: not valid JSON"), std::string::npos) << e;
  EXPECT_EQ(e.find("root"), std::string::npos) << e;
  EXPECT_EQ(e.find("'r'"), std::string::npos) << e;
  e = error_of([&] { moe::io::SafetensorsFile::open(d + "/w.safetensors"); });
  EXPECT_NE(e.find("header length field (the first 8 bytes) exceeds the limit"), std::string::npos) << e;
  EXPECT_EQ(e.find("3475222254926655346"), std::string::npos) << e;  // "root:x:0" as a number
  // A number beyond a double: the message says so without the digits.
  e = error_of([&] { moe::io::parse_json("[1e999123]", "n.json"); });
  EXPECT_NE(e.find("number overflow (beyond a 64-bit double)"), std::string::npos) << e;
  EXPECT_EQ(e.find("999123"), std::string::npos) << e;
  // Names from a file: escaped to one line and cut.
  EXPECT_EQ(moe::io::quoted("a\nb"), "\"a\\nb\"");
  EXPECT_LT(moe::io::quoted(std::string(40000, 'a')).size(), 130u);
  EXPECT_LT(moe::io::excerpt(json(std::string(100000, 'z'))).size(), 70u);
}

// One 40,000-character tensor name: refused on open (naming its length, not echoing it), so
// inspect, --resume and export all refuse it; a name at the limit still reads.
TEST(SafetensorsNames, BoundedLength) {
  const std::string d = fresh_dir("longname");
  const float one = 1.0f;
  moe::io::SafetensorsWriter w;
  w.add_f32(std::string(40000, 'a'), {1}, &one);
  w.write(d + "/long.safetensors");
  const std::string e = error_of([&] { moe::io::SafetensorsFile::open(d + "/long.safetensors"); });
  EXPECT_NE(e.find("a tensor name of 40000 bytes in the header is longer than the limit of 1024"), std::string::npos) << e;
  EXPECT_EQ(e.find("aaaaaaaaaa"), std::string::npos) << e;
  moe::io::SafetensorsWriter ok;
  ok.add_f32(std::string(moe::io::kMaxTensorNameBytes, 'b'), {1}, &one);
  ok.write(d + "/ok.safetensors");
  EXPECT_EQ(moe::io::SafetensorsFile::open(d + "/ok.safetensors").tensors().size(), 1u);
}

TEST(OutputFile, NeverALinkFifoFolderOrInput) {
  const std::string d = fresh_dir("output");
  std::ofstream(d + "/target") << "keep me";
  std::ofstream(d + "/input") << "input bytes";
  fs::create_symlink(d + "/target", d + "/link");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  fs::create_directories(d + "/dir");
  fs::create_hard_link(d + "/input", d + "/hard");
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/link", "--dump"),
                   "--dump " + d + "/link: is a symbolic link; an output is written only as a new or regular file");
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/fifo", "--dump"), "fifo: is a FIFO (named pipe); an output must be");
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/dir", "--dump"), "dir: is a directory");
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/input", "--dump", {d + "/input"}), "is the input");
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/hard", "--dump", {d + "/input"}), "is the input");  // same inode
  // a folder
  EXPECT_ERROR_HAS(moe::io::check_output_path(d + "/input", "--dump", {d}), "is the input " + d + "/input");
  EXPECT_NO_THROW(moe::io::check_output_path(d + "/new", "--dump", {d + "/input", d + "/missing"}));
  EXPECT_NO_THROW(moe::io::check_output_path(d + "/target", "--dump", {d + "/input"}));
  EXPECT_ERROR_HAS(moe::io::write_file_atomic(d + "/link", "x", "-o"), "-o " + d + "/link: is a symbolic link");
  EXPECT_ERROR_HAS(moe::io::write_file_atomic(d + "/fifo", "x", "-o"), "is a FIFO");
  EXPECT_EQ(slurp(d + "/target"), "keep me");
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  struct stat st {};
  ASSERT_EQ(::lstat((d + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// A symlink planted at the old temporary name (PATH.tmp) is never written through: the temporary
// file is PATH.tmp.<pid>, created with O_EXCL | O_NOFOLLOW; a file at that name is skipped too.
TEST(OutputFile, PlantedTemporaryNamesAreNotWrittenThrough) {
  const std::string d = fresh_dir("planted");
  std::ofstream(d + "/victim") << "victim";
  fs::create_symlink(d + "/victim", d + "/out.tmp");
  fs::create_symlink(d + "/victim", d + "/out.tmp." + std::to_string(::getpid()));
  moe::io::write_file_atomic(d + "/out", "new contents", "-o");
  EXPECT_EQ(slurp(d + "/out"), "new contents");
  EXPECT_EQ(slurp(d + "/victim"), "victim");
  EXPECT_TRUE(fs::is_symlink(d + "/out.tmp." + std::to_string(::getpid())));
  // Only the planted links besides the output: no temporary file left.
  int n = 0;
  for (const auto& e : fs::directory_iterator(d)) n += e.path().filename().string().rfind("out.tmp", 0) == 0 ? 1 : 0;
  EXPECT_EQ(n, 2);
  {  // abandoned before commit: the temporary file goes, the target stays
    moe::io::AtomicFile f(d + "/out", "-o");
    f.write("partial");
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }
  EXPECT_EQ(slurp(d + "/out"), "new contents");
}

}  // namespace
