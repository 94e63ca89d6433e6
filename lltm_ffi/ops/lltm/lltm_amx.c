/* Matrix products on AMX's tiles (lltm_amx.h says what and when).
 *
 * Eight tile registers of 16 rows by 64 bytes: a product of 32 x 32 sums
 * holds them in four (tmm0 to tmm3), and each step of 32 of the depth
 * loads two tiles of the left factor (tmm4, tmm5: 16 rows by 32 bfloat16s
 * each) and two of the right (tmm6, tmm7: 16 pairs of depth rows by 16
 * columns, each column's pair side by side), then takes four tile
 * products. Packing lays each factor out tile after tile, 1 KiB each, in
 * the order a block of sums reads them. */
#include "lltm_amx.h"

#include <stdlib.h>
#include <string.h>

#include "lltm_op.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define LLTM_AMX_COMPILED 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
/* What the packing is compiled for: it runs only where AMX does, on CPUs
 * that all have AVX-512 (amx_permitted asks). */
#define VECTOR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define VECTOR_TARGET
#endif

#define TILE_ROWS 16
#define TILE_DEPTH 32             /* bfloat16s, 64 bytes */
#define TILE_ELEMENTS 512         /* TILE_ROWS * TILE_DEPTH */
#define BLOCK 32                  /* rows and columns of a block of sums: two tiles each way */
#define PACKED_DEPTH_BLOCK 2048   /* lltm_amx_multiply's packed depth at a time */

static inline uint32_t bits_of(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static inline float float_of(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* value's pieces: its top 16 bits, exact where bfloat16 holds it; with
 * two pieces, also the rest (value minus the first, exact in float), whose
 * top 16 bits hold it where value has at most 16 significant bits. 0 where
 * value is inf or NaN. */
static inline int split(float value, int pieces, uint16_t* piece) {
  const uint32_t bits = bits_of(value);
  piece[0] = (uint16_t)(bits >> 16);
  if (pieces == 1) return 1;
  piece[1] = (uint16_t)(bits_of(value - float_of(bits & 0xffff0000u)) >> 16);
  return (bits & 0x7f800000u) != 0x7f800000u;
}

static int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/* Sizes packed->tiles for `count` rows or columns over `depth` of the
 * factors; 0 where no memory could be had. */
static int make_room(int64_t count, int64_t depth, int pieces, lltm_amx_factor* packed) {
  packed->count = count;
  packed->depth = round_up(depth * pieces * pieces, TILE_DEPTH);
  packed->finite = 1;
  const size_t needed = (size_t)(round_up(count, BLOCK) * packed->depth);
  if (needed <= packed->capacity && packed->tiles) return 1;
  free(packed->tiles);
  packed->capacity = 0;
  /* Never zero bytes, and whole cache lines. */
  packed->tiles = (uint16_t*)aligned_alloc(64, (size_t)round_up((int64_t)needed * 2 + 64, 64));
  if (!packed->tiles) return 0;
  packed->capacity = needed;
  return 1;
}

void lltm_amx_free(lltm_amx_factor* packed) {
  free(packed->tiles);
  memset(packed, 0, sizeof *packed);
}

/* The packed depth: the factors' element k takes places k pieces^2 to
 * (k + 1) pieces^2 - 1, the left factor's piece p at p pieces to p pieces
 * + pieces - 1, the right factor's piece q at every place q modulo pieces:
 * every pair of pieces meets once.
 *
 * Each loop below is written for a constant `pieces` (always inlined,
 * called with 1 or 2), and runs only where AMX does, so for AVX-512:
 * whole tile rows of factors in memory convert 16 or 32 at a time. */
#define INLINE static inline __attribute__((always_inline))

/* A row of the left factor along its depth (NULL: a row of padding), into
 * its tile rows (`out`, the first; each next one TILE_ELEMENTS on). */
INLINE int pack_left_row(const float* row, int64_t depth, int pieces, int64_t packed_depth,
                         uint16_t* out) {
  const int spread = pieces * pieces, per_tile = TILE_DEPTH / spread;
  int finite = 1;
  for (int64_t first = 0; first * spread < packed_depth; first += per_tile) {
    const int whole = row && first + per_tile <= depth;
    for (int t = 0; t < per_tile; ++t) {
      const float value = whole || (row && first + t < depth) ? row[first + t] : 0.0f;
      uint16_t piece[2];
      finite &= split(value, pieces, piece);
      for (int p = 0; p < spread; ++p) out[t * spread + p] = piece[p / pieces];
    }
    out += TILE_ELEMENTS;
  }
  return finite;
}

/* Up to GROUP rows of a left factor read across its rows (row stride 1: a
 * transposed one), side by side at each k, so that each k reads them in
 * one run. */
#define GROUP 128

INLINE int pack_left_across(int64_t first_row, int64_t rows, int64_t depth, const float* a,
                            int64_t depth_stride, int pieces, int64_t packed_depth,
                            uint16_t* tiles) {
  const int spread = pieces * pieces;
  const int64_t end = round_up(rows, BLOCK) - first_row < GROUP ? round_up(rows, BLOCK)
                                                                : first_row + GROUP;
  int finite = 1;
  for (int64_t k = 0; k * spread < packed_depth; ++k) {
    const int64_t e = k * spread;
    uint16_t* column = tiles + e / TILE_DEPTH * TILE_ELEMENTS + e % TILE_DEPTH;
    for (int64_t row = first_row; row < end; ++row) {
      const float value = row < rows && k < depth ? a[row + k * depth_stride] : 0.0f;
      uint16_t piece[2];
      finite &= split(value, pieces, piece);
      uint16_t* out =
          column + row / TILE_ROWS * TILE_ROWS * packed_depth + row % TILE_ROWS * TILE_DEPTH;
      for (int p = 0; p < spread; ++p) out[p] = piece[p / pieces];
    }
  }
  return finite;
}

/* A right factor's tiles of up to GROUP columns from `first` on, TILE_ROWS
 * columns a tile: each tile row holds a pair of places of the packed
 * depth, column by column: rows k and k + 1 of b's where each is one
 * piece, else both pieces of row k (and the tile row after, the same
 * again). Each row of b is read GROUP columns at a time. */
INLINE int pack_right_group(int64_t first, int64_t columns, int64_t depth, const float* b,
                            int64_t row_stride, int pieces, int64_t packed_depth,
                            uint16_t* tiles) {
  const int rows_a_pair = pieces == 1 ? 2 : 1;
  const int64_t end = round_up(columns, BLOCK) - first < GROUP ? round_up(columns, BLOCK)
                                                               : first + GROUP;
  int finite = 1;
  for (int64_t e = 0; e < packed_depth; e += 2 * pieces) {
    const int64_t k = e / (pieces * pieces);
    for (int64_t block = first; block < end; block += TILE_ROWS) {
      uint16_t* out = tiles + block * packed_depth + e / TILE_DEPTH * TILE_ELEMENTS +
                      e % TILE_DEPTH / 2 * TILE_DEPTH;
      const int whole = block + TILE_ROWS <= columns && k + rows_a_pair <= depth;
      const float* row = b + k * row_stride + block;
      for (int j = 0; j < TILE_ROWS; ++j) {
        for (int h = 0; h < rows_a_pair; ++h) {
          const float value =
              whole || (block + j < columns && k + h < depth) ? row[h * row_stride + j] : 0.0f;
          uint16_t piece[2];
          finite &= split(value, pieces, piece);
          for (int p = 0; p < pieces; ++p) out[2 * j + h + p] = piece[p];
        }
      }
      if (pieces == 2) memcpy(out + TILE_DEPTH, out, 2 * TILE_DEPTH);
    }
  }
  return finite;
}

#ifdef LLTM_AMX_COMPILED

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The tile instructions are asm statements that tell gcc of no memory
 * they read or write: this keeps C's loads and stores on their side. */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

static int amx_permitted(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq")) {
    return 0;
  }
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) return 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & bit_AMX_TILE) ||
      !(edx & bit_AMX_BF16)) {
    return 0;
  }
  /* The OS saves the tiles' configuration and data (XCR0 bits 17, 18). */
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  if ((xcr0_low & (3u << 17)) != (3u << 17)) return 0;
  /* Linux (5.16 on) hands the tiles' 8 KiB of state only to a process
   * that asks; asking again is harmless. */
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int lltm_amx_usable(void) {
  static int state; /* 0: not asked yet; 1 usable; -1 not */
  int usable = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (!usable) {
    usable = amx_permitted() ? 1 : -1;
    __atomic_store_n(&state, usable, __ATOMIC_RELEASE);
  }
  return usable > 0;
}

/* Palette 1, all eight tiles 16 rows of 64 bytes. Static and constant:
 * ldtilecfg's asm tells gcc of only its first 8 bytes, so a configuration
 * built on the stack could lose its other stores. */
static const struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) tile_config = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* One block of sums, 32 x 32 (rows x columns of it inside the result),
 * at sums (row stride `stride`), over depth_blocks of the depth from left
 * and right on: the two tile rows of each factor lie `second` elements
 * apart. The tiles configured. A block past the result's edge goes through
 * memory of its own. */
AMX_TARGET static void block_product(const uint16_t* left, const uint16_t* right, int64_t second,
                                     int64_t depth_blocks, int rows, int columns,
                                     int accumulate, float* sums, int64_t stride) {
  float edge[BLOCK * BLOCK] __attribute__((aligned(64)));
  const int inside = rows == BLOCK && columns == BLOCK;
  float* out = inside ? sums : edge;
  const int64_t out_stride = inside ? stride : BLOCK;
  if (!inside && accumulate) {
    memset(edge, 0, sizeof edge);
    for (int i = 0; i < rows; ++i) memcpy(edge + i * BLOCK, sums + i * stride, 4 * columns);
  }
  MEMORY_BARRIER();
  const int64_t bytes = 4 * out_stride;
  if (accumulate) {
    _tile_loadd(0, out, bytes);
    _tile_loadd(1, out + 16, bytes);
    _tile_loadd(2, out + 16 * out_stride, bytes);
    _tile_loadd(3, out + 16 * out_stride + 16, bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t d = 0; d < depth_blocks; ++d) {
    _tile_loadd(4, left + d * TILE_ELEMENTS, 64);
    _tile_loadd(5, left + second + d * TILE_ELEMENTS, 64);
    _tile_loadd(6, right + d * TILE_ELEMENTS, 64);
    _tile_loadd(7, right + second + d * TILE_ELEMENTS, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, bytes);
  _tile_stored(1, out + 16, bytes);
  _tile_stored(2, out + 16 * out_stride, bytes);
  _tile_stored(3, out + 16 * out_stride + 16, bytes);
  MEMORY_BARRIER();
  if (!inside) {
    for (int i = 0; i < rows; ++i) memcpy(sums + i * stride, edge + i * BLOCK, 4 * columns);
  }
}

/* A thread's share: COLUMN_RUN blocks of columns, all rows, the depth
 * DEPTH_CHUNK at a time, so that a block's left tiles (32 KiB) stay in L1
 * across the run and the run's right tiles in L2 across the rows. */
#define COLUMN_RUN 4
#define DEPTH_CHUNK 512

/* The configuration is loaded once for the run, and the tiles released
 * after it, as the kernel expects of a thread done with them. */
AMX_TARGET static void column_run(const lltm_amx_factor* left, const lltm_amx_factor* right,
                                  int64_t first_block, int accumulate, float* sums,
                                  int64_t stride) {
  const int64_t depth = left->depth, second = TILE_ROWS * depth;
  const int64_t last_block = first_block + COLUMN_RUN < round_up(right->count, BLOCK) / BLOCK
                                 ? first_block + COLUMN_RUN
                                 : round_up(right->count, BLOCK) / BLOCK;
  _tile_loadconfig(&tile_config);
  int64_t done = 0;
  do { /* once at least, so that depth 0 writes zeros */
    const int64_t chunk = depth - done < DEPTH_CHUNK ? depth - done : DEPTH_CHUNK;
    for (int64_t row = 0; row < left->count; row += BLOCK) {
      const int rows = (int)(left->count - row < BLOCK ? left->count - row : BLOCK);
      for (int64_t block = first_block; block < last_block; ++block) {
        const int64_t column = block * BLOCK;
        const int columns = (int)(right->count - column < BLOCK ? right->count - column : BLOCK);
        block_product(left->tiles + row * depth + done * TILE_ROWS,
                      right->tiles + column * depth + done * TILE_ROWS, second,
                      chunk / TILE_DEPTH, rows, columns, accumulate || done > 0,
                      sums + row * stride + column, stride);
      }
    }
    done += chunk;
  } while (done < depth);
  _tile_release();
}

void lltm_amx_product(const lltm_amx_factor* left, const lltm_amx_factor* right, int accumulate,
                      float* sums, int64_t sums_stride) {
  const int64_t column_blocks = round_up(right->count, BLOCK) / BLOCK;
  /* A pointwise element's time is that of some thousand multiply-adds here. */
  LLTM_FOR_EACH(run, round_up(column_blocks, COLUMN_RUN) / COLUMN_RUN,
                left->count * right->count * left->depth / 1024, {
    column_run(left, right, run * COLUMN_RUN, accumulate, sums, sums_stride);
  });
}

#else

int lltm_amx_usable(void) { return 0; }

void lltm_amx_product(const lltm_amx_factor* left, const lltm_amx_factor* right, int accumulate,
                      float* sums, int64_t sums_stride) {
  (void)left, (void)right, (void)accumulate, (void)sums, (void)sums_stride;
}

#endif /* LLTM_AMX_COMPILED */

VECTOR_TARGET int lltm_amx_pack_left(int64_t rows, int64_t depth, const float* a,
                                     int64_t row_stride, int64_t depth_stride, int pieces,
                                     lltm_amx_factor* packed) {
  if (!make_room(rows, depth, pieces, packed)) return LLTM_ERROR_NO_MEMORY;
  const int64_t packed_depth = packed->depth;
  uint16_t* tiles = packed->tiles;
  int finite = 1;
  if (depth_stride == 1) {
    LLTM_FOR_EACH(row, round_up(rows, BLOCK), rows * packed_depth, {
      const float* source = row < rows ? a + row * row_stride : NULL;
      uint16_t* out =
          tiles + row / TILE_ROWS * TILE_ROWS * packed_depth + row % TILE_ROWS * TILE_DEPTH;
      const int row_finite = pieces == 1 ? pack_left_row(source, depth, 1, packed_depth, out)
                                         : pack_left_row(source, depth, 2, packed_depth, out);
      if (!row_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  } else {
    LLTM_FOR_EACH(group, round_up(rows, GROUP) / GROUP, rows * packed_depth, {
      const int group_finite =
          pieces == 1 ? pack_left_across(group * GROUP, rows, depth, a, depth_stride, 1,
                                         packed_depth, tiles)
                      : pack_left_across(group * GROUP, rows, depth, a, depth_stride, 2,
                                         packed_depth, tiles);
      if (!group_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  }
  packed->finite = finite;
  return LLTM_SUCCESS;
}

VECTOR_TARGET int lltm_amx_pack_right(int64_t depth, int64_t columns, const float* b,
                                      int64_t row_stride, int pieces,
                                      lltm_amx_factor* packed) {
  if (!make_room(columns, depth, pieces, packed)) return LLTM_ERROR_NO_MEMORY;
  const int64_t packed_depth = packed->depth;
  uint16_t* tiles = packed->tiles;
  int finite = 1;
  LLTM_FOR_EACH(group, round_up(columns, GROUP) / GROUP, columns * packed_depth, {
    const int group_finite =
        pieces == 1
            ? pack_right_group(group * GROUP, columns, depth, b, row_stride, 1, packed_depth, tiles)
            : pack_right_group(group * GROUP, columns, depth, b, row_stride, 2, packed_depth,
                               tiles);
    if (!group_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
  });
  packed->finite = finite;
  return LLTM_SUCCESS;
}

int lltm_amx_multiply(int64_t rows, int64_t columns, int64_t depth, const float* a,
                      int64_t a_row_stride, int64_t a_depth_stride, const float* b,
                      int64_t b_row_stride, int pieces, float* sums, int64_t sums_stride) {
  lltm_amx_factor left = {0}, right = {0};
  const int64_t block = PACKED_DEPTH_BLOCK / (pieces * pieces);
  int status = LLTM_SUCCESS;
  int64_t done = 0;
  do { /* once at least, so that depth 0 writes zeros */
    const int64_t part = depth - done < block ? depth - done : block;
    status = lltm_amx_pack_left(rows, part, a + done * a_depth_stride, a_row_stride,
                                a_depth_stride, pieces, &left);
    if (status == LLTM_SUCCESS) {
      status = lltm_amx_pack_right(part, columns, b + done * b_row_stride, b_row_stride, pieces,
                                   &right);
    }
    if (status == LLTM_SUCCESS && !(left.finite && right.finite)) status = LLTM_AMX_DECLINED;
    if (status == LLTM_SUCCESS) lltm_amx_product(&left, &right, done > 0, sums, sums_stride);
    done += part;
  } while (status == LLTM_SUCCESS && done < depth);
  lltm_amx_free(&left);
  lltm_amx_free(&right);
  return status;
}
