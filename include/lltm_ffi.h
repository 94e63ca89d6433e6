/* Everything the Python package calls, as cffi reads it: build_ffi.py hands
 * this file to cdef() unchanged, so it holds declarations only (no #include,
 * no #ifdef).
 *
 * Every pass of every op goes through one entry point, lltm_run: the pass
 * (its id, from lltm_pass_id), the element type (an lltm_dtype), the device
 * (LLTM_CPU, or a CUDA device index) and, for CUDA, a cudaStream_t of that
 * device as an integer (for the CPU, the most threads the pass may use:
 * torch.get_num_threads(), 1 for the calling thread alone, 0 for OpenMP's
 * own default); then the pass's sizes, its scalars and the addresses of its
 * tensors, each an array in the order the op's Python declaration and its C
 * pass agree on (include/lltm_op.h). A tensor the pass may go without is
 * passed as 0. A CUDA pass runs on `device` (switched to and back when it
 * is not the calling thread's current one). Every function returns
 * LLTM_SUCCESS or an error code for lltm_error_string: a CUDA error's own
 * code, or one below. */

enum lltm_dtype { LLTM_FLOAT32 = 0, LLTM_FLOAT64 = 1, LLTM_FLOAT16 = 2, LLTM_BFLOAT16 = 3 };

/* The device argument of a CPU pass (a CUDA pass takes the device's index). */
enum { LLTM_CPU = -1 };

/* What lltm_pass_devices answers: the devices a pass was compiled for. */
enum { LLTM_ON_CPU = 1, LLTM_ON_CUDA = 2 };

enum {
  LLTM_SUCCESS = 0,
  /* A CUDA device was asked of a module built without CUDA. */
  LLTM_ERROR_NO_CUDA = -1,
  /* dtype is not an lltm_dtype, or one the pass does not take. */
  LLTM_ERROR_DTYPE = -2,
  /* A pass would make its cuBLAS handle during a CUDA graph capture. */
  LLTM_ERROR_CUBLAS_CAPTURE = -3,
  /* cuBLAS could not be loaded (an op then runs its own kernels: no entry
   * point returns this). */
  LLTM_ERROR_NO_CUBLAS = -4,
  /* A CPU pass could not allocate its scratch memory. */
  LLTM_ERROR_NO_MEMORY = -5,
  /* A pass was given sizes or tensors it cannot take, which its Python
   * declaration should have refused. */
  LLTM_ERROR_ARGUMENTS = -6,
  /* No pass has this id. */
  LLTM_ERROR_NO_PASS = -7,
  /* The pass has no version for this device (a CUDA pass of an op without
   * a kernel, say). */
  LLTM_ERROR_NO_DEVICE_PASS = -8,
  /* A forced path (lltm_sequence_options.path, LLTM_PATH in the
   * environment) cannot take the call, each code saying why (the paths'
   * table: src/plan.c). */
  LLTM_ERROR_PATH_DEVICE = -9,
  LLTM_ERROR_PATH_PACKED = -10,
  LLTM_ERROR_PATH_NO_CLUSTERS = -11,
  LLTM_ERROR_PATH_CLUSTER_SIZES = -12,
  LLTM_ERROR_PATH_PERSISTENT_SIZES = -13,
  LLTM_ERROR_PATH_NO_CUBLAS = -14,
  LLTM_ERROR_PATH_STEP_SIZES = -15,
  /* A cuBLAS call failed: LLTM_ERROR_CUBLAS minus cuBLAS's status. */
  LLTM_ERROR_CUBLAS = -1000
};

/* The id of the pass registered as `name` (LLTM_CPU_PASS, LLTM_CUDA_PASS),
 * or LLTM_ERROR_NO_PASS where none is. */
int lltm_pass_id(const char* name);
/* LLTM_ON_CPU | LLTM_ON_CUDA for the devices the pass `pass` runs on. */
int lltm_pass_devices(int pass);
/* The element types the pass's version for `devices` (LLTM_ON_CPU or
 * LLTM_ON_CUDA) takes: bit (1 << dtype) for each lltm_dtype; 0 where it
 * has no such version. */
int lltm_pass_dtypes(int pass, int devices);
/* How many passes are registered, and the name of the one with id `pass`
 * (0 to count - 1): the registry, for diagnostics. */
int lltm_pass_count(void);
const char* lltm_pass_name(int pass);
/* A name registered twice for one device, the second registration refused;
 * NULL where none was. */
const char* lltm_pass_conflict(void);

int lltm_run(int pass, int dtype, int device, intptr_t stream, const int64_t* sizes,
             const double* scalars, const intptr_t* tensors);

/* The text for any code returned here (CUDA's own message for a CUDA error).
 * The string is static; never free it. */
const char* lltm_error_string(int code);

/* What the module was built with, for bug reports and the stale-build check:
 * 1 with CUDA, else 0; the architectures its kernels carry ("sm_75 ...
 * compute_90", "" without CUDA); CUDART_VERSION (13000 for CUDA 13.0, 0
 * without CUDA); the hash of its sources; the package version. */
int lltm_cuda_compiled(void);
const char* lltm_cuda_archs(void);
int lltm_cuda_runtime_version(void);
const char* lltm_source_hash(void);
const char* lltm_package_version(void);

/* The LLTM's paths, in the order of the plan's table (src/plan.c, drawn in
 * docs/ARCHITECTURE.md): the sequence's on a CUDA device, tried in this
 * order, the first that takes a pass running it; the sequence's on the
 * CPU; the cell's on a CUDA device (on the CPU the cell takes cell-torch).
 * lltm_path_name gives each one's name, the one LLTM_PATH takes. */
enum lltm_path {
  LLTM_PATH_CLUSTER = 0,
  LLTM_PATH_PERSISTENT = 1,
  LLTM_PATH_CUBLAS = 2,
  LLTM_PATH_STEPS = 3,
  LLTM_PATH_CPU = 4,
  LLTM_PATH_CELL_STEPS = 5,
  LLTM_PATH_CELL_TORCH = 6,
  LLTM_PATH_COUNT = 7,
  /* No path forced: the plan chooses. */
  LLTM_PATH_PLANNED = -1
};

/* A sequence pass's options, the last of its tensors' addresses (NULL: all
 * as lltm_default_options), built in lltm_ffi/ops/lltm/plan.py from torch's
 * TF32 setting and the environment. */
typedef struct {
  /* An lltm_path the call must take (LLTM_PATH), or LLTM_PATH_PLANNED;
   * a path of the other function (the cell's for the sequence) leaves the
   * choice to the plan. */
  int path;
  /* float32 products through cuBLAS may use TF32
   * (torch.backends.cuda.matmul.allow_tf32). */
  int tf32;
  /* 0: never cuBLAS, lltm_ffi's own kernels for every product
   * (LLTM_CUBLAS=0). */
  int cublas;
  /* 0: no thread-block clusters for the recurrence, as before compute
   * capability 9.0 (LLTM_CLUSTER=0). */
  int clusters;
  /* The CPU's float16 and bfloat16 products on AMX: -1 where the sizes pay
   * for it, 0 never (LLTM_AMX=0), 1 for every product it takes
   * (LLTM_AMX=1). */
  int amx;
  /* The CPU's products through the BLAS (lltm_blas.h) where one is loaded:
   * -1 where the sizes pay for it, 0 never (LLTM_BLAS=0), 1 for every
   * product it takes, the recurrence's at every size too (LLTM_BLAS=1). */
  int blas;
  /* The state padded with zero units (lltm_sequence_state): -1 where
   * the plan finds it pays, 0 never (LLTM_PAD=0), 1 to rows of whole 16
   * bytes for every sequence, on any device (LLTM_PAD=1). */
  int pad;
} lltm_sequence_options;

/* The name of path `path` (an lltm_path), NULL for another number. */
const char* lltm_path_name(int path);
/* A sequence pass as the plan sees it: a forward that keeps nothing for a
 * backward, the backward, or a forward that keeps its gates and cells for
 * one (the plan may give these two forwards different paths). */
enum lltm_pass { LLTM_PASS_FORWARD = 0, LLTM_PASS_BACKWARD = 1, LLTM_PASS_FORWARD_SAVED = 2 };

/* The path a sequence pass `pass` (an lltm_pass) would take, of `steps`
 * steps of batch_size rows (packed 1: packed steps, which shrink) and
 * state_size columns, elements of the lltm_dtype `dtype`, on
 * `device` (LLTM_CPU, or the current CUDA device) with `options` (NULL:
 * the defaults). An lltm_path, or for a forced path that cannot take the
 * pass its LLTM_ERROR_PATH code; LLTM_ERROR_NO_CUDA for a CUDA device in
 * a build without CUDA. */
int lltm_sequence_path(int dtype, int device, int pass, int64_t steps, int64_t batch_size,
                       int64_t state_size, int packed, const lltm_sequence_options* options);
/* The width of the tiles to which the plan may pad a state: a multiple
 * of LLTM_PAD_TILE runs as given. */
enum { LLTM_PAD_TILE = 128 };
/* The state size a sequence call of state_size columns runs at, backward
 * 1 where a backward pass will follow its forward (its other arguments as
 * lltm_sequence_path's): state_size, or where the plan pads the state
 * with zero units (their weights, bias and initial state zero, they stay
 * zero and change nothing of the others) the next size whose rows are
 * whole 16 bytes or the next multiple of LLTM_PAD_TILE. The caller gives it to each pass among its
 * sizes, with a workspace of lltm_sequence_workspace elements; the pass
 * pads, runs and cuts back within (include/lltm_padding.h). */
int64_t lltm_sequence_state(int dtype, int device, int backward, int64_t steps,
                            int64_t batch_size, int64_t state_size, int packed,
                            const lltm_sequence_options* options);
/* The elements of `dtype` in the workspace of the sequence pass `pass`
 * (an lltm_pass) of `sizes` (the pass's own, with its padded state) and
 * the tensors `present` (bit i set where the pass's tensor i is given):
 * 0 where the padded state is the state. */
int64_t lltm_sequence_workspace(int pass, int dtype, const int64_t* sizes, uint64_t present);
/* The path of a call of the cell (lltm) whose gate product takes
 * `multiply_adds` multiply-adds, elements of `dtype`, on `device`, while
 * a CUDA graph is captured (capturing 1) or not, `forced` an lltm_path or
 * LLTM_PATH_PLANNED: LLTM_PATH_CELL_STEPS, LLTM_PATH_CELL_TORCH, or an
 * LLTM_ERROR_PATH code. */
int lltm_cell_path(int dtype, int device, int64_t multiply_adds, int capturing, int forced);

/* 1 where the CPU passes of float16 and bfloat16 may take their products
 * on bfloat16 tile products (src/cpu/lltm_amx.h): AMX's (the CPU has its
 * bfloat16 tiles and Linux let this process use them), or else
 * AVX512-BF16's dot products; else 0. Asked once. lltm_amx_tiles: 1 where
 * they are AMX's. */
int lltm_amx_usable(void);
int lltm_amx_tiles(void);
/* 1 where the CPU runs AVX-512 (F, BW, DQ and VL, as x86-64-v4 asks): the
 * vector width of the own tiles' widest clone (lltm_cpu_math.h), which the
 * plan of the CPU passes' products and the checks above go by. */
int lltm_cpu_avx512(void);

/* The CPU passes' BLAS (include/lltm_blas.h): the path of the library to
 * load on the first product that asks for one (NULL: none), given before
 * any pass runs; the loaded library's own description ("OpenBLAS 0.3.34
 * DYNAMIC_ARCH ... Haswell ..."), or "" where none could be loaded (loading
 * it on the first call). */
void lltm_blas_library(const char* path);
const char* lltm_blas_config(void);
/* 1 where the loaded BLAS runs kernels narrower than the CPU's vectors:
 * an OpenBLAS whose kernels (chosen at its load from the CPU, or from
 * OPENBLAS_CORETYPE where that is set) are not one of its AVX-512
 * families, on a CPU with AVX-512; else 0 (loading it on the first call).
 * The own tiles then take more of the products (products_plan_). */
int lltm_blas_narrow(void);

/* The most threads that a parallel region of the calling thread's last
 * CPU pass ran on: 1 where it entered none. */
int lltm_cpu_threads_used(void);
/* What took the recurrent products of the calling thread's last CPU
 * sequence pass: "own tiles", "amx" or "blas" (src/cpu/lltm_cpu_impl.h,
 * products_plan_); "" before any. */
const char* lltm_cpu_recurrence(void);
