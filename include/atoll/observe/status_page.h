// The syncer's live status page: one self-contained HTML document (inline CSS and JavaScript, no
// external resources, works offline) that reads `api/history` once (the run so far) and then
// polls `api/status` every second — relative to its own
// URL, with the page's `?token=` sent as `Authorization: Bearer` — and shows the run, the learner
// table (one row `learner-<id>` per learner: state, step, tokens/s, loss, version held, rounds
// joined, last seen), the global eval loss, bytes on the wire vs data-parallel, goodput and
// uptime, a timeline of learner state changes and restarts seen while the page is open, and
// loss curves and bytes (log scale) drawn as inline SVG. Values from the syncer are inserted as text, never as markup.
#pragma once

#include <string_view>

namespace atl::observe {

std::string_view StatusPageHtml();

}  // namespace atl::observe
