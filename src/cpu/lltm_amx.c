/* Matrix products on AMX's tiles (lltm_amx.h says what and when).
 *
 * Eight tile registers of 16 rows by 64 bytes: a block of 32 x 32 sums
 * holds four (tmm0 to tmm3), and each step of 32 of the packed depth loads
 * two tiles of the left factor (tmm4, tmm5: 16 rows by 32 bfloat16s each)
 * and two of the right (tmm6, tmm7: 16 pairs of depth places by 16
 * columns, each column's pair side by side), then takes four tile
 * products. Packing lays each factor out tile after tile, 1 KiB each, in
 * the order a block of sums reads them, padded with zeros to blocks of 32
 * rows or columns and to whole tiles of depth. */
#include "lltm_amx.h"

#include <stdlib.h>
#include <string.h>

#include "lltm_half.h"
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
#define VECTOR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#else
#define VECTOR_TARGET
#endif

#define TILE_ROWS 16
#define TILE_DEPTH 32     /* bfloat16s, 64 bytes */
#define TILE_ELEMENTS 512 /* TILE_ROWS * TILE_DEPTH */
#define BLOCK LLTM_AMX_BLOCK /* two tiles each way */

static int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

static int tiles_kind(void);
static int product_tiles(int dtype, int64_t rows);
enum { NO_TILES = -1, AMX_TILES = 1, DOT_TILES = 2 };

int lltm_cpu_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return 0;
#endif
}

/* A product's work for lltm_team_size: a pointwise element's time is that
 * of some thousand multiply-adds on AMX, which multiplies whole blocks of
 * rows, and of some 16 on AVX512-BF16, which multiplies the rows there
 * are. On 2 threads of the 2-core AMD EPYC (Zen 5), bfloat16 inference at
 * B=64, S=128 took 52 us a step counted as AMX's (one thread for the
 * steps), 32 so; at B=16, 14.3 counted as 32, 12.8 so. */
int64_t lltm_amx_work(int64_t rows, int64_t columns, const lltm_amx_factor* right) {
  if (product_tiles(right->dtype, rows) == DOT_TILES) {
    return rows * columns * right->packed_depth / 16;
  }
  return round_up(rows, BLOCK) * columns * right->packed_depth / 1024;
}

static int pieces_of(int dtype) { return dtype == LLTM_FLOAT16 ? 2 : 1; }

/* Sizes packed->tiles for `count` rows or columns over `depth`; 0 where
 * no memory could be had. */
static int make_room(int dtype, int64_t count, int64_t depth, lltm_amx_factor* packed) {
  const int pieces = pieces_of(dtype);
  packed->count = count;
  packed->depth = depth;
  packed->dtype = dtype;
  packed->finite = 1;
  packed->packed_depth = round_up(depth * pieces * pieces, TILE_DEPTH);
  const size_t needed = (size_t)(round_up(count, BLOCK) * packed->packed_depth);
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

/* The packed depth: a factor's element k takes places k pieces^2 to
 * (k + 1) pieces^2 - 1, the left factor's piece p at p pieces to p pieces
 * + pieces - 1, the right factor's piece q at every place q modulo pieces:
 * every pair of pieces meets once. A float16's pieces are its value's top
 * 16 bits as a float, and those of what is left, at most 3 significant
 * bits. Each loop below is written for a constant dtype (always inlined,
 * called once for each), and runs only where AMX does, on AVX-512. */
#define INLINE static inline __attribute__((always_inline)) VECTOR_TARGET

/* value's pieces (`valid` 0: padding, zeros); 0 where it is inf or NaN
 * (a float16's only). */
INLINE int split(int dtype, int valid, uint16_t value, uint16_t* piece) {
  value = valid ? value : 0;
  if (dtype == LLTM_BFLOAT16) {
    piece[0] = value;
    return 1;
  }
  uint32_t bits;
  const float whole = lltm_float16_to_float(value);
  memcpy(&bits, &whole, sizeof bits);
  piece[0] = (uint16_t)(bits >> 16);
  piece[1] = lltm_float_to_bfloat16(whole - lltm_bfloat16_to_float(piece[0]));
  return (value & 0x7c00u) != 0x7c00u;
}

/* The pieces of `count` (up to 16) float16s in a row, as split gives
 * them, in one word each: pairs[i] = the first | the second << 16. 0 where
 * one is inf or NaN. */
#ifdef LLTM_AMX_COMPILED
INLINE int float16_pairs(int count, const uint16_t* values, uint32_t* pairs) {
  const __mmask16 lanes = (__mmask16)((1u << count) - 1);
  const __m256i halves = _mm256_maskz_loadu_epi16(lanes, values);
  const __m512 whole = _mm512_cvtph_ps(halves);
  const __m512i top_half = _mm512_set1_epi32((int)0xffff0000u);
  const __m512i bits = _mm512_castps_si512(whole);
  const __m512 rest = _mm512_sub_ps(whole, _mm512_castsi512_ps(_mm512_and_si512(bits, top_half)));
  const __m512i pair = _mm512_or_si512(
      _mm512_srli_epi32(bits, 16), _mm512_and_si512(_mm512_castps_si512(rest), top_half));
  _mm512_mask_storeu_epi32(pairs, lanes, pair);
  const __m256i exponent = _mm256_set1_epi16(0x7c00);
  return !_mm256_mask_cmpeq_epi16_mask(lanes, _mm256_and_si256(halves, exponent), exponent);
}
#else
INLINE int float16_pairs(int count, const uint16_t* values, uint32_t* pairs) {
  int finite = 1;
  for (int i = 0; i < count; ++i) {
    uint16_t piece[2];
    finite &= split(LLTM_FLOAT16, 1, values[i], piece);
    pairs[i] = piece[0] | (uint32_t)piece[1] << 16;
  }
  return finite;
}
#endif

/* A left factor's four places of a float16 whose pieces are `pair`: the
 * first piece twice, then the second twice. */
INLINE void put_left_places(uint32_t pair, uint16_t* out) {
  const uint32_t words[2] = {(pair & 0xffffu) * 0x10001u, (pair >> 16) * 0x10001u};
  memcpy(out, words, sizeof words);
}

/* A row of the left factor along its depth (NULL: a row of padding), into
 * its tile rows (`out` the first, each next one TILE_ELEMENTS on). */
INLINE int pack_left_row(int dtype, const uint16_t* row, int64_t depth, int64_t packed_depth,
                         uint16_t* out) {
  const int pieces = pieces_of(dtype), spread = pieces * pieces;
  const int per_tile = TILE_DEPTH / spread;
  int finite = 1;
  for (int64_t first = 0; first * spread < packed_depth; first += per_tile) {
    if (!row) {
      memset(out, 0, 2 * TILE_DEPTH);
    } else if (first + per_tile <= depth) {
      if (dtype == LLTM_BFLOAT16) {
        memcpy(out, row + first, 2 * TILE_DEPTH);
      } else {
        uint32_t pairs[TILE_DEPTH / 4];
        finite &= float16_pairs(per_tile, row + first, pairs);
        for (int t = 0; t < per_tile; ++t) put_left_places(pairs[t], out + 4 * t);
      }
    } else {
      for (int t = 0; t < per_tile; ++t) {
        const int valid = first + t < depth;
        uint16_t piece[2];
        finite &= split(dtype, valid, valid ? row[first + t] : 0, piece);
        for (int p = 0; p < spread; ++p) out[t * spread + p] = piece[p / pieces];
      }
    }
    out += TILE_ELEMENTS;
  }
  return finite;
}

/* Up to GROUP rows of a left factor whose rows lie side by side (row
 * stride 1: a transposed one), from first_row on, a tile at a time: each
 * block of 16 rows reads 16 values at each k, the next block the rest of
 * the same cache lines. */
#define GROUP 128

INLINE int pack_left_across(int dtype, int64_t first_row, int64_t rows, int64_t depth,
                            const uint16_t* a, int64_t depth_stride, int64_t packed_depth,
                            uint16_t* tiles) {
  const int pieces = pieces_of(dtype), spread = pieces * pieces;
  const int per_tile = TILE_DEPTH / spread;
  const int64_t end = round_up(rows, BLOCK) - first_row < GROUP ? round_up(rows, BLOCK)
                                                                : first_row + GROUP;
  int finite = 1;
  for (int64_t e = 0; e < packed_depth; e += TILE_DEPTH) {
    const int64_t k = e / spread;
    for (int64_t block = first_row; block < end; block += TILE_ROWS) {
      uint16_t* tile = tiles + block * packed_depth + e / TILE_DEPTH * TILE_ELEMENTS;
      const int whole = block + TILE_ROWS <= rows && k + per_tile <= depth;
      if (block >= rows) {
        memset(tile, 0, 2 * TILE_ELEMENTS);
        continue;
      }
      for (int t = 0; t < per_tile; ++t) {
        const uint16_t* source = a + block + (k + t) * depth_stride;
        if (whole && dtype == LLTM_BFLOAT16) {
          for (int i = 0; i < TILE_ROWS; ++i) tile[i * TILE_DEPTH + t] = source[i];
        } else if (whole) {
          uint32_t pairs[TILE_ROWS];
          finite &= float16_pairs(TILE_ROWS, source, pairs);
          for (int i = 0; i < TILE_ROWS; ++i) {
            put_left_places(pairs[i], tile + i * TILE_DEPTH + t * spread);
          }
        } else {
          for (int i = 0; i < TILE_ROWS; ++i) {
            const int valid = block + i < rows && k + t < depth;
            uint16_t piece[2];
            finite &= split(dtype, valid, valid ? source[i] : 0, piece);
            for (int p = 0; p < spread; ++p) {
              tile[i * TILE_DEPTH + t * spread + p] = piece[p / pieces];
            }
          }
        }
      }
    }
  }
  return finite;
}

/* Places e and e + 1 of the packed depth of column j of a right factor's
 * tile rows `block` (its first TILE_ROWS columns' tiles). */
INLINE uint16_t* right_pair(uint16_t* block, int64_t e, int j) {
  return block + e / TILE_DEPTH * TILE_ELEMENTS + e % TILE_DEPTH / 2 * TILE_DEPTH + 2 * j;
}

/* Up to GROUP columns of a right factor whose rows run along its columns
 * (column stride 1), from `first` on: each k reads them in one run. A tile
 * row holds a pair of places: rows k and k + 1 of b where each value is
 * one piece, else both pieces of row k (and the tile row after, the same
 * again). */
INLINE int pack_right_rows(int dtype, int64_t first, int64_t columns, int64_t depth,
                           const uint16_t* b, int64_t row_stride, int64_t packed_depth,
                           uint16_t* tiles) {
  const int pieces = pieces_of(dtype), rows_a_pair = pieces == 1 ? 2 : 1;
  const int64_t end = round_up(columns, BLOCK) - first < GROUP ? round_up(columns, BLOCK)
                                                               : first + GROUP;
  int finite = 1;
  for (int64_t e = 0; e < packed_depth; e += 2 * pieces) {
    const int64_t k = e / (pieces * pieces);
    for (int64_t block = first; block < end; block += TILE_ROWS) {
      uint16_t* out = right_pair(tiles + block * packed_depth, e, 0);
      const uint16_t* row = b + k * row_stride + block;
      if (block >= columns) {
        memset(out, 0, 2 * TILE_DEPTH * pieces);
        continue;
      }
      if (block + TILE_ROWS <= columns && k + rows_a_pair <= depth) {
        if (dtype == LLTM_BFLOAT16) {
          for (int j = 0; j < TILE_ROWS; ++j) {
            out[2 * j] = row[j];
            out[2 * j + 1] = row[row_stride + j];
          }
        } else {
          uint32_t pairs[TILE_ROWS];
          finite &= float16_pairs(TILE_ROWS, row, pairs);
          memcpy(out, pairs, sizeof pairs);
        }
      } else {
        for (int j = 0; j < TILE_ROWS; ++j) {
          for (int h = 0; h < rows_a_pair; ++h) {
            const int valid = block + j < columns && k + h < depth;
            uint16_t piece[2];
            finite &= split(dtype, valid, valid ? row[h * row_stride + j] : 0, piece);
            for (int p = 0; p < pieces; ++p) out[2 * j + h + p] = piece[p];
          }
        }
      }
      if (pieces == 2) memcpy(out + TILE_DEPTH, out, 2 * TILE_DEPTH);
    }
  }
  return finite;
}

#ifdef LLTM_AMX_COMPILED
/* A bfloat16 tile of a right factor from its 16 columns' 32 values each
 * (`column_stride` apart): in the tile, row p holds pair p of every column,
 * a transpose of 16 x 16 pairs. Pair by pair, packing the weights took
 * about as long as a pass's products at a batch of 1 and a state of 128. */
INLINE void transpose_pairs(const uint16_t* columns, int64_t column_stride, uint16_t* tile) {
  __m512i r[16], t[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(columns + j * column_stride);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int c = 0; c < 4; ++c) {
      t[8 * i + c] = _mm512_shuffle_i32x4(r[8 * i + c], r[8 * i + 4 + c], 0x88);
      t[8 * i + 4 + c] = _mm512_shuffle_i32x4(r[8 * i + c], r[8 * i + 4 + c], 0xdd);
    }
  }
  for (int c = 0; c < 8; ++c) {
    _mm512_storeu_si512(tile + c * TILE_DEPTH, _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88));
    _mm512_storeu_si512(tile + (8 + c) * TILE_DEPTH, _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd));
  }
}
#endif

/* A block of TILE_ROWS columns of a right factor whose columns run along
 * its depth (row stride 1: a transposed one), from `first` on, a tile at a
 * time: each column is read along its depth. */
INLINE int pack_right_columns(int dtype, int64_t first, int64_t columns, int64_t depth,
                              const uint16_t* b, int64_t column_stride, int64_t packed_depth,
                              uint16_t* block) {
  const int pieces = pieces_of(dtype), spread = pieces * pieces;
  const int per_tile = TILE_DEPTH / spread;
  int finite = 1;
  for (int64_t e = 0; e < packed_depth; e += TILE_DEPTH) {
    uint16_t* tile = block + e / TILE_DEPTH * TILE_ELEMENTS;
    const int64_t k = e / spread;
    if (first >= columns) {
      memset(tile, 0, 2 * TILE_ELEMENTS);
      continue;
    }
#ifdef LLTM_AMX_COMPILED
    if (dtype == LLTM_BFLOAT16 && first + TILE_ROWS <= columns && k + per_tile <= depth) {
      transpose_pairs(b + first * column_stride + k, column_stride, tile);
      continue;
    }
#endif
    for (int j = 0; j < TILE_ROWS; ++j) {
      const uint16_t* column = b + (first + j) * column_stride + k;
      if (first + j < columns && k + per_tile <= depth) {
        if (dtype == LLTM_BFLOAT16) {
          for (int t = 0; t < per_tile; t += 2) memcpy(tile + t / 2 * TILE_DEPTH + 2 * j, column + t, 4);
        } else {
          uint32_t pairs[TILE_DEPTH / 4];
          finite &= float16_pairs(per_tile, column, pairs);
          for (int t = 0; t < per_tile; ++t) {
            memcpy(tile + 2 * t * TILE_DEPTH + 2 * j, &pairs[t], 4);
            memcpy(tile + (2 * t + 1) * TILE_DEPTH + 2 * j, &pairs[t], 4);
          }
        }
        continue;
      }
      for (int t = 0; t < per_tile; ++t) {
        const int valid = first + j < columns && k + t < depth;
        uint16_t piece[2];
        finite &= split(dtype, valid, valid ? column[t] : 0, piece);
        if (pieces == 1) {
          tile[t / 2 * TILE_DEPTH + 2 * j + t % 2] = piece[0];
        } else {
          for (int r = 0; r < 2; ++r) {
            tile[(2 * t + r) * TILE_DEPTH + 2 * j] = piece[0];
            tile[(2 * t + r) * TILE_DEPTH + 2 * j + 1] = piece[1];
          }
        }
      }
    }
  }
  return finite;
}

/* function(dtype, ...) with the dtype a constant in each call, so that the
 * inlined packer's branches on it fold away. */
#define PACK_BY_DTYPE(dtype, function, ...)                  \
  ((dtype) == LLTM_BFLOAT16 ? function(LLTM_BFLOAT16, __VA_ARGS__) \
                            : function(LLTM_FLOAT16, __VA_ARGS__))

/* The left factor (see lltm_amx_multiply) into *packed, by as many
 * threads as the product's `work` takes (lltm_amx_work): a team larger than
 * the product's leaves the rows it packed in other cores' caches for the
 * product's tile loads, and a recurrent step of a small state is a product
 * on one thread. H200 machine's host, 16 threads, bfloat16, T=16, time
 * over nn.LSTM's in one process (medians of three turns) with the packing
 * sized by its own elements and now: B=64 S=128 inference 2.04 and 1.90,
 * training 1.28 and 1.16; B=16 S=256 training 0.84 and 0.77. */
VECTOR_TARGET static int pack_left(int dtype, int64_t rows, int64_t depth, const uint16_t* a,
                                   int64_t row_stride, int64_t depth_stride, int64_t work,
                                   lltm_amx_factor* packed) {
  if (!make_room(dtype, rows, depth, packed)) return LLTM_ERROR_NO_MEMORY;
  const int64_t packed_depth = packed->packed_depth;
  uint16_t* tiles = packed->tiles;
  int finite = 1;
  if (depth_stride == 1) {
    LLTM_FOR_EACH(row, round_up(rows, BLOCK), work, {
      const uint16_t* source = row < rows ? a + row * row_stride : NULL;
      uint16_t* out =
          tiles + row / TILE_ROWS * TILE_ROWS * packed_depth + row % TILE_ROWS * TILE_DEPTH;
      const int row_finite =
          PACK_BY_DTYPE(dtype, pack_left_row, source, depth, packed_depth, out);
      if (!row_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  } else {
    LLTM_FOR_EACH(group, round_up(round_up(rows, BLOCK), GROUP) / GROUP, work, {
      const int group_finite = PACK_BY_DTYPE(dtype, pack_left_across, group * GROUP, rows,
                                             depth, a, depth_stride, packed_depth, tiles);
      if (!group_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  }
  packed->finite = finite;
  return LLTM_SUCCESS;
}

VECTOR_TARGET int lltm_amx_pack_right(int dtype, int64_t depth, int64_t columns,
                                      const uint16_t* b, int64_t row_stride,
                                      int64_t column_stride, lltm_amx_factor* packed) {
  if (row_stride != 1 && column_stride != 1) return LLTM_ERROR_ARGUMENTS;
  if (!make_room(dtype, columns, depth, packed)) return LLTM_ERROR_NO_MEMORY;
  const int64_t packed_depth = packed->packed_depth;
  uint16_t* tiles = packed->tiles;
  int finite = 1;
  if (column_stride == 1) {
    LLTM_FOR_EACH(group, round_up(round_up(columns, BLOCK), GROUP) / GROUP,
                  columns * packed_depth, {
      const int group_finite = PACK_BY_DTYPE(dtype, pack_right_rows, group * GROUP, columns,
                                             depth, b, row_stride, packed_depth, tiles);
      if (!group_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  } else {
    LLTM_FOR_EACH(block, round_up(columns, BLOCK) / TILE_ROWS, columns * packed_depth, {
      uint16_t* out = tiles + block * TILE_ROWS * packed_depth;
      const int block_finite = PACK_BY_DTYPE(dtype, pack_right_columns, block * TILE_ROWS,
                                             columns, depth, b, column_stride, packed_depth, out);
      if (!block_finite) __atomic_store_n(&finite, 0, __ATOMIC_RELAXED);
    });
  }
  packed->finite = finite;
  return LLTM_SUCCESS;
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
  if (!lltm_cpu_avx512()) return 0;
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

/* AVX512-BF16's dot products (Intel's Cooper Lake and later, AMD's Zen 4
 * and later), on AVX-512. */
static int dot_permitted(void) {
  return lltm_cpu_avx512() && __builtin_cpu_supports("avx512bf16");
}

/* What the CPU has, asked once: ASKED, and AMX_TILES and DOT_TILES where
 * it has them. */
enum { ASKED = 4 };
static int tiles_offered(void) {
  static int state; /* 0: not asked yet */
  int offered = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (!offered) {
    offered = ASKED | (amx_permitted() ? AMX_TILES : 0) | (dot_permitted() ? DOT_TILES : 0);
    __atomic_store_n(&state, offered, __ATOMIC_RELEASE);
  }
  return offered;
}

static int tiles_kind(void) {
  const int offered = tiles_offered();
  return offered & AMX_TILES ? AMX_TILES : offered & DOT_TILES ? DOT_TILES : NO_TILES;
}

/* A bfloat16 product of one row takes the dot products where the CPU has
 * them beside AMX and LLTM_DOT_ROW_TEAM threads or more share it: AMX
 * multiplies whole tiles of 16 rows, the dot products the rows there are.
 * The H200 machine's host (a Xeon with AMX), bfloat16 inference at B=1,
 * T=16, us a step on AMX and on the dot products, one process: 4 threads,
 * S=512 34.3 and 31.2, S=1024 120.6 and 100.7; 16 threads, S=512 24.5 and
 * 21.7, S=1024 50.5 and 44.5 (training 231.7 and 208.6); but 1 thread,
 * S=512 71.4 and 83.2, 2 threads, S=256 18.4 and 21.8. At S=128 the two
 * tie on every number of threads, and on 4 threads at S=256 AMX is ahead
 * (16.0 against 19.7; on 8 and 16 the two tie). */
#define LLTM_DOT_ROW_TEAM 4
static int product_tiles(int dtype, int64_t rows) {
  const int offered = tiles_offered();
  if (offered & AMX_TILES && offered & DOT_TILES && dtype == LLTM_BFLOAT16 && rows == 1 &&
      lltm_pass_team() >= LLTM_DOT_ROW_TEAM) {
    return DOT_TILES;
  }
  return tiles_kind();
}

int lltm_amx_usable(void) { return tiles_kind() > 0; }
int lltm_amx_tiles(void) { return tiles_kind() == AMX_TILES; }

/* Palette 1, all eight tiles 16 rows of 64 bytes. Static and constant:
 * ldtilecfg's asm tells gcc of only its first 8 bytes, so a configuration
 * built on the stack could lose its other stores. */
static const struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) tile_config = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* One block of sums, row_tiles x 16 rows (1 or 2, a constant where
 * inlined) by 32 columns, at out (row stride out_stride), over
 * depth_blocks of the packed depth from left and right on: the two tile
 * rows of each factor lie `second` elements apart. The tiles configured. */
static inline __attribute__((always_inline)) AMX_TARGET void tile_rows_product(
    int row_tiles, const uint16_t* left, const uint16_t* right, int64_t second,
    int64_t depth_blocks, int accumulate, float* out, int64_t out_stride) {
  MEMORY_BARRIER();
  const int64_t bytes = 4 * out_stride;
  if (accumulate) {
    _tile_loadd(0, out, bytes);
    _tile_loadd(1, out + 16, bytes);
    if (row_tiles == 2) {
      _tile_loadd(2, out + 16 * out_stride, bytes);
      _tile_loadd(3, out + 16 * out_stride + 16, bytes);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if (row_tiles == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (int64_t d = 0; d < depth_blocks; ++d) {
    _tile_loadd(4, left + d * TILE_ELEMENTS, 64);
    _tile_loadd(6, right + d * TILE_ELEMENTS, 64);
    _tile_loadd(7, right + second + d * TILE_ELEMENTS, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (row_tiles == 2) {
      _tile_loadd(5, left + second + d * TILE_ELEMENTS, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, bytes);
  _tile_stored(1, out + 16, bytes);
  if (row_tiles == 2) {
    _tile_stored(2, out + 16 * out_stride, bytes);
    _tile_stored(3, out + 16 * out_stride + 16, bytes);
  }
  MEMORY_BARRIER();
}

/* A block of up to 16 rows takes the tiles of its first 16 alone: a step
 * of a batch of 16 or fewer would otherwise multiply as many rows of
 * padding. On the H200 machine's Xeon, bfloat16, T=16, us a step, all
 * 32 rows against 16 (two processes of each, taking turns): inference at
 * B=16, one thread, S=512 212.7 against 195.9, S=1024 929.2 against
 * 824.1; 16 threads, S=512 60.4 against 45.8, S=1024 140.8 against 112.4;
 * training on 16 threads, S=512 236.8 against 179.8; inference at B=1 on
 * one thread (AMX's, LLTM_DOT_ROW_TEAM), S=128 16.9 against 9.9. */
AMX_TARGET static void block_product(const uint16_t* left, const uint16_t* right, int64_t second,
                                     int64_t depth_blocks, int rows, int accumulate, float* out,
                                     int64_t out_stride) {
  if (rows <= TILE_ROWS) {
    tile_rows_product(1, left, right, second, depth_blocks, accumulate, out, out_stride);
  } else {
    tile_rows_product(2, left, right, second, depth_blocks, accumulate, out, out_stride);
  }
}

/* block_product on AVX512-BF16 instead of the tiles: the same packed
 * factors, a tile row of the right factor (a pair of depth places of 16
 * columns) one vector, a pair of a left row's places one 32-bit word
 * broadcast, and vdpbf16ps adding both products to each column's sum. A
 * block's sums go up to DOT_ROWS rows by 32 columns at a time, 16 vectors
 * of the 32; rows past the block's own (padding) only as far as a group
 * of 1, 2, 4 or 8 reaches, so that a step of one row takes one row's work. */
#define DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define DOT_ROWS 8

/* `count` rows (a constant where inlined) from `left` (TILE_DEPTH apart
 * within a tile) by 32 columns, at out (row stride out_stride). */
static inline __attribute__((always_inline)) DOT_TARGET void dot_rows(
    int count, const uint16_t* left, const uint16_t* right, int64_t second,
    int64_t depth_blocks, int accumulate, float* out, int64_t out_stride) {
  __m512 low[DOT_ROWS], high[DOT_ROWS];
  for (int i = 0; i < count; ++i) {
    low[i] = accumulate ? _mm512_loadu_ps(out + i * out_stride) : _mm512_setzero_ps();
    high[i] = accumulate ? _mm512_loadu_ps(out + i * out_stride + 16) : _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < depth_blocks; ++d) {
    const uint16_t* tile_left = left + d * TILE_ELEMENTS;
    const uint16_t* tile_low = right + d * TILE_ELEMENTS;
    const uint16_t* tile_high = right + second + d * TILE_ELEMENTS;
    for (int pair = 0; pair < TILE_ROWS; ++pair) {
      const __m512bh b_low = (__m512bh)_mm512_loadu_si512(tile_low + pair * 2 * TILE_ROWS);
      const __m512bh b_high = (__m512bh)_mm512_loadu_si512(tile_high + pair * 2 * TILE_ROWS);
      for (int i = 0; i < count; ++i) {
        int32_t word;
        memcpy(&word, tile_left + i * TILE_DEPTH + 2 * pair, sizeof word);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(word);
        low[i] = _mm512_dpbf16_ps(low[i], a, b_low);
        high[i] = _mm512_dpbf16_ps(high[i], a, b_high);
      }
    }
  }
  for (int i = 0; i < count; ++i) {
    _mm512_storeu_ps(out + i * out_stride, low[i]);
    _mm512_storeu_ps(out + i * out_stride + 16, high[i]);
  }
}

DOT_TARGET static void dot_block_product(const uint16_t* left, const uint16_t* right,
                                         int64_t second, int64_t depth_blocks, int rows,
                                         int accumulate, float* out, int64_t out_stride) {
  for (int first = 0; first < rows; first += DOT_ROWS) {
    /* In the left factor's first tile row, or its second, `second` on. */
    const uint16_t* group =
        left + (first / TILE_ROWS) * second + (first % TILE_ROWS) * TILE_DEPTH;
    float* group_out = out + first * out_stride;
    const int count = rows - first;
    if (count >= 5) {
      dot_rows(DOT_ROWS, group, right, second, depth_blocks, accumulate, group_out, out_stride);
    } else if (count >= 3) {
      dot_rows(4, group, right, second, depth_blocks, accumulate, group_out, out_stride);
    } else if (count == 2) {
      dot_rows(2, group, right, second, depth_blocks, accumulate, group_out, out_stride);
    } else {
      dot_rows(1, group, right, second, depth_blocks, accumulate, group_out, out_stride);
    }
  }
}

/* A block of sums (rows x columns of it inside the result) at sums (row
 * stride `stride`), by block_product on AMX or dot_block_product; a block
 * past the result's edge goes through memory of its own. */
static void block_sums(int amx, const uint16_t* left, const uint16_t* right, int64_t second,
                       int64_t depth_blocks, int rows, int columns, int accumulate, float* sums,
                       int64_t stride) {
  float edge[BLOCK * BLOCK] __attribute__((aligned(64)));
  const int inside = (rows == BLOCK || (amx && rows == TILE_ROWS)) && columns == BLOCK;
  float* out = inside ? sums : edge;
  const int64_t out_stride = inside ? stride : BLOCK;
  if (!inside && accumulate) {
    memset(edge, 0, sizeof edge);
    for (int i = 0; i < rows; ++i) memcpy(edge + i * BLOCK, sums + i * stride, 4 * columns);
  }
  if (amx) {
    block_product(left, right, second, depth_blocks, rows, accumulate, out, out_stride);
  } else {
    dot_block_product(left, right, second, depth_blocks, rows, accumulate, out, out_stride);
  }
  if (!inside) {
    for (int i = 0; i < rows; ++i) memcpy(sums + i * stride, edge + i * BLOCK, 4 * columns);
  }
}

/* A thread's share goes in runs of up to ROW_RUN blocks of rows by
 * COLUMN_RUN of columns, the packed depth DEPTH_CHUNK at a time: a block's
 * left tiles stay in L1 across the run's columns, the run's left and right
 * tiles in L2 across its rows and columns. Of the runs tried (4 to 16 by 2
 * to 8 blocks, chunks of 256 and 512), these ran fastest. */
#define ROW_RUN 8
#define COLUMN_RUN 4
#define DEPTH_CHUNK 512

static int64_t run_end(int64_t first, int64_t run, int64_t count) {
  return first + run < count ? first + run : count;
}

/* The sums of rows first_row to end_row by columns first_column to
 * end_column, on the calling thread, then `then` (may be NULL) for them.
 * The configuration is loaded once for the run, and the tiles released
 * after it, as the kernel expects of a thread done with them.
 * Where `then` takes the sums and the depth is one chunk, a block of rows
 * is done once its columns are: its sums go to a strip of this thread's
 * stack, handed to `then` at once, and the product's sums are never
 * written. A recurrent pass's input part of the gates (256 rows a block)
 * otherwise wrote, then read, a block's sums in float (768 KiB at a state
 * of 256), pushing the recurrent weights out of L2 between steps. On the
 * H200 machine's Xeon, one thread: a step's product of 64 rows at a state
 * of 256 took 18.2 us alone, 37.5 us with 3 MB of other memory written
 * between steps; bfloat16, T=16, two processes of each taking turns, time
 * over nn.LSTM's with the strip against without, inference at states 128
 * to 512 and batches 16 and 64 0.89 to 0.95 (B=64, S=128: 1.29 and 1.33
 * against 1.48 and 1.48), training 0.89 to 1.03; 16 threads 0.86 to 1.05. */
AMX_TARGET static void block_run(const lltm_amx_factor* left, const lltm_amx_factor* right,
                                 int64_t first_row, int64_t end_row, int64_t first_column,
                                 int64_t end_column, float* sums, int64_t stride,
                                 lltm_amx_then then, void* context) {
  const int64_t depth = left->packed_depth, second = TILE_ROWS * depth;
  const int64_t width = end_column - first_column;
  const int amx = product_tiles(left->dtype, left->count) == AMX_TILES;
  float strip[BLOCK * COLUMN_RUN * BLOCK] __attribute__((aligned(64)));
  const int by_strip = then && depth <= DEPTH_CHUNK && width <= COLUMN_RUN * BLOCK;
  if (amx) _tile_loadconfig(&tile_config);
  int64_t done = 0;
  do { /* once at least, so that depth 0 writes zeros */
    const int64_t chunk = depth - done < DEPTH_CHUNK ? depth - done : DEPTH_CHUNK;
    for (int64_t row = first_row; row < end_row; row += BLOCK) {
      const int rows = (int)(left->count - row < BLOCK ? left->count - row : BLOCK);
      float* out = by_strip ? strip : sums + row * stride + first_column;
      const int64_t out_stride = by_strip ? width : stride;
      for (int64_t column = first_column; column < end_column; column += BLOCK) {
        const int columns = (int)(right->count - column < BLOCK ? right->count - column : BLOCK);
        block_sums(amx, left->tiles + row * depth + done * TILE_ROWS,
                   right->tiles + column * depth + done * TILE_ROWS, second, chunk / TILE_DEPTH,
                   rows, columns, done > 0, out + (column - first_column), out_stride);
      }
      if (by_strip) then(context, strip, width, row, rows, first_column, width);
    }
    done += chunk;
  } while (done < depth);
  if (amx) _tile_release();
  if (then && !by_strip) {
    then(context, sums + first_row * stride + first_column, stride, first_row,
         end_row - first_row, first_column, width);
  }
}

/* Runs of up to ROW_RUN blocks of rows by COLUMN_RUN blocks of columns, so
 * that `then` takes rows of that many columns. Where the rows are one run
 * and a team shares it, a run is one block of rows where that gives every
 * thread a run, else the rows by one block of columns, so that a step's
 * product of a few rows (a recurrence's, batch by weights) still splits
 * over every thread; its left tiles stay in L2 whatever the run. On the
 * H200 machine's Xeon, bfloat16, T=16, in one process, the two taking
 * turns, us a step: one thread's inference at B=64 S=128 86.0 against
 * 95.0 with runs of one block of columns (0.86 to 0.94 of the time at
 * states 128 to 512), training 0.93 and 0.96; two threads' at B=64 S=128
 * (whose input products take one) 63.5 against 73.2. A team's runs of a
 * block of rows against all the rows by a block of columns: 16 threads'
 * inference at B=64, S=128 46.5 against 52.4, S=256 60.7 against 69.7;
 * 0.87 to 0.99 of the time on 2, 4 and 16 threads at states 128 to 512,
 * training too, but for two threads' training at B=64, S=512 (1196
 * against 1071). */
static void product(const lltm_amx_factor* left, const lltm_amx_factor* right, float* sums,
                    int64_t stride, int64_t work, lltm_amx_then then, void* context) {
  const int team = lltm_team_size(work);
  const int64_t row_blocks = round_up(left->count, BLOCK) / BLOCK;
  int64_t row_run = ROW_RUN * BLOCK, column_run = COLUMN_RUN * BLOCK;
  if (team > 1 && row_blocks <= ROW_RUN) {
    if (row_blocks * (round_up(right->count, column_run) / column_run) >= team) {
      row_run = BLOCK;
    } else {
      column_run = BLOCK;
    }
  }
  const int64_t row_runs = round_up(left->count, row_run) / row_run;
  const int64_t column_runs = round_up(right->count, column_run) / column_run;
  LLTM_FOR_EACH_OF_TEAM(run, row_runs * column_runs, team, {
    const int64_t first_row = run / column_runs * row_run;
    const int64_t first_column = run % column_runs * column_run;
    block_run(left, right, first_row, run_end(first_row, row_run, left->count), first_column,
              run_end(first_column, column_run, right->count), sums, stride, then, context);
  });
}

int lltm_amx_then_takes_every_run(const lltm_amx_factor* right) {
  return right->packed_depth <= DEPTH_CHUNK; /* block_run's by_strip */
}

void lltm_amx_block_sums(const lltm_amx_factor* left, const lltm_amx_factor* right,
                         int64_t first_row, int64_t rows, int64_t first_column, int64_t columns,
                         float* sums, int64_t stride) {
  for (int64_t row = first_row; row < first_row + rows; row += ROW_RUN * BLOCK) {
    block_run(left, right, row, run_end(row, ROW_RUN * BLOCK, first_row + rows), first_column,
              first_column + columns, sums, stride, NULL, NULL);
  }
}

#else

static int tiles_kind(void) { return NO_TILES; }
static int product_tiles(int dtype, int64_t rows) { return (void)dtype, (void)rows, NO_TILES; }
int lltm_amx_usable(void) { return 0; }
int lltm_amx_tiles(void) { return 0; }

int lltm_amx_then_takes_every_run(const lltm_amx_factor* right) { return (void)right, 0; }

static void product(const lltm_amx_factor* left, const lltm_amx_factor* right, float* sums,
                    int64_t stride, int64_t work, lltm_amx_then then, void* context) {
  (void)left, (void)right, (void)sums, (void)stride, (void)work, (void)then, (void)context;
}

void lltm_amx_block_sums(const lltm_amx_factor* left, const lltm_amx_factor* right,
                         int64_t first_row, int64_t rows, int64_t first_column, int64_t columns,
                         float* sums, int64_t stride) {
  (void)left, (void)right, (void)first_row, (void)rows, (void)first_column, (void)columns;
  (void)sums, (void)stride;
}

#endif /* LLTM_AMX_COMPILED */

const char* lltm_amx_tiles_name(int dtype, int64_t rows) {
  return product_tiles(dtype, rows) == AMX_TILES ? "amx" : "avx512-bf16";
}

int lltm_amx_pack_left(int64_t rows, const uint16_t* a, int64_t row_stride,
                       int64_t depth_stride, const lltm_amx_factor* right, int64_t work,
                       lltm_amx_factor* left) {
  if (row_stride != 1 && depth_stride != 1) return LLTM_ERROR_ARGUMENTS;
  if (!right->finite) return LLTM_AMX_DECLINED;
  const int status =
      pack_left(right->dtype, rows, right->depth, a, row_stride, depth_stride, work, left);
  if (status != LLTM_SUCCESS) return status;
  return left->finite ? LLTM_SUCCESS : LLTM_AMX_DECLINED;
}

int lltm_amx_reserve_left(int64_t rows, const lltm_amx_factor* right, lltm_amx_factor* left) {
  return make_room(right->dtype, rows, right->depth, left) ? LLTM_SUCCESS : LLTM_ERROR_NO_MEMORY;
}

int lltm_amx_multiply(int64_t rows, const uint16_t* a, int64_t row_stride, int64_t depth_stride,
                      const lltm_amx_factor* right, lltm_amx_factor* left, float* sums,
                      int64_t sums_stride, lltm_amx_then then, void* context) {
  /* One team for the packing and the product (pack_left). */
  const int64_t work = lltm_amx_work(rows, right->count, right);
  const int status = lltm_amx_pack_left(rows, a, row_stride, depth_stride, right, work, left);
  if (status != LLTM_SUCCESS) return status;
  product(left, right, sums, sums_stride, work, then, context);
  return LLTM_SUCCESS;
}
