// What is behind the C API's opaque handle (include/atoll/c_api.h), shared by its translation
// units: c_api.cc (open, step, close), c_api_fragments.cc (the plan, sends, receipts) and
// c_api_state.cc (the state folder's learner.json). Not installed; C callers see only c_api.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atoll/c_api.h"
#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/transport/grpc_client.h"

struct atoll_learner {
  atl::diloco::FragmentPlan plan;
  std::unique_ptr<atl::transport::GrpcSyncerClient> client;
  std::unique_ptr<atl::learner::LearnerAgent> agent;
  int64_t step = 0, tokens = 0;
  double loss = 0;
  std::string run_id;
  // The state folder ("" = none), the open descriptor of its lock file (-1 = none), and when
  // learner.json was last written (the step, and the learner id it named).
  std::string state_dir;
  int state_lock_fd = -1;
  int64_t state_written_step = -1;
  int state_written_id = -1;
  ~atoll_learner();
};

namespace atl::capi {

// A Status as a C status code and the thread-local message atoll_last_error returns.
atoll_status Report(const Status& st);
const char* LastError();
inline std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

// The settings as given (only the fields within struct_size; the defaults for the rest).
atoll_learner_settings SettingsOf(const atoll_learner_settings* given);

// The state folder before the join: takes its lock (AlreadyExists when another live process holds
// it), reads learner.json when there is one and folds it into the options: the learner id, rejoin,
// the step and token counts. InvalidArgument for a learner.json of another run, id or plan.
Status OpenState(atoll_learner& l, const std::string& dir, int num_fragments, int& learner_id, bool& rejoin);
// Writes learner.json (atomically; a failure is counted by nothing and retried at the next write).
void WriteState(atoll_learner& l);
// Whether the step that just ran should rewrite learner.json (new id, merges applied, or a while).
bool StateDue(const atoll_learner& l);
// learner.json's text.
std::string StateJson(const atoll_learner& l);

}  // namespace atl::capi
