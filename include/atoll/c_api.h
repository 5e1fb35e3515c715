/* atoll C API: one learner of a Decoupled DiLoCo run, driven from any language or framework.
 *
 * The caller owns the model and its training loop; atoll owns the exchange with the syncer. The
 * caller hands over its parameters as named float32 buffers in host memory (row-major, contiguous)
 * and, after every inner step, reports the step's token count. Between steps atoll writes the
 * merged global fragments that are due straight into those buffers. Behind the handle is the same
 * learner agent that `atoll learner` uses (include/atoll/learner/learner_agent.h): the staggered
 * fragment schedule, the codecs, join with backoff, catch-up, rejoin after partitions or a syncer
 * restart, heartbeats, per-learner tokens and TLS over the atl.v1 gRPC protocol.
 *
 * The syncer holds the model it was started with (`atoll syncer`, the run file's [model]); a
 * learner's tensors must have the same names, shapes, order and embedding flags, or the join is
 * refused with ATOLL_FAILED_PRECONDITION and a message that lists this learner's tensors.
 *
 * Buffers: every `data` pointer must stay valid, and keep its size, until atoll_learner_close
 * returns. atoll reads them during atoll_learner_open and atoll_learner_step and writes them only
 * inside atoll_learner_step (never from a background thread), so the caller may change them freely
 * between calls (that is training).
 *
 * Errors: every function returns an atoll_status. On anything but ATOLL_OK the handle is unchanged
 * and atoll_last_error() returns a message saying why (thread-local; valid until this thread's next
 * atoll call). No function aborts on bad input.
 *
 * Thread-safety: one handle is used by one thread at a time (the training thread); different
 * handles are independent. atoll_last_error is per thread.
 */
#ifndef ATOLL_C_API_H_
#define ATOLL_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The numeric values equal gRPC's (and atl::StatusCode's). */
typedef enum atoll_status {
  ATOLL_OK = 0,
  ATOLL_INVALID_ARGUMENT = 3,     /* a bad argument: nothing was done */
  ATOLL_DEADLINE_EXCEEDED = 4,
  ATOLL_NOT_FOUND = 5,            /* e.g. a token file that does not exist */
  ATOLL_PERMISSION_DENIED = 7,    /* the syncer refused the token */
  ATOLL_FAILED_PRECONDITION = 9,  /* the syncer refused this learner for good: run, model, plan */
  ATOLL_INTERNAL = 13,
  ATOLL_UNAVAILABLE = 14,         /* the syncer could not be reached */
  ATOLL_UNAUTHENTICATED = 16,
  ATOLL_OTHER = 2                 /* any other failure; the message says which */
} atoll_status;

/* One parameter tensor. `data` holds prod(shape) float32 values, row-major; ndim 0 is a scalar. */
typedef struct atoll_param {
  const char* name;        /* unique, non-empty */
  float* data;             /* caller-owned host memory (see "Buffers" above) */
  const int64_t* shape;    /* ndim dimensions, each ≥ 1; may be NULL when ndim is 0 */
  int ndim;
  int is_embedding;        /* 1: merged by weighted mean, never RDA (token embeddings) */
} atoll_param;

typedef struct atoll_learner_options {
  const char* syncer;           /* host:port of `atoll syncer --listen` (required) */
  const char* run_id;           /* the syncer's run id, exactly (`atoll run`: the run folder's
                                 * name; a syncer started by hand: its --run-id, "" by default) */
  int learner_id;               /* 0..M-1, or -1 to let the syncer choose */
  const char* token;            /* the run's or this learner's token; NULL or "": none */
  const char* token_file;       /* read the token from this file instead (NULL: not used) */
  const char* tls_ca_file;      /* TLS: the CA of the syncer's certificate (NULL: plaintext) */
  const char* tls_server_name;  /* TLS: expected server name (NULL: the host of `syncer`) */
  const char* tls_cert_file;    /* mutual TLS: this learner's certificate and key (NULL: none) */
  const char* tls_key_file;
  const char* mode;             /* "decoupled" (default) or "diloco"; must be the syncer's */
  const char* plan;             /* "balanced" (default) or "strided"; must be the syncer's */
  int fragments;                /* P; must be the syncer's */
  int H;                        /* inner steps between two syncs of a fragment; the syncer's */
  int tau;                      /* overlap in steps; the syncer's */
  double alpha;                 /* mixing on receipt, in [0, 1] */
  int keep_progress;            /* keep the steps trained since a fragment was sent (1) */
  double join_timeout_s;        /* how long open waits for the first join (then trains on) */
  int rejoin;                   /* 1: this learner restarted after a failure */
} atoll_learner_options;

typedef struct atoll_learner_counters {
  int64_t steps, pushes, pushes_failed, pulls, fragments_applied, joins, catchup_fragments;
  int64_t payload_bytes_up, payload_bytes_down, version_held;
  int learner_id;               /* the id the syncer gave (-1 before the first join) */
  int joined;
} atoll_learner_counters;

typedef struct atoll_learner atoll_learner;  /* opaque */

/* The defaults of `atoll learner` (configs/run.toml): decoupled, balanced, P = H = 24, tau 2,
 * alpha 0, keep_progress 1, join timeout 20 s, learner_id -1, run_id "atoll". */
void atoll_learner_options_init(atoll_learner_options* options);

/* Builds the fragment plan over `params` (in this order), connects, joins and catches up
 * (bounded by join_timeout_s; when the syncer is not reachable yet, it returns ATOLL_OK and keeps
 * trying in the background). On return the buffers hold the global model when the join succeeded.
 * Errors: ATOLL_INVALID_ARGUMENT for bad options or parameters; ATOLL_FAILED_PRECONDITION /
 * ATOLL_PERMISSION_DENIED / ATOLL_UNAUTHENTICATED when the syncer refused this learner. *out is
 * set only on ATOLL_OK. */
atoll_status atoll_learner_open(const atoll_learner_options* options, const atoll_param* params,
                                size_t num_params, atoll_learner** out);

/* Call after each inner step with the tokens it trained on (≥ 1) and its training loss (for the
 * syncer's status; any finite value). Schedules this step's fragment pushes and writes the merged
 * fragments that are due into the buffers (in "diloco" mode it waits at the H-step barrier).
 * *applied (may be NULL) receives the number of fragments written. Errors: ATOLL_INVALID_ARGUMENT
 * (bad tokens or loss, or a NULL handle), or the agent's fatal error (e.g. refused on rejoin). */
atoll_status atoll_learner_step(atoll_learner* learner, int64_t tokens, double loss, int* applied);

/* 1 when the syncer asked the run to finish (stop training and close), else 0. */
int atoll_learner_finish_requested(const atoll_learner* learner);

atoll_status atoll_learner_counters_get(const atoll_learner* learner, atoll_learner_counters* out);

/* End of training: pushes the progress not yet sent (bounded by flush_timeout_s; 0 skips it),
 * tells the syncer this learner is done, stops the threads and frees the handle (also on error;
 * NULL is a no-op). Returns the goodbye's status (ATOLL_UNAVAILABLE when the syncer was gone). */
atoll_status atoll_learner_close(atoll_learner* learner, double flush_timeout_s);

/* Why the last failing atoll call on this thread failed ("" when none did). */
const char* atoll_last_error(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* ATOLL_C_API_H_ */
