#include "json.h"

#include <charconv>
#include <cstdio>
#include <unordered_set>

#include "file.h"
#include "unicode_classes.h"

namespace retort::io {

const Json* Json::find(std::string_view key) const {
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &items[i];
  return nullptr;
}

const char* json_kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null:
      return "null";
    case Json::Kind::Bool:
      return "bool";
    case Json::Kind::Int:
      return "integer";
    case Json::Kind::Float:
      return "number";
    case Json::Kind::String:
      return "string";
    case Json::Kind::Array:
      return "array";
    case Json::Kind::Object:
      return "object";
  }
  return "?";
}

namespace {

constexpr int kMaxDepth = 128;

class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : t_(text), source_(source) {}

  Json document() {
    Json v = value(0);
    ws();
    if (p_ != t_.size()) fail("unexpected trailing characters after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    file_error(source_, "malformed JSON at byte " + std::to_string(p_) + ": " + what);
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  char peek() {
    if (p_ >= t_.size()) fail("unexpected end of input");
    return t_[p_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', got '" + t_[p_] + "'");
    ++p_;
  }
  void literal(std::string_view word) {
    if (t_.substr(p_, word.size()) != word) fail("invalid literal");
    p_ += word.size();
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    ws();
    Json v;
    char c = peek();
    if (c == '{') {
      object(v, depth);
    } else if (c == '[') {
      v.kind = Json::Kind::Array;
      ++p_;
      ws();
      if (peek() == ']') {
        ++p_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        ws();
        if (peek() == ',') {
          ++p_;
          continue;
        }
        expect(']');
        break;
      }
    } else if (c == '"') {
      v.kind = Json::Kind::String;
      v.string = string();
    } else if (c == 't') {
      literal("true");
      v.kind = Json::Kind::Bool;
      v.boolean = true;
    } else if (c == 'f') {
      literal("false");
      v.kind = Json::Kind::Bool;
    } else if (c == 'n') {
      literal("null");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number(v);
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  void object(Json& v, int depth) {
    v.kind = Json::Kind::Object;
    ++p_;
    ws();
    if (peek() == '}') {
      ++p_;
      return;
    }
    std::unordered_set<std::string> seen;
    for (;;) {
      ws();
      if (peek() != '"') fail("expected a string key");
      size_t key_at = p_;
      std::string key = string();
      if (!seen.insert(key).second) {
        p_ = key_at;
        fail("duplicate key \"" + key + "\"");
      }
      ws();
      expect(':');
      v.items.push_back(value(depth + 1));
      v.keys.push_back(std::move(key));
      ws();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect('}');
      return;
    }
  }

  uint32_t hex4() {
    if (p_ + 4 > t_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= uint32_t(c - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string");
      char c = t_[p_++];
      if (c == '"') return out;
      if (uint8_t(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated escape");
      char e = t_[p_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (t_.substr(p_, 2) != "\\u") fail("high surrogate not followed by a low surrogate");
            p_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8_append(out, cp);
          break;
        }
        default:
          fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  void number(Json& v) {
    size_t start = p_;
    if (t_[p_] == '-') ++p_;
    bool is_int = true;
    auto digits = [&] {
      size_t d = p_;
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
      if (p_ == d) fail("expected a digit");
    };
    if (p_ < t_.size() && t_[p_] == '0') {
      ++p_;  // JSON forbids leading zeros
    } else {
      digits();
    }
    if (p_ < t_.size() && t_[p_] == '.') {
      is_int = false;
      ++p_;
      digits();
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      is_int = false;
      ++p_;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      digits();
    }
    const char* b = t_.data() + start;
    const char* e = t_.data() + p_;
    if (is_int) {
      auto r = std::from_chars(b, e, v.integer);
      if (r.ec == std::errc() && r.ptr == e) {
        v.kind = Json::Kind::Int;
        v.number = double(v.integer);
        return;
      }
    }
    auto r = std::from_chars(b, e, v.number);
    if (r.ec != std::errc() || r.ptr != e) {
      p_ = start;
      fail("number out of range");
    }
    v.kind = Json::Kind::Float;
  }

  std::string_view t_;
  const std::string& source_;
  size_t p_ = 0;
};

}  // namespace

Json parse_json(std::string_view text, const std::string& source) {
  return Parser(text, source).document();
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (uint8_t(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(uint8_t(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace retort::io
