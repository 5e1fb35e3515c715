#include "syncer_status_page.h"

#include <cstdio>

#include "atoll/core/file.h"
#include "atoll/runtime/run_config.h"

namespace atl::runtime {

StatusOr<nlohmann::json> SyncerStatusPage::StatusDocument() {
  nlohmann::json s = loop_.Call([](syncer::SyncerCore& sc, TimePoint now) { return sc.StatusJson(now); });
  s["now"] = UnixSeconds();
  s["uptime_s"] = s["now"].get<double>() - started_;
  summary_.AddEvaluation(s);
  if (const std::string why = loop_.holding(); !why.empty()) s["holding"] = why;  // rounds held: the page says why
  observe::AddDerived(s);
  return s;
}

Status SyncerStatusPage::Start(const StatusPageOptions& o) {
  if (o.address.empty()) return Status::Ok();
  observe::HttpOptions ho;
  ho.address = o.address;
  ho.token = o.token;
  ho.allowed_hosts = o.hosts;
  observe::HttpHandlers h;
  h.status = [this] { return StatusDocument(); };
  h.history = [this]() -> StatusOr<nlohmann::json> { return history_.ToJson(); };
  h.metrics = [this]() -> StatusOr<std::string> {
    ATOLL_ASSIGN_OR_RETURN(nlohmann::json s, StatusDocument());
    return log_.Prometheus(s);
  };
  ATOLL_ASSIGN_OR_RETURN(http_, observe::HttpStatusServer::Start(ho, std::move(h)));
  std::printf("syncer: status page at %s (metrics at %smetrics)\n", http_->url().c_str(), http_->url().c_str());
  if (!ho.token.empty()) {  // the URL with its token, readable by the owner only (not in the log)
    ATOLL_RETURN_IF_ERROR(WriteFileOwnerOnly(o.out_dir + "/status-url",
                                             http_->url() + "?token=" + observe::QueryEscaped(ho.token) + "\n"));
    std::printf("syncer: the status page needs the token: the URL with it is in %s/status-url\n", o.out_dir.c_str());
  }
  std::fflush(stdout);
  if (!o.port_file.empty()) ATOLL_RETURN_IF_ERROR(WriteFileAtomic(o.port_file, std::to_string(http_->port())));
  return Status::Ok();
}

void SyncerStatusPage::Sample() {
  if (!http_) return;
  if (auto s = StatusDocument(); s.ok()) history_.Add(*s);
}

void SyncerStatusPage::Stop() {
  if (http_) http_->Stop();
}

}  // namespace atl::runtime
