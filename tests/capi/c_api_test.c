/* The C API from plain C (C11): a learner trains a toy model (each value pulled towards 1.0, the
 * gradient of ½‖w − 1‖²) against a real syncer over gRPC on 127.0.0.1; every bad argument returns
 * an error code and a message, and a model that differs from the syncer's is refused at join.
 * Exit code 0 on success; the first failed check prints file:line and fails the test. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atoll/c_api.h"
#include "toy_syncer.h"

#define CHECK(cond)                                                                                                   \
  do {                                                                                                                \
    if (!(cond)) {                                                                                                    \
      fprintf(stderr, "%s:%d: check failed: %s (last error: '%s')\n", __FILE__, __LINE__, #cond, atoll_last_error()); \
      exit(1);                                                                                                        \
    }                                                                                                                 \
  } while (0)

enum { kTensors = 4 };
static const char* const kNames[kTensors] = {"emb.weight", "layers.0.w", "layers.1.w", "norm"};
static const int64_t kShapes[kTensors][2] = {{16, 4}, {8, 8}, {8, 8}, {8, 0}};
static const int kNdim[kTensors] = {2, 2, 2, 1};

typedef struct {
  float emb[64], w0[64], w1[64], norm[8];
  atoll_param params[kTensors];
} toy_model;

static void toy_init(toy_model* m, float value) {
  float* data[kTensors] = {m->emb, m->w0, m->w1, m->norm};
  const int sizes[kTensors] = {64, 64, 64, 8};
  for (int t = 0; t < kTensors; ++t) {
    for (int i = 0; i < sizes[t]; ++i) data[t][i] = value;
    m->params[t].name = kNames[t];
    m->params[t].data = data[t];
    m->params[t].shape = kShapes[t];
    m->params[t].ndim = kNdim[t];
    m->params[t].is_embedding = t == 0;
  }
}

/* One inner step of gradient descent on ½‖w − 1‖²; returns the loss before it. */
static double toy_step(toy_model* m) {
  double loss = 0;
  for (int t = 0; t < kTensors; ++t) {
    const int64_t n = kShapes[t][0] * (kNdim[t] == 2 ? kShapes[t][1] : 1);
    for (int64_t i = 0; i < n; ++i) {
      const float d = m->params[t].data[i] - 1.0f;
      loss += 0.5 * d * d;
      m->params[t].data[i] -= 0.1f * d;
    }
  }
  return loss;
}

static atoll_learner_options toy_options(const char* target) {
  atoll_learner_options o;
  atoll_learner_options_init(&o);
  o.syncer = target;
  o.run_id = "toy";
  o.token = "toy-token";
  o.fragments = 4;
  o.H = 4;
  o.tau = 1;
  o.join_timeout_s = 20;
  return o;
}

/* Every bad argument: an error code, a message naming the problem, no handle. */
static void check_bad_arguments(const char* target) {
  toy_model m;
  toy_init(&m, 0.0f);
  atoll_learner* l = NULL;
  atoll_learner_options o = toy_options(target);
  CHECK(atoll_learner_open(NULL, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT && l == NULL);
  CHECK(atoll_learner_open(&o, NULL, 0, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "no parameters") != NULL);
  o.syncer = "";
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "syncer") != NULL);
  o = toy_options(target);
  o.mode = "ddp";
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "ddp") != NULL);
  o = toy_options(target);
  o.H = 2; /* P = 4 > H */
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  o = toy_options(target);
  o.plan = "zigzag";
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "zigzag") != NULL);
  o = toy_options(target);
  m.params[2].name = "layers.0.w";
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "repeats") != NULL);
  toy_init(&m, 0.0f);
  m.params[1].data = NULL;
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "layers.0.w") != NULL);
  toy_init(&m, 0.0f);
  const int64_t bad_shape[2] = {8, -1};
  m.params[1].shape = bad_shape;
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "dimension 1") != NULL);
  CHECK(l == NULL);
  CHECK(atoll_learner_step(NULL, 10, 1.0, NULL) == ATOLL_INVALID_ARGUMENT);
  CHECK(atoll_learner_counters_get(NULL, NULL) == ATOLL_INVALID_ARGUMENT);
  CHECK(atoll_learner_close(NULL, 0) == ATOLL_OK);
}

/* A different model (one shape changed), a wrong token, a wrong schedule: refused at join. */
static void check_refused(const char* target) {
  toy_model m;
  toy_init(&m, 0.0f);
  atoll_learner* l = NULL;
  atoll_learner_options o = toy_options(target);
  const int64_t other_shape[2] = {4, 16};
  m.params[1].shape = other_shape;
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_FAILED_PRECONDITION && l == NULL);
  CHECK(strstr(atoll_last_error(), "model signature") != NULL);
  CHECK(strstr(atoll_last_error(), "layers.0.w [4,16]") != NULL);
  toy_init(&m, 0.0f);
  o.token = "wrong-token";
  const atoll_status st = atoll_learner_open(&o, m.params, kTensors, &l);
  CHECK((st == ATOLL_UNAUTHENTICATED || st == ATOLL_PERMISSION_DENIED) && l == NULL);
  o = toy_options(target);
  o.tau = 2;
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_FAILED_PRECONDITION && l == NULL);
  CHECK(strstr(atoll_last_error(), "schedule mismatch") != NULL);
}

/* At least 40 inner steps of 10 ms, until the learner has pushed and applied merged fragments
 * (bounded: 2000 steps); the global model moves towards the learner's optimum. */
static void check_training(toy_syncer* s, const char* target) {
  toy_model m;
  toy_init(&m, -3.0f); /* the join overwrites this with the syncer's Θ (0.25) */
  atoll_learner* l = NULL;
  atoll_learner_options o = toy_options(target);
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_OK && l != NULL);
  CHECK(m.w0[0] == 0.25f && m.norm[7] == 0.25f);
  const double mean0 = toy_syncer_mean(s);
  int applied_total = 0, step = 0;
  atoll_learner_counters k;
  for (; step < 2000; ++step) {
    CHECK(atoll_learner_counters_get(l, &k) == ATOLL_OK);
    if (step >= 40 && k.pushes > 0 && applied_total > 0) break;
    int applied = 0;
    const double loss = toy_step(&m);
    const struct timespec compute = {0, 10 * 1000 * 1000};
    nanosleep(&compute, NULL);
    CHECK(atoll_learner_step(l, 128, loss, &applied) == ATOLL_OK);
    applied_total += applied;
  }
  CHECK(atoll_learner_step(l, 0, 1.0, NULL) == ATOLL_INVALID_ARGUMENT);
  CHECK(atoll_learner_step(l, 10, NAN, NULL) == ATOLL_INVALID_ARGUMENT);
  CHECK(atoll_learner_counters_get(l, &k) == ATOLL_OK);
  CHECK(k.steps == step && k.joined == 1 && k.learner_id >= 0);
  CHECK(k.pushes > 0);
  CHECK(k.fragments_applied > 0 && applied_total > 0);
  CHECK(atoll_learner_close(l, 10.0) == ATOLL_OK);
  CHECK(toy_syncer_rounds(s) > 0);
  const double mean1 = toy_syncer_mean(s);
  printf("c_api_test: %d fragments applied, %lld pushes, %lld rounds, global mean %.3f -> %.3f\n", applied_total,
         (long long)k.pushes, (long long)toy_syncer_rounds(s), mean0, mean1);
  CHECK(fabs(mean1 - 1.0) < fabs(mean0 - 1.0));
}

/* The syncer goes away under a joined learner: steps go on (the agent retries in the background);
 * the goodbye fails with a status, and the handle is freed all the same. */
static void check_syncer_gone(toy_syncer* s, const char* target) {
  toy_model m;
  toy_init(&m, 0.0f);
  atoll_learner* l = NULL;
  atoll_learner_options o = toy_options(target);
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_OK);
  toy_syncer_stop(s);
  for (int step = 0; step < 4; ++step) CHECK(atoll_learner_step(l, 128, toy_step(&m), NULL) == ATOLL_OK);
  const atoll_status st = atoll_learner_close(l, 0.0);
  CHECK(st == ATOLL_UNAVAILABLE || st == ATOLL_DEADLINE_EXCEEDED);
  CHECK(strlen(atoll_last_error()) > 0);
}

static void check_id_held(atoll_learner* l, const char* target);

/* Version 2: settings are checked; the plan's slices cover every parameter once; lists refuse a
 * small capacity but say the count. */
static void check_settings_and_plan(const char* target) {
  CHECK(atoll_c_api_version() == ATOLL_C_API_VERSION);
  toy_model m;
  toy_init(&m, 0.0f);
  atoll_learner* l = NULL;
  atoll_learner_options o = toy_options(target);
  atoll_learner_settings s;
  atoll_learner_settings_init(&s);
  CHECK(s.struct_size == sizeof(s) && s.push_timeout_s == 60 && s.min_link_mbps == 10 && s.state_dir == NULL);
  s.push_timeout_s = 0;
  CHECK(atoll_learner_open_ex(&o, &s, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT && l == NULL);
  CHECK(strstr(atoll_last_error(), "push_timeout_s") != NULL);
  atoll_learner_settings_init(&s);
  s.min_link_mbps = -1;
  CHECK(atoll_learner_open_ex(&o, &s, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "min_link_mbps") != NULL);
  atoll_learner_settings_init(&s);
  s.backoff_max_s = 0.1;
  CHECK(atoll_learner_open_ex(&o, &s, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  const int bad_flags[kTensors] = {0, 2, 0, 0};
  atoll_learner_settings_init(&s);
  s.staged = bad_flags;
  CHECK(atoll_learner_open_ex(&o, &s, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "layers.0.w") != NULL);
  s.struct_size = 2;
  CHECK(atoll_learner_open_ex(&o, &s, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  o.alpha = 1.0; /* alpha 1 would never take a merge in */
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  o = toy_options(target);
  CHECK(atoll_learner_open(&o, m.params, kTensors, &l) == ATOLL_OK);
  CHECK(atoll_learner_num_fragments(l) == 4 && atoll_learner_num_fragments(NULL) == 0);
  int64_t covered[kTensors] = {0, 0, 0, 0}, total = 0;
  for (int p = 0; p < 4; ++p) {
    atoll_slice slices[8];
    size_t n = 0;
    CHECK(atoll_learner_fragment_slices(l, p, slices, 8, &n) == ATOLL_OK && n >= 1);
    for (size_t i = 0; i < n; ++i) {
      CHECK(slices[i].param >= 0 && slices[i].param < kTensors && slices[i].count > 0);
      covered[slices[i].param] += slices[i].count;
      total += slices[i].count;
    }
    CHECK(atoll_learner_staged_count(l, p) == 0);
  }
  CHECK(total == 200 && covered[0] == 64 && covered[3] == 8);
  atoll_slice one;
  size_t n = 0;
  CHECK(atoll_learner_fragment_slices(l, 4, &one, 1, &n) == ATOLL_INVALID_ARGUMENT);
  CHECK(atoll_learner_fragment_slices(l, 0, &one, 0, &n) == ATOLL_INVALID_ARGUMENT && n >= 1);
  CHECK(strstr(atoll_last_error(), "capacity") != NULL);
  CHECK(atoll_learner_staged_count(l, 9) == -1);
  check_id_held(l, target);
  CHECK(atoll_learner_close(l, 0) == ATOLL_OK);
}

/* The id a live learner holds is refused to a second one: a distinct status. */
static void check_id_held(atoll_learner* l, const char* target) {
  atoll_learner_counters k;
  CHECK(atoll_learner_counters_get(l, &k) == ATOLL_OK && k.learner_id >= 0);
  atoll_learner_options o2 = toy_options(target);
  o2.learner_id = k.learner_id;
  atoll_learner* l2 = NULL;
  toy_model m2;
  toy_init(&m2, 0.0f);
  CHECK(atoll_learner_open(&o2, m2.params, kTensors, &l2) == ATOLL_ALREADY_EXISTS && l2 == NULL);
  CHECK(strstr(atoll_last_error(), "held by a live learner") != NULL);
}

/* The staged values of due fragment p (its staged slices, in slice order) from `live`. */
static void give_due(atoll_learner* l, int p, const toy_model* live, const int* staged) {
  float values[128];
  size_t count = 0, ns = 0;
  atoll_slice slices[8];
  CHECK(atoll_learner_fragment_slices(l, p, slices, 8, &ns) == ATOLL_OK);
  for (size_t j = 0; j < ns; ++j) {
    if (!staged[slices[j].param]) continue;
    memcpy(values + count, live->params[slices[j].param].data + slices[j].offset,
           (size_t)slices[j].count * sizeof(float));
    count += (size_t)slices[j].count;
  }
  CHECK((int64_t)count == atoll_learner_staged_count(l, p));
  if (count > 0) CHECK(atoll_learner_send(l, p, values, count) == ATOLL_OK);
}

/* Applies the receipts of the last step (or the open) to `live`; returns how many were additive. */
static int apply_receipts(atoll_learner* l, toy_model* live, const toy_model* host, const int* staged, int* applied) {
  atoll_receipt r[8];
  size_t nr = 0;
  int additive = 0;
  CHECK(atoll_learner_receipts(l, r, 8, &nr) == ATOLL_OK);
  for (size_t i = 0; i < nr; ++i) {
    atoll_slice slices[8];
    size_t ns = 0;
    CHECK(atoll_learner_fragment_slices(l, r[i].fragment, slices, 8, &ns) == ATOLL_OK);
    for (size_t j = 0; j < ns; ++j) {
      if (!staged[slices[j].param]) continue;
      float* dst = live->params[slices[j].param].data + slices[j].offset;
      const float* src = host->params[slices[j].param].data + slices[j].offset;
      for (int64_t e = 0; e < slices[j].count; ++e) dst[e] = r[i].kind == ATOLL_RECEIPT_ADD ? dst[e] + src[e] : src[e];
    }
    additive += r[i].kind == ATOLL_RECEIPT_ADD;
  }
  *applied += (int)nr;
  return additive;
}

/* Staged buffers: the caller keeps its live values apart (as a GPU learner would), gives the due
 * fragments' staged values before each step and applies the receipts after it. */
static void check_staged(toy_syncer* s, const char* target) {
  toy_model live, host;
  toy_init(&live, -3.0f);
  toy_init(&host, -3.0f);
  const int staged[kTensors] = {0, 1, 1, 0}; /* layers.*.w staged, the others shared (host == live) */
  atoll_param params[kTensors];
  for (int t = 0; t < kTensors; ++t) params[t] = staged[t] ? host.params[t] : live.params[t];
  atoll_learner_settings set;
  atoll_learner_settings_init(&set);
  set.staged = staged;
  atoll_learner_options o = toy_options(target);
  atoll_learner* l = NULL;
  CHECK(atoll_learner_open_ex(&o, &set, params, kTensors, &l) == ATOLL_OK);
  int64_t staged_total = 0;
  for (int p = 0; p < 4; ++p) staged_total += atoll_learner_staged_count(l, p);
  CHECK(staged_total == 128);
  int applied_total = 0, additive = apply_receipts(l, &live, &host, staged, &applied_total); /* the join */
  for (int step = 0; step < 2000 && (step < 40 || additive == 0); ++step) {
    toy_step(&live);
    int due[4];
    size_t n = 0;
    CHECK(atoll_learner_due(l, due, 4, &n) == ATOLL_OK && n <= 1);
    for (size_t i = 0; i < n; ++i) give_due(l, due[i], &live, staged);
    const struct timespec compute = {0, 10 * 1000 * 1000};
    nanosleep(&compute, NULL);
    CHECK(atoll_learner_step(l, 128, 1.0, NULL) == ATOLL_OK);
    size_t np = 9;
    CHECK(atoll_learner_pending(l, NULL, 0, &np) == ATOLL_OK && np == 0); /* all given before the step */
    additive += apply_receipts(l, &live, &host, staged, &applied_total);
  }
  CHECK(live.w0[0] != -3.0f && live.w1[63] != -3.0f); /* the join's model reached the live values */
  CHECK(applied_total > 0 && additive > 0);
  CHECK(atoll_learner_send(l, 0, NULL, 5) == ATOLL_INVALID_ARGUMENT);
  memcpy(host.w0, live.w0, sizeof(live.w0)); /* close reads the live values */
  memcpy(host.w1, live.w1, sizeof(live.w1));
  CHECK(atoll_learner_close(l, 10.0) == ATOLL_OK);
  printf("c_api_test: staged: %d fragments applied (%d additive), %lld rounds\n", applied_total, additive,
         (long long)toy_syncer_rounds(s));
}

/* A state folder: a learner opened again on it is the same learner; another run's or a second
 * live process's use of it is refused. */
static void check_state(const char* target) {
  char dir[] = "/tmp/atoll_c_state_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  toy_model m;
  toy_init(&m, 0.0f);
  atoll_learner_settings set;
  atoll_learner_settings_init(&set);
  set.state_dir = dir;
  atoll_learner_options o = toy_options(target);
  atoll_learner* l = NULL;
  CHECK(atoll_learner_open_ex(&o, &set, m.params, kTensors, &l) == ATOLL_OK);
  for (int step = 0; step < 12; ++step) CHECK(atoll_learner_step(l, 128, toy_step(&m), NULL) == ATOLL_OK);
  atoll_learner_counters k;
  CHECK(atoll_learner_counters_get(l, &k) == ATOLL_OK && k.learner_id >= 0);
  char json[8192];
  size_t len = 0;
  CHECK(atoll_learner_state_json(l, json, sizeof(json), &len) == ATOLL_OK && len == strlen(json));
  CHECK(strstr(json, "\"learner_id\"") != NULL && strstr(json, "\"fragments\"") != NULL);
  CHECK(atoll_learner_state_json(l, json, 4, &len) == ATOLL_INVALID_ARGUMENT && len > 4);
  atoll_learner* again = NULL;
  CHECK(atoll_learner_open_ex(&o, &set, m.params, kTensors, &again) == ATOLL_ALREADY_EXISTS && again == NULL);
  CHECK(strstr(atoll_last_error(), "in use") != NULL);
  CHECK(atoll_learner_close(l, 5.0) == ATOLL_OK);
  /* Opened again (learner_id -1): the folder's learner, continuing its steps. */
  CHECK(atoll_learner_open_ex(&o, &set, m.params, kTensors, &l) == ATOLL_OK);
  atoll_learner_counters k2;
  CHECK(atoll_learner_counters_get(l, &k2) == ATOLL_OK);
  CHECK(k2.learner_id == k.learner_id && k2.steps == 12);
  CHECK(atoll_learner_close(l, 0) == ATOLL_OK);
  o.learner_id = k.learner_id + 1;
  CHECK(atoll_learner_open_ex(&o, &set, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "learner.json") != NULL);
  o = toy_options(target);
  o.run_id = "another";
  CHECK(atoll_learner_open_ex(&o, &set, m.params, kTensors, &l) == ATOLL_INVALID_ARGUMENT);
  CHECK(strstr(atoll_last_error(), "run 'toy'") != NULL);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  toy_syncer* s = toy_syncer_start(4, 4, 1, 0.25f, "toy-token");
  CHECK(s != NULL);
  char target[64];
  snprintf(target, sizeof(target), "127.0.0.1:%d", toy_syncer_port(s));
  check_bad_arguments(target);
  check_refused(target);
  check_settings_and_plan(target);
  check_training(s, target);
  check_staged(s, target);
  check_state(target);
  check_syncer_gone(s, target);
  printf("c_api_test: ok\n");
  return 0;
}
