// LD_PRELOAD malloc tracker: current and peak bytes of live heap blocks (malloc_usable_size),
// counting only blocks of at least MIN bytes (tensors, not Python objects). Reset/read via ctypes.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stddef.h>
#include <errno.h>
static void *(*real_malloc)(size_t); static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t); static void *(*real_realloc)(void *, size_t);
static void *(*real_calloc)(size_t, size_t); static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static long long cur = 0, peak = 0; static const size_t MIN = 65536;
static __thread int inside = 0;
static char cbuf[65536]; static size_t coff;
static void init(void) {
  if (real_malloc) return;
  real_malloc = dlsym(RTLD_NEXT, "malloc"); real_free = dlsym(RTLD_NEXT, "free");
  real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign"); real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_calloc = dlsym(RTLD_NEXT, "calloc"); real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  real_memalign = dlsym(RTLD_NEXT, "memalign");
}
static void add(void *p) { if (p) { size_t n = malloc_usable_size(p); if (n >= MIN) { __atomic_add_fetch(&cur, n, __ATOMIC_RELAXED); long long c = cur; if (c > peak) peak = c; } } }
static void sub(void *p) { if (p) { size_t n = malloc_usable_size(p); if (n >= MIN) __atomic_sub_fetch(&cur, n, __ATOMIC_RELAXED); } }
void *malloc(size_t n) { init(); void *p = real_malloc(n); add(p); return p; }
void free(void *p) { if ((char*)p >= cbuf && (char*)p < cbuf + sizeof cbuf) return; init(); sub(p); real_free(p); }
void *calloc(size_t a, size_t b) { if (!real_calloc) { char *buf = cbuf; size_t off = coff; void *p = buf + off; coff = off + ((a*b + 15) & ~15); return p; } void *p = real_calloc(a, b); add(p); return p; }
void *realloc(void *q, size_t n) { init(); sub(q); void *p = real_realloc(q, n); add(p); return p; }
int posix_memalign(void **out, size_t al, size_t n) { init(); int r = real_posix_memalign(out, al, n); if (!r) add(*out); return r; }
void *aligned_alloc(size_t al, size_t n) { init(); void *p = real_aligned_alloc(al, n); add(p); return p; }
void *memalign(size_t al, size_t n) { init(); void *p = real_memalign(al, n); add(p); return p; }
long long peak_current(void) { return cur; }
long long peak_peak(void) { return peak; }
void peak_reset(void) { peak = cur; }
