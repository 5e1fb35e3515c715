#include "toy_syncer.h"

#include <cstdio>
#include <memory>

#include "atoll/core/clock.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/grpc_server.h"

struct toy_syncer {
  atl::RealClock clock;
  std::unique_ptr<atl::syncer::SyncerLoop> loop;
  std::unique_ptr<atl::transport::GrpcSyncerServer> server;
};

extern "C" {

toy_syncer* toy_syncer_start(int P, int H, int tau, float init, const char* token) {
  std::vector<atl::diloco::TensorSpec> t = {{"emb.weight", {16, 4}, 64, true},
                                            {"layers.0.w", {8, 8}, 64, false},
                                            {"layers.1.w", {8, 8}, 64, false},
                                            {"norm", {8}, 8, false}};
  atl::diloco::PlanOptions po;
  po.num_fragments = P;
  auto plan = atl::diloco::MakeFragmentPlan(t, po);
  if (!plan.ok()) {
    std::fprintf(stderr, "toy_syncer: %s\n", plan.status().ToString().c_str());
    return nullptr;
  }
  std::vector<std::vector<float>> values;
  for (const auto& f : plan->fragments) values.emplace_back(static_cast<size_t>(f.numel), init);
  atl::syncer::SyncerOptions o;
  o.run_id = "toy";
  o.H = H;
  o.round.tau = tau;
  auto core = atl::syncer::SyncerCore::Create(o, *plan, values);
  if (!core.ok()) {
    std::fprintf(stderr, "toy_syncer: %s\n", core.status().ToString().c_str());
    return nullptr;
  }
  auto s = std::make_unique<toy_syncer>();
  s->loop = std::make_unique<atl::syncer::SyncerLoop>(std::move(*core), s->clock, nullptr);
  atl::transport::ServerOptions so;
  so.token = token == nullptr ? "" : token;
  auto server = atl::transport::GrpcSyncerServer::Start(so, *s->loop, [](bool) { return std::string("{}"); });
  if (!server.ok()) {
    std::fprintf(stderr, "toy_syncer: %s\n", server.status().ToString().c_str());
    return nullptr;
  }
  s->server = std::move(*server);
  return s.release();
}

int toy_syncer_port(const toy_syncer* s) { return s->server->port(); }

int64_t toy_syncer_rounds(toy_syncer* s) {
  return s->loop->Call([](atl::syncer::SyncerCore& c, atl::TimePoint) { return c.rounds_closed(); });
}

double toy_syncer_mean(toy_syncer* s) {
  return s->loop->Call([](atl::syncer::SyncerCore& c, atl::TimePoint) {
    double sum = 0;
    int64_t n = 0;
    for (int p = 0; p < c.plan().num_fragments(); ++p) {
      for (float v : c.theta(p)) sum += v;
      n += c.plan().fragments[static_cast<size_t>(p)].numel;
    }
    return n > 0 ? sum / static_cast<double>(n) : 0.0;
  });
}

void toy_syncer_stop(toy_syncer* s) {
  s->server->Shutdown();
  s->loop->Stop();
  delete s;
}

}  // extern "C"
