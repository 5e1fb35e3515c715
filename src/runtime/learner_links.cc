#include "learner_links.h"

#include "atoll/core/text.h"

namespace atl::runtime {
StatusOr<std::vector<std::string>> SyncerAddresses(const std::string& text, int fragments) {
  std::vector<std::string> out = SplitText(text, ',');
  for (const std::string& shard : out) {
    for (const std::string& candidate : SplitText(shard, '|')) {
      if (candidate.empty()) {
        return InvalidArgumentError("--syncer '" + text +
                                    "': an empty address in the list (host:port[|standby:port...][,host:port...])");
      }
    }
  }
  if (out.size() > 1 && static_cast<int>(out.size()) > fragments) {
    return InvalidArgumentError("--syncer lists " + std::to_string(out.size()) + " syncer shards, the run has only " +
                                std::to_string(fragments) + " fragments (at most one shard per fragment)");
  }
  return out;
}

namespace {

StatusOr<transport::ClientOptions> ClientOptionsOf(const std::string& address, const LearnerProcessOptions& opt,
                                                   const RunConfig& c) {
  transport::ClientOptions co;
  co.target = address;
  co.token = c.token;
  co.min_link_mbps = c.min_link_mbps;
  if (!opt.token_file.empty()) {
    ATOLL_ASSIGN_OR_RETURN(co.token, ReadSecretFile(opt.token_file));
  }
  co.tls.enabled = !opt.tls.ca.empty() || !opt.tls.cert.empty();
  co.tls.ca_file = opt.tls.ca;
  co.tls.server_name = opt.tls.server_name;
  co.tls.cert_file = opt.tls.cert;
  co.tls.key_file = opt.tls.key;
  return co;
}

}  // namespace

StatusOr<SyncerLinks> SyncerLinks::Connect(const std::vector<std::string>& addresses, const LearnerProcessOptions& opt,
                                           const RunConfig& c, Clock& clock) {
  SyncerLinks links;
  links.base_.bandwidth_bps = c.bandwidth_mbps * 1e6;
  links.base_.latency_s = c.latency_ms / 1000.0;
  links.base_.loss = c.loss;
  links.base_.seed = c.seed * 1000 + static_cast<uint64_t>(opt.id) + 1;
  for (size_t shard = 0; shard < addresses.size(); ++shard) {
    const std::vector<std::string> names = SplitText(addresses[shard], '|');
    std::vector<syncer::SyncerApi*> candidates;
    for (const std::string& name : names) {
      ATOLL_ASSIGN_OR_RETURN(transport::ClientOptions co, ClientOptionsOf(name, opt, c));
      ATOLL_ASSIGN_OR_RETURN(auto client, transport::GrpcSyncerClient::Connect(co));
      links.clients_.push_back(std::move(client));
      candidates.push_back(links.clients_.back().get());
    }
    syncer::SyncerApi* api = candidates.front();
    if (candidates.size() > 1) {
      links.failover_.push_back(std::make_unique<learner::FailoverSyncerApi>(candidates, names));
      api = links.failover_.back().get();
    }
    learner::ShaperOptions so = links.base_;
    so.seed += 7919 * shard;  // shard 0: the unsharded learner's seed
    links.shaped_.push_back(std::make_unique<learner::ShapedSyncerApi>(*api, so, clock));
  }
  return links;
}

std::vector<syncer::SyncerApi*> SyncerLinks::apis() const {
  std::vector<syncer::SyncerApi*> out;
  for (const auto& s : shaped_) out.push_back(s.get());
  return out;
}

void SyncerLinks::Apply(const ChaosControl& control) {
  const double bandwidth_bps = control.bandwidth_mbps > 0 ? control.bandwidth_mbps * 1e6 : base_.bandwidth_bps;
  for (auto& s : shaped_) {
    s->SetPartitioned(control.partition);
    learner::ShaperOptions so = s->options();
    so.bandwidth_bps = bandwidth_bps;
    s->SetOptions(so);
  }
}

int64_t SyncerLinks::WireBytes(bool up) const {
  int64_t n = 0;
  for (const auto& c : clients_) n += up ? c->bytes_sent() : c->bytes_received();
  return n;
}

}  // namespace atl::runtime
