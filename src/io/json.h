// A small JSON reader and string writer for the file formats that need JSON (GPT-2's encoder.json, the
// safetensors header). Strict: one document, no trailing garbage, no duplicate keys, nesting at most 128
// deep, \uXXXX escapes (with surrogate pairs) decoded to UTF-8. Errors name the source and the byte offset.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace retort::io {

struct Json {
  enum class Kind { Null, Bool, Int, Float, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;  // Kind::Int: a number without fraction or exponent that fits int64
  double number = 0;    // Kind::Float (and Kind::Int, converted)
  std::string string;
  std::vector<Json> items;        // array elements, or object values in file order
  std::vector<std::string> keys;  // object keys, parallel to items

  bool is(Kind k) const { return kind == k; }
  // The value under key in an object, or nullptr (linear search: for small objects).
  const Json* find(std::string_view key) const;
};

// "null", "bool", "integer", "number", "string", "array", "object".
const char* json_kind_name(Json::Kind k);

// Parses one JSON document. Throws retort::Error "<source>: malformed JSON at byte N: <what>".
Json parse_json(std::string_view text, const std::string& source);

// Appends s as a JSON string literal, escaping '"', '\\' and control characters (bytes >= 0x80 pass through).
void append_json_string(std::string& out, std::string_view s);

}  // namespace retort::io
