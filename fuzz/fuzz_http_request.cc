// Fuzzes the HTTP status endpoint's request-head parser (observe/http_request.h), which sees a
// client's bytes before any credential is checked: FindHeadEnd over the input, ParseRequestHead
// of the head it delimits (and of the whole input), then the Host check and the query decoding
// of whatever parsed. Invariants: a parsed head respects its limits and its path is origin-form.
#include <cstdlib>

#include "atoll/observe/http_request.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace atl::observe;
  atl::fuzz::Input in(data, size);
  const HttpRequestLimits limits{static_cast<size_t>(256 + in.Byte() * 16), 1 + in.Byte() % 64};
  const std::string_view bytes = in.Rest();
  const size_t end = FindHeadEnd(bytes);
  if (end > bytes.size()) std::abort();
  for (const std::string_view head : {bytes.substr(0, end == 0 ? bytes.size() : end), bytes}) {
    auto h = ParseRequestHead(head, limits);
    if (!h.ok()) {
      const int code = HttpStatusFor(h.status());
      if (code != 400 && code != 431 && code != 505) std::abort();
      continue;
    }
    if (head.size() > limits.max_head_bytes || static_cast<int>(h->headers.size()) > limits.max_headers) std::abort();
    if (h->path.empty() || h->path.front() != '/') std::abort();
    (void)HostIsAllowed(h->Header("host").value_or(""), {"syncer.lan"});
    (void)h->QueryParam("token");
  }
  return 0;
}
