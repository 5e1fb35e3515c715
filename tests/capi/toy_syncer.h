/* A real syncer (SyncerLoop behind the gRPC server, 127.0.0.1 port 0) over a toy model, for the
 * plain-C test of the C API. C++ inside, C outside. The toy model, in order:
 *   "emb.weight" [16, 4] (embedding), "layers.0.w" [8, 8], "layers.1.w" [8, 8], "norm" [8]
 * balanced plan with P fragments; every value starts at `init`. */
#ifndef ATOLL_TESTS_TOY_SYNCER_H_
#define ATOLL_TESTS_TOY_SYNCER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct toy_syncer toy_syncer;

/* NULL on failure (printed). run id "toy", token `token` (NULL: none). */
toy_syncer* toy_syncer_start(int P, int H, int tau, float init, const char* token);
int toy_syncer_port(const toy_syncer* s);
/* Rounds closed so far. */
int64_t toy_syncer_rounds(toy_syncer* s);
/* The mean of every value of the global model Θ. */
double toy_syncer_mean(toy_syncer* s);
void toy_syncer_stop(toy_syncer* s);

#ifdef __cplusplus
}
#endif

#endif
