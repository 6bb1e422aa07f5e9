// safetensors: round trip, the exact byte layout of a hand-computed file, every malformed-header
// case the reader must refuse (with the file named), the .tmp + rename write, a disk-full write,
// and a cross-check of the writer against a struct+json parser in Python.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using moe::io::SafetensorsFile;
using moe::io::SafetensorsWriter;

// A fresh, empty folder per test.
std::string fresh_dir(const std::string& name) { return moe::test_util::fresh_scratch_dir("st", name); }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file made of a length field (the true header length unless forced), header text and data.
std::string raw_file(const std::string& header, const std::string& data, int64_t forced_n = -1) {
  uint64_t n = forced_n >= 0 ? static_cast<uint64_t>(forced_n) : header.size();
  return u64_le(n) + header + data;
}

// open() must throw a moe::Error whose message names the file and contains `expect`.
void expect_open_error(const std::string& path, const std::string& expect) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "open(" << path << ") succeeded, expected an error containing '" << expect
                  << "'";
  } catch (const moe::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << "expected '" << expect << "' in: " << msg;
  }
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  std::string dir = fresh_dir("roundtrip");
  std::string path = dir + "/m.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  std::vector<int32_t> b = {1, -2, 2147483647, -2147483647 - 1};
  float scalar = 42.0f;
  std::vector<uint16_t> half = {0x3c00, 0xc000, 0x7bff};  // F16 bits, stored as raw bytes
  SafetensorsWriter w;
  w.add_f32("model.layers.0.a", {2, 3}, a.data());
  w.add_i32("b", {4}, b.data());
  w.add_f32("scalar", {}, &scalar);
  w.add_f32("empty", {0, 5}, nullptr);
  w.add("half", "F16", {3}, half.data(), half.size() * 2);
  w.set_metadata("format", "pt");
  w.set_metadata("step", "17");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "17");
  EXPECT_TRUE(f.has("b"));
  EXPECT_FALSE(f.has("c"));
  EXPECT_EQ(f.info("model.layers.0.a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.info("scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(f.info("half").dtype, "F16");

  std::vector<float> a2(6);
  f.read_f32("model.layers.0.a", a2.data(), {2, 3});
  EXPECT_EQ(a2, a);  // bit-exact
  EXPECT_EQ(f.read_i32("b"), b);
  EXPECT_EQ(f.read_f32("scalar"), std::vector<float>{42.0f});
  EXPECT_TRUE(f.read_f32("empty").empty());
  EXPECT_EQ(std::memcmp(f.data("half"), half.data(), 6), 0);
  // Data of every tensor in a file written by us starts 4-byte aligned in the mapping for F32/I32.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data("model.layers.0.a")) % 4, 0u);

  // Wrong shape / dtype / name: the error names file, tensor, expected and actual.
  try {
    f.read_f32("model.layers.0.a", a2.data(), {3, 2});
    ADD_FAILURE() << "shape mismatch not detected";
  } catch (const moe::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.0.a"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
  try {
    f.read_f32("b", a2.data(), {4});
    ADD_FAILURE() << "dtype mismatch not detected";
  } catch (const moe::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("F32"), std::string::npos) << msg;
  }
  EXPECT_THROW(f.info("nope"), moe::Error);

  // Copies share the mapping; the original can go away.
  SafetensorsFile g = f;
  f = SafetensorsFile::open(path);
  EXPECT_EQ(g.read_i32("b"), b);
  fs::remove_all(dir);
}

TEST(Safetensors, WriterRejectsBadInput) {
  float x[2] = {1, 2};
  SafetensorsWriter w;
  EXPECT_THROW(w.add("x", "F32", {3}, x, 8), moe::Error);  // 3 floats need 12 bytes
  EXPECT_THROW(w.add("x", "F99", {2}, x, 8), moe::Error);  // unknown dtype
  EXPECT_THROW(w.add("__metadata__", "F32", {2}, x, 8), moe::Error);
  EXPECT_THROW(w.add_f32("x", {-1, 2}, x), moe::Error);
  w.add_f32("x", {2}, x);
  EXPECT_THROW(w.add_f32("x", {2}, x), moe::Error);  // duplicate
}

// Two tensors: "a" F32 [2] = {1, -2}, "b" I32 [1] = {7}. Header JSON (compact, in add order):
//   {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}}
// = 108 bytes, padded with 4 spaces to 112 (a multiple of 8); file = 8 + 112 + 12 = 132 bytes.
TEST(Safetensors, ByteExactLayout) {
  std::string dir = fresh_dir("layout");
  std::string path = dir + "/t.safetensors";
  float a[2] = {1.0f, -2.0f};
  int32_t b[1] = {7};
  SafetensorsWriter w;
  w.add_f32("a", {2}, a);
  w.add_i32("b", {1}, b);
  w.write(path);

  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})";
  ASSERT_EQ(json.size(), 108u);
  std::string expected;
  expected += std::string("\x70\0\0\0\0\0\0\0", 8);  // 112, little-endian u64
  expected += json + "    ";
  expected += std::string("\x00\x00\x80\x3f", 4);  // 1.0f
  expected += std::string("\x00\x00\x00\xc0", 4);  // -2.0f
  expected += std::string("\x07\x00\x00\x00", 4);  // 7
  std::string got = read_bytes(path);
  ASSERT_EQ(got.size(), 132u);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(w.header_bytes(), expected.substr(0, 120));

  // And the reader sees the same offsets.
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.info("a").begin, 0u);
  EXPECT_EQ(f.info("a").end, 8u);
  EXPECT_EQ(f.info("b").begin, 8u);
  EXPECT_EQ(f.info("b").end, 12u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data("a")) % 8, 0u);  // mapping is page aligned

  // Metadata comes first; padding keeps the data section 8-byte aligned whatever its length.
  for (int len = 0; len < 9; ++len) {
    SafetensorsWriter m;
    m.set_metadata("k", std::string(len, 'x'));
    m.add_f32("a", {2}, a);
    std::string h = m.header_bytes();
    EXPECT_EQ(h.size() % 8, 0u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(h[i])) << (8 * i);
    EXPECT_EQ(n + 8, h.size());
    EXPECT_EQ(h.substr(8, 17), R"({"__metadata__":{)");
  }
  fs::remove_all(dir);
}

TEST(Safetensors, MalformedFilesNameTheFile) {
  std::string dir = fresh_dir("malformed");
  const std::string f8(8, '\0');  // 8 data bytes
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":" + offsets + "}";
  };
  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;
  };
  const std::string good_a = entry("a", "F32", "[2]", "[0,8]");
  std::vector<Case> cases = {
      {"short", "abc", "shorter than the 8-byte"},
      {"n_past_end", raw_file("{}", "", 1000), "exceeds the 2 bytes"},
      {"n_huge", raw_file("{}", "", 200ll << 20), "exceeds the limit"},
      {"not_json", raw_file("{not json", ""), "not valid JSON"},
      {"not_object", raw_file("[1,2]", ""), "not a JSON object"},
      {"entry_not_object", raw_file(R"({"a":5})", ""), "entry is not an object"},
      {"no_dtype", raw_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", f8), "missing \"dtype\""},
      {"no_shape", raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", f8), "missing \"shape\""},
      {"no_offsets", raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", f8),
       "missing \"data_offsets\""},
      {"dtype_type", raw_file(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", f8),
       "\"dtype\" is not a string"},
      {"shape_type", raw_file("{" + entry("a", "F32", "\"2\"", "[0,8]") + "}", f8),
       "\"shape\" is not an array"},
      {"shape_float", raw_file("{" + entry("a", "F32", "[2.0]", "[0,8]") + "}", f8),
       "non-integer"},
      {"offsets_type", raw_file("{" + entry("a", "F32", "[2]", "[0]") + "}", f8),
       "not a pair of non-negative integers"},
      {"offsets_negative", raw_file("{" + entry("a", "F32", "[2]", "[-1,8]") + "}", f8),
       "not a pair of non-negative integers"},
      {"unknown_dtype", raw_file("{" + entry("a", "F33", "[2]", "[0,8]") + "}", f8),
       "unknown dtype \"F33\""},
      {"negative_dim", raw_file("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", f8),
       "negative dimension -2"},
      {"out_of_bounds", raw_file("{" + entry("a", "F32", "[4]", "[0,16]") + "}", f8),
       "out of bounds"},
      {"begin_after_end", raw_file("{" + entry("a", "F32", "[2]", "[8,0]") + "}", f8),
       "begin 8 > end 0"},
      {"size_mismatch", raw_file("{" + entry("a", "F32", "[3]", "[0,8]") + "}", f8),
       "needs 12"},
      {"overlap",
       raw_file("{" + good_a + "," + entry("b", "F32", "[2]", "[4,12]") + "}", f8 + "abcd"),
       "overlap"},
      {"duplicate", raw_file("{" + good_a + "," + good_a + "}", f8), "appears twice"},
      {"gap", raw_file("{" + entry("a", "F32", "[2]", "[4,12]") + "}", f8 + "abcd"), "gap"},
      {"trailing", raw_file("{" + good_a + "}", f8 + "abcd"), "cover only 8"},
      {"metadata_type", raw_file(R"({"__metadata__":{"k":1}})", ""), "not a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir + "/" + c.name + ".safetensors";
    write_bytes(path, c.bytes);
    expect_open_error(path, c.expect);
  }
  expect_open_error(dir + "/does_not_exist.safetensors", "No such file");
  expect_open_error(dir, "not a regular file");
  // The same well-formed pieces are accepted, so the cases above fail for the stated reason.
  write_bytes(dir + "/ok.safetensors", raw_file("{" + good_a + "}", f8));
  EXPECT_NO_THROW(SafetensorsFile::open(dir + "/ok.safetensors"));
  fs::remove_all(dir);
}

TEST(Safetensors, WriteIsAtomic) {
  std::string dir = fresh_dir("atomic");
  float a[2] = {1, 2};
  SafetensorsWriter w;
  w.add_f32("a", {2}, a);

  // Into a folder that does not exist: fails naming the path, leaves nothing behind.
  std::string bad = dir + "/no/such/folder/m.safetensors";
  try {
    w.write(bad);
    ADD_FAILURE() << "write into a missing folder succeeded";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir));

  // Over an existing file: replaced whole, no .tmp left.
  std::string path = dir + "/m.safetensors";
  write_bytes(path, "old contents");
  w.write(path);
  EXPECT_EQ(SafetensorsFile::open(path).read_f32("a"), (std::vector<float>{1, 2}));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  fs::remove_all(dir);
}

// A full disk, simulated with a file-size limit (writes past it fail with EFBIG once SIGXFSZ is
// ignored): the error names the path, the old file survives, no .tmp remains.
TEST(Safetensors, DiskFullLeavesNothingBehind) {
  std::string dir = fresh_dir("full");
  std::string path = dir + "/m.safetensors";
  write_bytes(path, "previous checkpoint");
  std::vector<float> big(1 << 18, 1.0f);  // 1 MiB
  SafetensorsWriter w;
  w.add_f32("big", {static_cast<int64_t>(big.size())}, big.data());

  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    w.write(path);
  } catch (const moe::Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);

  EXPECT_NE(msg.find(path), std::string::npos) << "no error naming the path: '" << msg << "'";
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(read_bytes(path), "previous checkpoint");
  fs::remove_all(dir);
}

// Independent parser: a few lines of Python (struct + json, not the safetensors package) read a
// file written by the C++ writer and print what they found.
TEST(Safetensors, PythonReadsWriterOutput) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 not found";
  std::string dir = fresh_dir("python");
  std::string path = dir + "/m.safetensors";
  std::vector<float> a = {0.5f, -1.25f, 3.0f, 1e-3f, 2.0f, -0.0f};
  std::vector<int32_t> b = {-5, 0, 123456};
  SafetensorsWriter w;
  w.add_f32("w.a", {3, 2}, a.data());
  w.add_i32("tok", {1, 3}, b.data());
  w.set_metadata("who", "moetrain");
  w.write(path);

  std::string script = dir + "/read.py";
  std::ofstream(script) << R"(import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n, = struct.unpack('<Q', raw[:8])
assert (8 + n) % 8 == 0, n
h = json.loads(raw[8:8 + n].decode('utf-8'))
data = raw[8 + n:]
print('meta', h.pop('__metadata__')['who'])
fmt = {'F32': 'f', 'I32': 'i'}
for name in sorted(h):
    t = h[name]
    b, e = t['data_offsets']
    vals = struct.unpack('<%d%s' % ((e - b) // 4, fmt[t['dtype']]), data[b:e])
    print(name, t['dtype'], 'x'.join(map(str, t['shape'])), ' '.join(repr(v) for v in vals))
)";
  std::string cmd = "/usr/bin/python3 " + script + " " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out,
            "meta moetrain\n"
            "tok I32 1x3 -5 0 123456\n"
            "w.a F32 3x2 0.5 -1.25 3.0 0.0010000000474974513 2.0 -0.0\n");
  fs::remove_all(dir);
}
