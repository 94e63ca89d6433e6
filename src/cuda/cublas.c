/* cuBLAS loaded at run time for the sequence layer's matrix products
 * (include/lltm_cublas.h): the few functions used, declared here with
 * cuBLAS's own signatures and found with dlsym, so that neither a cuBLAS
 * header nor a cuBLAS library is needed to build. */
#ifdef LLTM_WITH_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_cublas.h"
#include "lltm_op.h"

/* cuBLAS's types, as its header declares them: enums are ints, the handle
 * a pointer. */
typedef void* cublas_handle;
typedef int (*create_function)(cublas_handle*);
typedef int (*set_stream_function)(cublas_handle, cudaStream_t);
typedef int (*set_math_mode_function)(cublas_handle, int);
typedef int (*set_workspace_function)(cublas_handle, void*, size_t);
typedef int (*sgemm_function)(cublas_handle, int, int, int, int, int, const float*, const float*,
                              int, const float*, int, const float*, float*, int);
typedef int (*dgemm_function)(cublas_handle, int, int, int, int, int, const double*,
                              const double*, int, const double*, int, const double*, double*,
                              int);
/* cublasGemmEx: transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype,
 * ldb, beta, C, Ctype, ldc, computeType, algo. */
typedef int (*gemm_ex_function)(cublas_handle, int, int, int, int, int, const void*, const void*,
                                int, int, const void*, int, int, const void*, void*, int, int,
                                int, int);

enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
enum { CUBLAS_STATUS_NOT_SUPPORTED = 15 };
/* library_types.h's cudaDataType and cublas_api.h's cublasComputeType_t and
 * cublasGemmAlgo_t. */
enum { CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68 };
enum { CUBLAS_GEMM_DEFAULT = -1 };

static struct {
  create_function create;
  set_stream_function set_stream;
  set_math_mode_function set_math_mode;
  set_workspace_function set_workspace;
  sgemm_function sgemm;
  dgemm_function dgemm;
  gemm_ex_function gemm_ex; /* NULL: no 16-bit products, float and double go on */
} cublas;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

/* The libcublas torch loaded (newest first), else the first on the library
 * path; the handle is never closed. */
static void load(void) {
  static const char* const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  const int count = (int)(sizeof(names) / sizeof(names[0]));
  void* library = NULL;
  for (int i = 0; i < count && !library; ++i) library = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  for (int i = 0; i < count && !library; ++i) library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!library) return;
  cublas.create = (create_function)dlsym(library, "cublasCreate_v2");
  cublas.set_stream = (set_stream_function)dlsym(library, "cublasSetStream_v2");
  cublas.set_math_mode = (set_math_mode_function)dlsym(library, "cublasSetMathMode");
  cublas.set_workspace = (set_workspace_function)dlsym(library, "cublasSetWorkspace_v2");
  cublas.sgemm = (sgemm_function)dlsym(library, "cublasSgemm_v2");
  cublas.dgemm = (dgemm_function)dlsym(library, "cublasDgemm_v2");
  cublas.gemm_ex = (gemm_ex_function)dlsym(library, "cublasGemmEx");
  loaded = cublas.create && cublas.set_stream && cublas.set_math_mode && cublas.set_workspace &&
           cublas.sgemm && cublas.dgemm;
}

/* Whether the loaded cuBLAS has products of `dtype`. */
static int takes(int dtype) {
  if (dtype == LLTM_FLOAT32 || dtype == LLTM_FLOAT64) return 1;
  return (dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16) && cublas.gemm_ex;
}

/* A handle per device index, made under the lock and kept; so is each
 * device's stream for recording graphs. */
#define LLTM_CUBLAS_MAX_DEVICES 64
/* A stream's cuBLAS workspace: what cuBLAS advises for Hopper. On an H100
 * a 4 MiB one left the 64x256x256x512 sequence 19% slower. */
#define LLTM_CUBLAS_WORKSPACE ((size_t)32 << 20)
static cublas_handle handles[LLTM_CUBLAS_MAX_DEVICES];
static cudaStream_t recording_streams[LLTM_CUBLAS_MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cublas_handle current;  /* the handle of the pass that holds the lock */

static int cublas_code(int status) { return status ? LLTM_ERROR_CUBLAS - status : LLTM_SUCCESS; }

/* A failed runtime call also leaves its error as the runtime's last error;
 * clear it so that a later launch check does not report it. */
static int runtime_code(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return (int)status;
}

/* Sets the handle's stream and its workspace: `workspace` (of
 * LLTM_CUBLAS_WORKSPACE bytes) or none. Setting the stream gives cuBLAS's
 * default workspace back, which belongs to the handle and so would be shared
 * by passes running on several streams at once; none of ours is. */
static int use_stream(cublas_handle handle, cudaStream_t stream, void* workspace) {
  const int code = cublas_code(cublas.set_stream(handle, stream));
  return code != LLTM_SUCCESS ? code
                              : cublas_code(cublas.set_workspace(
                                    handle, workspace, workspace ? LLTM_CUBLAS_WORKSPACE : 0));
}

/* The two tables below (the streams' workspaces, the passes' graphs) keep
 * what was used last: each entry begins with an lru_stamp, its last use by
 * one clock the tables share, 0 while the entry is empty. Under the lock. */
typedef struct {
  uint64_t used;
} lru_stamp;
static uint64_t clock_now;

static void lru_touch(lru_stamp* stamp) { stamp->used = ++clock_now; }

/* Of the `count` entries of `size` bytes at `table`, the index of the one in
 * use for which same(entry, wanted) holds, stamped used now; or -1, with
 * *slot the one to fill: an empty one, else the least recently used, which
 * the caller empties. */
static int lru_find(void* table, int count, size_t size,
                    int (*same)(const void* entry, const void* wanted), const void* wanted,
                    int* slot) {
  int oldest = 0;
  uint64_t oldest_used = UINT64_MAX;
  for (int i = 0; i < count; ++i) {
    lru_stamp* entry = (lru_stamp*)((char*)table + (size_t)i * size);
    if (entry->used && same(entry, wanted)) {
      lru_touch(entry);
      return i;
    }
    if (entry->used < oldest_used) {
      oldest = i;
      oldest_used = entry->used;
    }
  }
  *slot = oldest;
  return -1;
}

/* The cuBLAS workspaces, one a stream (of a device), made on a stream's
 * first pass: its passes' products use it whether they run as they come or
 * replay a graph recorded for that stream, so cuBLAS picks the same
 * algorithms and a pass gives the same bits either way. Launches on one
 * stream never overlap, so neither do its products'. The least recently
 * used is freed for a new stream; the graphs that use it are then never
 * found again (their key holds it). Under the lock. */
#define LLTM_STREAM_WORKSPACES 8
typedef struct {
  lru_stamp stamp; /* first, for lru_find */
  int device;
  cudaStream_t stream;
  /* NULL where cudaMalloc failed: never found, so the stream's next pass tries again. */
  void* workspace;
} stream_workspace_entry;
static stream_workspace_entry stream_workspaces[LLTM_STREAM_WORKSPACES];

static int same_stream(const void* entry, const void* wanted) {
  const stream_workspace_entry* a = (const stream_workspace_entry*)entry;
  const stream_workspace_entry* b = (const stream_workspace_entry*)wanted;
  return a->workspace && a->device == b->device && a->stream == b->stream;
}

/* The workspace of `stream` on `device`, made now if need be; NULL (no
 * workspace) where none can be made, and while capturing: no memory can be
 * allocated then, and a captured graph, replayed on another stream while
 * this one runs passes, must not hold this stream's workspace. */
static void* stream_workspace(int device, cudaStream_t stream, int capturing) {
  if (capturing) return NULL;
  const stream_workspace_entry wanted = {.device = device, .stream = stream};
  int slot = 0;
  const int found = lru_find(stream_workspaces, LLTM_STREAM_WORKSPACES,
                             sizeof(stream_workspaces[0]), same_stream, &wanted, &slot);
  if (found >= 0) return stream_workspaces[found].workspace;
  stream_workspace_entry* entry = &stream_workspaces[slot];
  /* cudaFree waits for the device, so for the last product that used it. */
  if (entry->workspace) (void)runtime_code(cudaFree(entry->workspace));
  void* workspace = NULL;
  if (runtime_code(cudaMalloc(&workspace, LLTM_CUBLAS_WORKSPACE))) workspace = NULL;
  entry->device = device;
  entry->stream = stream;
  entry->workspace = workspace;
  lru_touch(&entry->stamp);
  return workspace;
}

/* The current device's handle in `current`, made now if need be, set to
 * `stream`, its workspace (in *workspace) and the math mode. Under the lock. */
static int take_handle(int device, cudaStream_t stream, int capturing, int tf32,
                       void** workspace) {
  if (!handles[device]) {
    if (capturing) return LLTM_ERROR_CUBLAS_CAPTURE;
    const int code = cublas_code(cublas.create(&handles[device]));
    if (code != LLTM_SUCCESS) {
      handles[device] = NULL;
      return code;
    }
  }
  current = handles[device];
  *workspace = stream_workspace(device, stream, capturing);
  const int code = use_stream(current, stream, *workspace);
  if (code != LLTM_SUCCESS) return code;
  return cublas_code(
      cublas.set_math_mode(current, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

/* The passes seen lately, by key, each for the stream it runs on (and that
 * stream's workspace): a graph of the launches once one came a second time
 * (or recording is known to fail for it). A graph replays only on its own
 * stream, so its products share that stream's workspace with the stream's
 * other passes, never at once. Destroying a graph's executable (on
 * eviction) does not wait for its launches: CUDA frees it once they end.
 * Under the lock. */
#define LLTM_GRAPHS 64
typedef struct {
  lru_stamp stamp; /* first, for lru_find; 0: an empty entry */
  int device, unrecordable;
  cudaStream_t stream;
  void* workspace;
  lltm_pass_key key; /* its batch_sizes a copy the entry owns */
  cudaGraphExec_t graph;
} graph_entry;
static graph_entry graphs[LLTM_GRAPHS];

static int same_key(const lltm_pass_key* a, const lltm_pass_key* b) {
  const size_t sizes_bytes = (size_t)a->batch_sizes_count * sizeof(int64_t);
  return memcmp(a->values, b->values, sizeof(a->values)) == 0 &&
         a->batch_sizes_count == b->batch_sizes_count &&
         (sizes_bytes == 0 || memcmp(a->batch_sizes, b->batch_sizes, sizes_bytes) == 0);
}

static int same_pass(const void* entry, const void* wanted) {
  const graph_entry* a = (const graph_entry*)entry;
  const graph_entry* b = (const graph_entry*)wanted;
  return a->device == b->device && a->stream == b->stream && a->workspace == b->workspace &&
         same_key(&a->key, &b->key);
}

/* Empties graphs[entry]. */
static void forget_graph(int entry) {
  if (graphs[entry].graph) (void)runtime_code(cudaGraphExecDestroy(graphs[entry].graph));
  free((void*)graphs[entry].key.batch_sizes);
  memset(&graphs[entry], 0, sizeof(graphs[entry]));
}

/* Fills the empty graphs[entry] with `wanted`'s pass (its batch sizes
 * copied); 0 where the copy cannot be made. */
static int remember_pass(int entry, const graph_entry* wanted) {
  const lltm_pass_key* key = &wanted->key;
  int64_t* batch_sizes = NULL;
  if (key->batch_sizes_count > 0) {
    const size_t bytes = (size_t)key->batch_sizes_count * sizeof(int64_t);
    batch_sizes = (int64_t*)malloc(bytes);
    if (!batch_sizes) return 0;
    memcpy(batch_sizes, key->batch_sizes, bytes);
  }
  graphs[entry] = *wanted;
  graphs[entry].key.batch_sizes = batch_sizes;
  lru_touch(&graphs[entry].stamp);
  return 1;
}

/* Records steps() as a graph on the device's recording stream, its
 * products on graphs[entry]'s workspace, and launches it on that entry's
 * stream; LLTM_ERROR_NO_CUBLAS (nothing launched) where recording fails. */
static int record(int entry, int (*steps)(void*, cudaStream_t), void* context) {
  graph_entry* recorded = &graphs[entry];
  cudaStream_t side = recording_streams[recorded->device];
  if (!side && runtime_code(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking))) {
    return LLTM_ERROR_NO_CUBLAS;
  }
  recording_streams[recorded->device] = side;
  if (use_stream(current, side, recorded->workspace) != LLTM_SUCCESS ||
      runtime_code(cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal))) {
    return LLTM_ERROR_NO_CUBLAS;
  }
  int code = steps(context, side);
  cudaGraph_t graph = NULL;
  const int ended = runtime_code(cudaStreamEndCapture(side, &graph));
  if (code == LLTM_SUCCESS) code = ended;
  if (code == LLTM_SUCCESS) code = runtime_code(cudaGraphInstantiate(&recorded->graph, graph, 0));
  if (graph) (void)cudaGraphDestroy(graph);
  if (code != LLTM_SUCCESS) {
    recorded->graph = NULL;
    return LLTM_ERROR_NO_CUBLAS;
  }
  return runtime_code(cudaGraphLaunch(recorded->graph, recorded->stream));
}

/* The pass under the lock, the handle set to `stream` and `workspace`:
 * replayed, recorded, or launched as it comes. */
static int run_pass(int device, const lltm_pass_key* key, cudaStream_t stream, void* workspace,
                    int capturing, int (*steps)(void*, cudaStream_t), void* context) {
  if (capturing || key->values[0] == 0) return steps(context, stream);
  const graph_entry wanted = {
      .device = device, .stream = stream, .workspace = workspace, .key = *key};
  int entry = 0;
  const int found = lru_find(graphs, LLTM_GRAPHS, sizeof(graphs[0]), same_pass, &wanted, &entry);
  if (found < 0) {
    forget_graph(entry);
    (void)remember_pass(entry, &wanted); /* not remembered: never recorded */
    return steps(context, stream);
  }
  if (graphs[found].graph) return runtime_code(cudaGraphLaunch(graphs[found].graph, stream));
  if (!graphs[found].unrecordable) {
    const int code = record(found, steps, context);
    if (code != LLTM_ERROR_NO_CUBLAS) return code;
    graphs[found].unrecordable = 1;
    const int reset = use_stream(current, stream, workspace);
    if (reset != LLTM_SUCCESS) return reset;
  }
  return steps(context, stream);
}

int lltm_cublas_usable(int dtype) {
  pthread_once(&load_once, load);
  return loaded && takes(dtype);
}

int lltm_cublas_run(const lltm_pass_key* key, int dtype, cudaStream_t stream, int tf32,
                    int (*steps)(void* context, cudaStream_t stream), void* context) {
  pthread_once(&load_once, load);
  if (!loaded || !takes(dtype)) return LLTM_ERROR_NO_CUBLAS;
  int device;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  int code = runtime_code(cudaGetDevice(&device));
  if (code == LLTM_SUCCESS && (device < 0 || device >= LLTM_CUBLAS_MAX_DEVICES)) {
    return LLTM_ERROR_NO_CUBLAS;
  }
  if (code == LLTM_SUCCESS) code = runtime_code(cudaStreamIsCapturing(stream, &capture));
  if (code != LLTM_SUCCESS) return code;
  const int capturing = capture != cudaStreamCaptureStatusNone;
  pthread_mutex_lock(&lock);
  void* workspace = NULL;
  code = take_handle(device, stream, capturing, tf32, &workspace);
  if (code == LLTM_SUCCESS) {
    code = run_pass(device, key, stream, workspace, capturing, steps, context);
  }
  current = NULL;
  pthread_mutex_unlock(&lock);
  return code;
}

int lltm_cublas_gemm(int dtype, int transpose_a, int transpose_b, int64_t m, int64_t n,
                     int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
                     int accumulate, void* c, int64_t ldc) {
  const int op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (!takes(dtype)) return cublas_code(CUBLAS_STATUS_NOT_SUPPORTED);
  if (dtype == LLTM_FLOAT64) {
    const double one = 1, beta = accumulate ? 1 : 0;
    return cublas_code(cublas.dgemm(current, op_a, op_b, (int)m, (int)n, (int)k, &one, a,
                                    (int)lda, b, (int)ldb, &beta, c, (int)ldc));
  }
  const float one = 1, beta = accumulate ? 1 : 0;
  if (dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16) {
    const int type = dtype == LLTM_FLOAT16 ? CUDA_R_16F : CUDA_R_16BF;
    return cublas_code(cublas.gemm_ex(current, op_a, op_b, (int)m, (int)n, (int)k, &one, a, type,
                                      (int)lda, b, type, (int)ldb, &beta, c, type, (int)ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return cublas_code(cublas.sgemm(current, op_a, op_b, (int)m, (int)n, (int)k, &one, a,
                                  (int)lda, b, (int)ldb, &beta, c, (int)ldc));
}

/* cuBLAS's statuses by number (cublas_api.h). */
static const char* const status_texts[] = {
    [1] = "cuBLAS: CUBLAS_STATUS_NOT_INITIALIZED", [3] = "cuBLAS: CUBLAS_STATUS_ALLOC_FAILED",
    [7] = "cuBLAS: CUBLAS_STATUS_INVALID_VALUE", [8] = "cuBLAS: CUBLAS_STATUS_ARCH_MISMATCH",
    [11] = "cuBLAS: CUBLAS_STATUS_MAPPING_ERROR", [13] = "cuBLAS: CUBLAS_STATUS_EXECUTION_FAILED",
    [14] = "cuBLAS: CUBLAS_STATUS_INTERNAL_ERROR", [15] = "cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED",
    [16] = "cuBLAS: CUBLAS_STATUS_LICENSE_ERROR"};

const char* lltm_cublas_error_string(int code) {
  if (code == LLTM_ERROR_NO_CUBLAS) return "cuBLAS could not be loaded";
  if (code == LLTM_ERROR_CUBLAS_CAPTURE) {
    return "lltm_sequence makes its cuBLAS handle for a device on its first call there, which "
           "cannot happen during a CUDA graph capture: run the sequence once on this device "
           "before capturing (as torch.cuda.graph's warm-up does)";
  }
  const int status = LLTM_ERROR_CUBLAS - code;
  const int known = (int)(sizeof(status_texts) / sizeof(status_texts[0]));
  if (status <= 0 || status >= 1000) return NULL;
  return status < known && status_texts[status] ? status_texts[status]
                                                : "cuBLAS: a call failed with another status";
}

#endif /* LLTM_WITH_CUDA */
