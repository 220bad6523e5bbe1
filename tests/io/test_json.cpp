#include <gtest/gtest.h>

#include "io/json.h"
#include "io_test_util.h"

namespace retort::test {
namespace {

using io::Json;
using io::parse_json;

TEST(Json, ParsesAllKinds) {
  Json j = parse_json(R"( {"a": 1, "b": [true, false, null, -2.5e3, "x"], "c": {}, "d": [], "e": -0} )", "t");
  ASSERT_TRUE(j.is(Json::Kind::Object));
  ASSERT_EQ(j.keys, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(j.find("a")->integer, 1);
  const Json& b = *j.find("b");
  ASSERT_EQ(b.items.size(), 5u);
  EXPECT_TRUE(b.items[0].boolean);
  EXPECT_TRUE(b.items[1].is(Json::Kind::Bool));
  EXPECT_FALSE(b.items[1].boolean);
  EXPECT_TRUE(b.items[2].is(Json::Kind::Null));
  EXPECT_TRUE(b.items[3].is(Json::Kind::Float));
  EXPECT_EQ(b.items[3].number, -2500.0);
  EXPECT_EQ(b.items[4].string, "x");
  EXPECT_TRUE(j.find("c")->is(Json::Kind::Object));
  EXPECT_TRUE(j.find("d")->is(Json::Kind::Array));
  EXPECT_EQ(j.find("nope"), nullptr);
  EXPECT_EQ(parse_json("9223372036854775807", "t").integer, INT64_MAX);
  EXPECT_TRUE(parse_json("9223372036854775808", "t").is(Json::Kind::Float));  // past int64: a double
}

TEST(Json, DecodesEscapesToUtf8) {
  Json j = parse_json(R"("q\" b\\ s\/ \b\f\n\r\t \u0041 \u00e9 \u20ac \ud83d\ude00 \u0120")", "t");
  EXPECT_EQ(j.string, "q\" b\\ s/ \b\f\n\r\t A \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xC4\xA0");
  // Raw UTF-8 passes through untouched.
  EXPECT_EQ(parse_json("\"\xC4\xA0the\"", "t").string, "\xC4\xA0the");
}

TEST(Json, WriterRoundTrips) {
  std::string s = "a\"b\\c\n\x01\x1f \xC3\xA9";
  std::string lit;
  io::append_json_string(lit, s);
  EXPECT_EQ(parse_json(lit, "t").string, s);
}

TEST(Json, MalformedInputNamesSourceAndOffset) {
  struct Bad {
    const char* text;
    const char* needle;
  };
  const Bad cases[] = {
      {"", "unexpected end"},
      {"{\"a\": 1,}", "expected a string key"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\": 1, \"a\": 2}", "duplicate key \"a\""},
      {"[1, 2", "unexpected end"},
      {"\"abc", "unterminated string"},
      {"\"\\x\"", "unknown escape"},
      {"\"\\u12G4\"", "bad hex digit"},
      {"\"\\ud800\"", "high surrogate"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"a\nb\"", "raw control character"},
      {"01", "trailing characters"},
      {"-", "expected a digit"},
      {"1.", "expected a digit"},
      {"1e999", "out of range"},
      {"tru", "invalid literal"},
      {"{} x", "trailing characters"},
      {"@", "unexpected character"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error([&] { parse_json(c.text, "hdr.json"); }, {"hdr.json", "malformed JSON at byte", c.needle});
  }
  std::string deep(200, '[');
  expect_error([&] { parse_json(deep, "deep.json"); }, {"deep.json", "nesting deeper"});
}

}  // namespace
}  // namespace retort::test
