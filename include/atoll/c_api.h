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
 * Staged buffers (version 2, atoll_learner_open_ex with atoll_learner_settings.staged): a
 * parameter that lives elsewhere (a GPU, bf16) is handed over as a host float32 buffer the caller
 * stages. atoll then reads it only in open and close, so the caller copies only the fragments that
 * move. A fragment due to be sent gets its staged values from atoll_learner_send: before the step
 * (atoll_learner_due lists the fragments the next step will send; it sends them at once), or after
 * it (the step parks a due fragment whose values were not given; atoll_learner_pending lists them;
 * the caller copies them while training goes on). atoll_learner_receipts lists the fragments the
 * step wrote, with what the caller must do to its live values (atoll_receipt).
 * atoll_learner_fragment_slices says which element ranges of which parameters make up a fragment.
 * In "diloco" mode give the values before the step: the barrier waits only for sends it has.
 *
 * State (version 2, atoll_learner_settings.state_dir): the learner keeps its public copies and a
 * learner.json (its id, step, tokens, held fragment versions and checksums, counters) in a folder;
 * a learner opened again on that folder rejoins under the same id (as a restart) and catches up
 * with deltas from the copies it held instead of fetching the model.
 *
 * Thread-safety: one handle is used by one thread at a time (the training thread, or whichever
 * thread the caller serialises the calls on); different handles are independent.
 * atoll_last_error is per thread.
 *
 * Versions: ATOLL_C_API_VERSION. Version 2 added, without changing any version-1 type or
 * function: the statuses ATOLL_ALREADY_EXISTS and ATOLL_RESOURCE_EXHAUSTED (an "id already held"
 * refusal was ATOLL_OTHER before), atoll_learner_settings and atoll_learner_open_ex, the fragment,
 * send and receipt functions, atoll_learner_state_json. Options alpha must now be < 1 (1 was
 * accepted and aborted at the first merge).
 */
#ifndef ATOLL_C_API_H_
#define ATOLL_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATOLL_C_API_VERSION 2

/* The version of the library linked at run time (ATOLL_C_API_VERSION of its header). */
int atoll_c_api_version(void);

/* The numeric values equal gRPC's (and atl::StatusCode's). */
typedef enum atoll_status {
  ATOLL_OK = 0,
  ATOLL_INVALID_ARGUMENT = 3, /* a bad argument: nothing was done */
  ATOLL_DEADLINE_EXCEEDED = 4,
  ATOLL_NOT_FOUND = 5,           /* e.g. a token file that does not exist */
  ATOLL_ALREADY_EXISTS = 6,      /* refused: the learner id is held by a live learner (v2) */
  ATOLL_PERMISSION_DENIED = 7,   /* the syncer refused the token (or banned this learner) */
  ATOLL_RESOURCE_EXHAUSTED = 8,  /* the syncer's limits refused the call, e.g. a full learner table (v2) */
  ATOLL_FAILED_PRECONDITION = 9, /* the syncer refused this learner for good: run, model, plan */
  ATOLL_INTERNAL = 13,
  ATOLL_UNAVAILABLE = 14, /* the syncer could not be reached */
  ATOLL_UNAUTHENTICATED = 16,
  ATOLL_OTHER = 2 /* any other failure; the message says which */
} atoll_status;

/* One parameter tensor. `data` holds prod(shape) float32 values, row-major; ndim 0 is a scalar. */
typedef struct atoll_param {
  const char* name;     /* unique, non-empty */
  float* data;          /* caller-owned host memory (see "Buffers" above) */
  const int64_t* shape; /* ndim dimensions, each ≥ 1; may be NULL when ndim is 0 */
  int ndim;
  int is_embedding; /* 1: merged by weighted mean, never RDA (token embeddings) */
} atoll_param;

typedef struct atoll_learner_options {
  const char* syncer;          /* host:port of `atoll syncer --listen` (required) */
  const char* run_id;          /* the syncer's run id, exactly (`atoll run`: the run folder's
                                 * name; a syncer started by hand: its --run-id, "" by default) */
  int learner_id;              /* 0..M-1, or -1 to let the syncer choose */
  const char* token;           /* the run's or this learner's token; NULL or "": none */
  const char* token_file;      /* read the token from this file instead (NULL: not used) */
  const char* tls_ca_file;     /* TLS: the CA of the syncer's certificate (NULL: plaintext) */
  const char* tls_server_name; /* TLS: expected server name (NULL: the host of `syncer`) */
  const char* tls_cert_file;   /* mutual TLS: this learner's certificate and key (NULL: none) */
  const char* tls_key_file;
  const char* mode;      /* "decoupled" (default) or "diloco"; must be the syncer's */
  const char* plan;      /* "balanced" (default) or "strided"; must be the syncer's */
  int fragments;         /* P; must be the syncer's */
  int H;                 /* inner steps between two syncs of a fragment; the syncer's */
  int tau;               /* overlap in steps; the syncer's */
  double alpha;          /* mixing on receipt, in [0, 1] */
  int keep_progress;     /* keep the steps trained since a fragment was sent (1) */
  double join_timeout_s; /* how long open waits for the first join (then trains on) */
  int rejoin;            /* 1: this learner restarted after a failure */
} atoll_learner_options;

typedef struct atoll_learner_counters {
  int64_t steps, pushes, pushes_failed, pulls, fragments_applied, joins, catchup_fragments;
  int64_t payload_bytes_up, payload_bytes_down, version_held;
  int learner_id; /* the id the syncer gave (-1 before the first join) */
  int joined;
} atoll_learner_counters;

typedef struct atoll_learner atoll_learner; /* opaque */

/* The defaults of `atoll learner` (configs/run.toml): decoupled, balanced, P = H = 24, tau 2,
 * alpha 0, keep_progress 1, join timeout 20 s, learner_id -1, run_id "atoll". */
void atoll_learner_options_init(atoll_learner_options* options);

/* Builds the fragment plan over `params` (in this order), connects, joins and catches up
 * (bounded by join_timeout_s; when the syncer is not reachable yet, it returns ATOLL_OK and keeps
 * trying in the background). On return the buffers hold the global model when the join succeeded.
 * Errors: ATOLL_INVALID_ARGUMENT for bad options or parameters; ATOLL_FAILED_PRECONDITION /
 * ATOLL_PERMISSION_DENIED / ATOLL_UNAUTHENTICATED when the syncer refused this learner. *out is
 * set only on ATOLL_OK. */
atoll_status atoll_learner_open(const atoll_learner_options* options, const atoll_param* params, size_t num_params,
                                atoll_learner** out);

/* Call after each inner step with the tokens it trained on (≥ 1) and its training loss (for the
 * syncer's status; any finite value). Schedules this step's fragment pushes and writes the merged
 * fragments that are due into the buffers (in "diloco" mode it waits at the H-step barrier).
 * *applied (may be NULL) receives the number of fragments written. Errors: ATOLL_INVALID_ARGUMENT
 * (bad tokens or loss, a NULL handle, or a pending send not completed), or the agent's fatal
 * error (e.g. refused on rejoin). */
atoll_status atoll_learner_step(atoll_learner* learner, int64_t tokens, double loss, int* applied);

/* 1 when the syncer asked the run to finish (stop training and close), else 0. */
int atoll_learner_finish_requested(const atoll_learner* learner);

atoll_status atoll_learner_counters_get(const atoll_learner* learner, atoll_learner_counters* out);

/* End of training: pushes the progress not yet sent (bounded by flush_timeout_s; 0 skips it),
 * tells the syncer this learner is done, stops the threads and frees the handle (also on error;
 * NULL is a no-op). Returns the goodbye's status (ATOLL_UNAVAILABLE when the syncer was gone).
 * Staged buffers must hold the live values on entry; on return they hold the final model (the
 * merges taken in during the flush applied as to shared buffers). With a state folder, its
 * learner.json is written last. */
atoll_status atoll_learner_close(atoll_learner* learner, double flush_timeout_s);

/* ---- Version 2 ---- */

/* Settings beyond atoll_learner_options. `struct_size` lets the struct grow: the library reads
 * only the fields that fit in it, and takes the defaults for the rest. */
typedef struct atoll_learner_settings {
  size_t struct_size;       /* sizeof(atoll_learner_settings); set by atoll_learner_settings_init */
  const char* state_dir;    /* the learner's state folder (see "State" above); NULL or "": none */
  double call_timeout_s;    /* deadline of a join, heartbeat or goodbye (10) */
  double push_timeout_s;    /* base deadline of one push or pull (60) */
  double min_link_mbps;     /* pushes and pulls get push_timeout_s plus their payload's time at
                               * this rate (10 Mbit/s; 0: no allowance) */
  double heartbeat_s;       /* seconds between heartbeats (0.5) */
  double backoff_initial_s; /* first wait before a failed join or call is retried (0.2) */
  double backoff_max_s;     /* the wait doubles up to this (5) */
  const int* staged;        /* NULL, or one flag per parameter: 1 = a staged buffer */
} atoll_learner_settings;

void atoll_learner_settings_init(atoll_learner_settings* settings);

/* atoll_learner_open with settings (NULL: the defaults). With a state_dir that holds a
 * learner.json of this run, the learner takes that id (options.learner_id must be -1 or the
 * same), opens as a restart (rejoin) and continues its step count; a learner.json of another run
 * or another id is refused with ATOLL_INVALID_ARGUMENT, nothing changed. Staged buffers must
 * hold the parameters' values on entry (the join reads them) and receive the join's global model
 * as receipts (atoll_learner_receipts right after open). */
atoll_status atoll_learner_open_ex(const atoll_learner_options* options, const atoll_learner_settings* settings,
                                   const atoll_param* params, size_t num_params, atoll_learner** out);

/* The fragment plan: P fragments, each a list of element ranges of the parameters. */
typedef struct atoll_slice {
  int param;      /* index into the params given to open */
  int64_t offset; /* first element (flat, row-major) */
  int64_t count;
} atoll_slice;

int atoll_learner_num_fragments(const atoll_learner* learner); /* P (0 for NULL) */
/* Lists: *count receives the list's length; up to `capacity` entries are written to `out`
 * (capacity P or the fragment's slice count always suffices); ATOLL_INVALID_ARGUMENT when
 * capacity is smaller (*count still set) or an argument is NULL. */
atoll_status atoll_learner_fragment_slices(const atoll_learner* learner, int fragment, atoll_slice* out,
                                           size_t capacity, size_t* count);

/* The fragments the next atoll_learner_step will send, as things stand (a join or rejoin in the
 * background may change that; a due fragment whose staged values were not given is then parked). */
atoll_status atoll_learner_due(const atoll_learner* learner, int* out, size_t capacity, size_t* count);
/* The fragments the last atoll_learner_step scheduled for sending. */
atoll_status atoll_learner_sends(const atoll_learner* learner, int* out, size_t capacity, size_t* count);
/* The scheduled sends that wait for their staged values, ascending. Each must be completed with
 * atoll_learner_send before the next atoll_learner_step (which refuses otherwise). */
atoll_status atoll_learner_pending(const atoll_learner* learner, int* out, size_t capacity, size_t* count);
/* A fragment's staged values: its slices of staged parameters, concatenated in slice order — of a
 * pending fragment as they were after the step that scheduled it (before that step's receipts are
 * applied); of a due fragment as they are now, before the step that sends it. `count` must be
 * atoll_learner_staged_count. ATOLL_INVALID_ARGUMENT for another count or a fragment neither
 * pending nor due (nothing changes). The values are copied: the buffer is the caller's on return. */
atoll_status atoll_learner_send(atoll_learner* learner, int fragment, const float* values, size_t count);
int64_t atoll_learner_staged_count(const atoll_learner* learner, int fragment); /* -1 for bad arguments */

/* What a receipt leaves in a fragment's staged slices (shared buffers hold the final values). */
typedef enum atoll_receipt_kind {
  ATOLL_RECEIPT_MIX = 0, /* the merged Θ_p: live ← alpha·live + (1 − alpha)·Θ_p (a copy at alpha 0) */
  ATOLL_RECEIPT_ADD = 1  /* live ← live + Δ: the merge of this learner's push with its progress kept,
                           * Δ = (1 − alpha)(Θ_p − θ_sent), or a rebase onto a newer public copy
                           * after a rejoin, Δ = Φ_new − Φ_old (the progress kept, no mixing) */
} atoll_receipt_kind;

typedef struct atoll_receipt {
  int fragment;
  int kind; /* atoll_receipt_kind */
} atoll_receipt;

/* The fragments the last atoll_learner_step (or atoll_learner_open) wrote, in order. */
atoll_status atoll_learner_receipts(const atoll_learner* learner, atoll_receipt* out, size_t capacity, size_t* count);

/* The learner's state as JSON text (what learner.json in the state folder holds): format,
 * run_id, learner_id, step, tokens, fragments [{version, checksum}], counters {...}. Writes up
 * to capacity − 1 bytes and a NUL; *length receives the text's length (without the NUL). */
atoll_status atoll_learner_state_json(const atoll_learner* learner, char* out, size_t capacity, size_t* length);

/* Why the last failing atoll call on this thread failed ("" when none did). */
const char* atoll_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATOLL_C_API_H_ */
