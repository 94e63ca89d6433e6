/* How many threads a CPU pass may use.
 *
 * lltm_threads_allowed (include/lltm_op.h): whether a CPU pass may start
 * OpenMP threads. GNU OpenMP's thread pool does not survive fork(): a
 * forked child inherits the pool's bookkeeping but not its threads, so its
 * first parallel region with more than one thread waits for them forever.
 * torch runs on the same libgomp, so torch's own ops may have started the
 * pool as well as lltm_ffi's passes. Hence a forked child never enters a
 * parallel region: the fork handler registered when the module loads
 * clears the flag in every child (and so in the children's children).
 * Without a handler the passes never use threads. Only the constructor and
 * the handler write it, each while no pass can run.
 *
 * Within that, a pass uses as many threads as its caller says (lltm_run's
 * `stream` argument for the CPU: torch.get_num_threads()), held for the
 * calling thread while its pass runs, so that passes called from several
 * threads at once each keep their own. */
#include <omp.h>
#include <pthread.h>

#include "lltm_op.h"

int lltm_threads_allowed;

static void forbid_threads(void) { lltm_threads_allowed = 0; }

__attribute__((constructor)) static void allow_threads(void) {
  lltm_threads_allowed = pthread_atfork(NULL, NULL, forbid_threads) == 0;
}

/* The calling thread's pass: the most threads it may use (0: OpenMP's
 * default), and the largest team it has asked for so far. */
static _Thread_local int pass_threads;
static _Thread_local int threads_used = 1;

void lltm_start_cpu_pass(int threads) {
  pass_threads = threads;
  threads_used = 1;
}

int lltm_cpu_threads_used(void) { return threads_used; }

/* The products of the calling thread's last CPU pass's recurrence. */
static _Thread_local const char* recurrence = "";

void lltm_note_cpu_recurrence(const char* name) { recurrence = name; }

const char* lltm_cpu_recurrence(void) { return recurrence; }

int lltm_pass_team(void) {
  if (!lltm_threads_allowed) return 1;
  return pass_threads > 0 ? pass_threads : omp_get_max_threads();
}

/* Waking and joining a team costs about the same whatever its size, while
 * the time it saves grows with it: a team of n takes work from 2/n of
 * LLTM_PARALLEL_MIN_ELEMENTS on (the 2-core AMD EPYC's threshold for two).
 * On 16 threads of the H200 machine's Xeon, bfloat16 inference at a state
 * of 512 and a batch of 16 (8,192 elements of cell math a step) took 80 us
 * a step from 4,096 elements on, against 191 from 32,768.
 * A team is the whole pass's or one thread, never sized to a loop's count:
 * GNU OpenMP's regions of changing sizes cost far more than threads left
 * idle. On that Xeon, teams capped at their loops' counts made bfloat16
 * inference at a batch of 1 and a state of 256 take 5.2 to 6.3 times
 * nn.LSTM's time, against 1.1 to 1.2 (16 threads, two turns of each). */
int lltm_team_size_from(int64_t elements, int64_t min_elements) {
  const int team = lltm_pass_team();
  if (elements * team < 2 * min_elements) return 1;
  if (team > threads_used) threads_used = team;
  return team;
}

int lltm_team_size(int64_t elements) {
  return lltm_team_size_from(elements, LLTM_PARALLEL_MIN_ELEMENTS);
}
