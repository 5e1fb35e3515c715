#include "atoll/observe/http_request.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

namespace atl::observe {
namespace {

// RFC 9110 tchar: the characters of a method or header name.
bool IsTokenChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return kExtra.find(static_cast<char>(c)) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(static_cast<unsigned char>(c)); });
}

// A header value: HTAB, SP, visible ASCII and obs-text; no other control character.
bool IsFieldValue(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c == '\t' || (c >= 0x20 && c != 0x7F);
  });
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string_view Trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The lines of a head that FindHeadEnd delimited, without their line ends; the final blank line
// is not among them. InvalidArgument for a bare CR inside a line or a head without its blank line.
StatusOr<std::vector<std::string_view>> SplitLines(std::string_view head) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < head.size()) {
    const size_t nl = head.find('\n', start);
    if (nl == std::string_view::npos) break;
    std::string_view line = head.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos) return InvalidArgumentError("a bare CR inside a line");
    start = nl + 1;
    if (line.empty()) {
      if (start != head.size()) return InvalidArgumentError("bytes after the end of the request head");
      return lines;
    }
    lines.push_back(line);
  }
  return InvalidArgumentError("the request head does not end with a blank line");
}

Status ParseRequestLine(std::string_view line, HttpRequestHead& out) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return InvalidArgumentError("the request line is not METHOD SP TARGET SP VERSION");
  }
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || method.size() > 16) return InvalidArgumentError("bad method");
  const bool visible = std::all_of(target.begin(), target.end(), [](char c) { return c > 0x20 && c < 0x7F; });
  if (target.empty() || target.front() != '/' || !visible) {
    return InvalidArgumentError("the target must be a path starting with '/' (origin form)");
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    const bool http = version.size() == 8 && version.substr(0, 5) == "HTTP/" && IsDigit(version[5]) &&
                      version[6] == '.' && IsDigit(version[7]);
    if (http) return UnimplementedError("HTTP version " + std::string(version) + " is not served (1.0 and 1.1 are)");
    return InvalidArgumentError("bad HTTP version");
  }
  out.method = method;
  out.target = target;
  out.version = version;
  const size_t q = target.find('?');
  out.path = target.substr(0, q);
  out.query = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));
  return Status::Ok();
}

// Host (exactly one on HTTP/1.1, at most one on 1.0) and the body fields.
Status CheckFraming(HttpRequestHead& h) {
  int hosts = 0, lengths = 0;
  for (const auto& [name, value] : h.headers) {
    if (name == "host") ++hosts;
    if (name == "transfer-encoding") h.declares_body = true;
    if (name == "content-length") {
      ++lengths;
      if (value.empty() || value.size() > 18 || !std::all_of(value.begin(), value.end(), IsDigit)) {
        return InvalidArgumentError("bad Content-Length");
      }
      if (value.find_first_not_of('0') != std::string::npos) h.declares_body = true;
    }
  }
  if (hosts > 1) return InvalidArgumentError("more than one Host header");
  if (hosts == 0 && h.version == "HTTP/1.1") return InvalidArgumentError("HTTP/1.1 needs a Host header");
  if (lengths > 1) return InvalidArgumentError("more than one Content-Length header");
  return Status::Ok();
}

}  // namespace

std::optional<std::string> HttpRequestHead::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return std::nullopt;
}

std::optional<std::string> HttpRequestHead::QueryParam(std::string_view name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (PercentDecoded(pair.substr(0, eq)) != name) continue;
    return eq == std::string_view::npos ? std::string() : PercentDecoded(pair.substr(eq + 1));
  }
  return std::nullopt;
}

size_t FindHeadEnd(std::string_view buffer) {
  for (size_t nl = buffer.find('\n'); nl != std::string_view::npos; nl = buffer.find('\n', nl + 1)) {
    if (nl + 1 < buffer.size() && buffer[nl + 1] == '\n') return nl + 2;
    if (nl + 2 < buffer.size() && buffer[nl + 1] == '\r' && buffer[nl + 2] == '\n') return nl + 3;
  }
  return 0;
}

StatusOr<HttpRequestHead> ParseRequestHead(std::string_view head, const HttpRequestLimits& limits) {
  if (head.size() > limits.max_head_bytes) {
    return ResourceExhaustedError("the request head exceeds " + std::to_string(limits.max_head_bytes) + " bytes");
  }
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::string_view> lines, SplitLines(head));
  if (lines.empty()) return InvalidArgumentError("empty request");
  HttpRequestHead h;
  ATOLL_RETURN_IF_ERROR(ParseRequestLine(lines[0], h));
  if (static_cast<int>(lines.size()) - 1 > limits.max_headers) {
    return ResourceExhaustedError("more than " + std::to_string(limits.max_headers) + " header lines");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.front() == ' ' || line.front() == '\t') return InvalidArgumentError("folded header line (obsolete)");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon)))
      return InvalidArgumentError("bad header line");
    const std::string_view value = Trimmed(line.substr(colon + 1));
    if (!IsFieldValue(value)) return InvalidArgumentError("a control character in a header value");
    h.headers.emplace_back(Lower(line.substr(0, colon)), std::string(value));
  }
  ATOLL_RETURN_IF_ERROR(CheckFraming(h));
  return h;
}

int HttpStatusFor(const Status& parse_error) {
  switch (parse_error.code()) {
    case StatusCode::kResourceExhausted: return 431;
    case StatusCode::kUnimplemented: return 505;
    default: return 400;
  }
}

std::string PercentDecoded(std::string_view text) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

bool HostIsAllowed(std::string_view host_header, const std::vector<std::string>& allowed) {
  std::string_view host = host_header, port;
  if (host.starts_with('[')) {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    port = host.substr(close + 1);
    host = host.substr(1, close - 1);
    in6_addr v6{};
    if (!port.empty() && !port.starts_with(':')) return false;
    if (::inet_pton(AF_INET6, std::string(host).c_str(), &v6) != 1) return false;
    return port.size() <= 6 && std::all_of(port.begin() + (port.empty() ? 0 : 1), port.end(), IsDigit);
  }
  if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), IsDigit)) return false;
  }
  if (host.empty()) return false;
  in_addr v4{};
  if (::inet_pton(AF_INET, std::string(host).c_str(), &v4) == 1) return true;
  std::string name = Lower(host);
  if (name.back() == '.') name.pop_back();
  if (name == "localhost") return true;
  return std::any_of(allowed.begin(), allowed.end(), [&](const std::string& a) { return Lower(a) == name; });
}

}  // namespace atl::observe
