#include "atoll/model/data.h"
#include "atoll/runtime/processes.h"

namespace atl::runtime {

StatusOr<model::TrainerOptions> MakeTrainerOptions(const RunConfig& c, int learner_id) {
  ATOLL_ASSIGN_OR_RETURN(auto manifest, model::LoadDataManifest(c.data));
  ATOLL_ASSIGN_OR_RETURN(auto mc, model::PresetConfig(c.preset, manifest.vocab_size));
  mc.seq_len = c.seq;
  model::TrainerOptions o;
  o.model = mc;
  o.optim.lr = c.lr;
  o.optim.warmup_steps = c.warmup;
  o.optim.total_steps = c.steps;
  o.data_dir = c.data;
  o.batch_size = c.BatchOf(learner_id);
  o.learner_id = learner_id;
  o.num_learners = c.learners;
  o.seed = c.seed;  // the same seed everywhere: identical initial weights on every process
  o.threads = c.threads;
  o.precision = c.precision;
  o.init_weights = c.spec;
  return o;
}

}  // namespace atl::runtime
