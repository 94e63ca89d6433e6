/* lltm_threads_allowed (include/lltm_op.h): whether a CPU pass may start
 * OpenMP threads. GNU OpenMP's thread pool does not survive fork(): a
 * forked child inherits the pool's bookkeeping but not its threads, so its
 * first parallel region with more than one thread waits for them forever.
 * torch runs on the same libgomp, so torch's own ops may have started the
 * pool as well as lltm_ffi's passes. Hence a forked child never enters a
 * parallel region: the fork handler registered when the module loads
 * clears the flag in every child (and so in the children's children).
 * Without a handler the passes never use threads. Only the constructor and
 * the handler write it, each while no pass can run. */
#include <pthread.h>

#include "lltm_op.h"

int lltm_threads_allowed;

static void forbid_threads(void) { lltm_threads_allowed = 0; }

__attribute__((constructor)) static void allow_threads(void) {
  lltm_threads_allowed = pthread_atfork(NULL, NULL, forbid_threads) == 0;
}
