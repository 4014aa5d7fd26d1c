// LD_PRELOAD shim: logs every cuTensorMapEncodeTiled call (however the caller resolves it: the
// exported symbol, dlsym, or cuGetProcAddress), then calls the driver's.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int (*encode_fn)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*, const unsigned*, int, int, int, int);
typedef int (*gpa2_fn)(const char*, void**, int, uint64_t, void*);
typedef int (*gpa1_fn)(const char*, void**, int, uint64_t);
typedef void* (*dlsym_fn)(void*, const char*);

static encode_fn real_encode;
static gpa2_fn real_gpa2;
static gpa1_fn real_gpa1;
static dlsym_fn real_dlsym_p;

static void* real_dlsym(void* h, const char* s) {
  if (!real_dlsym_p) real_dlsym_p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym_p) real_dlsym_p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return real_dlsym_p(h, s);
}

static int log_encode(void* map, int dtype, unsigned rank, void* addr, const uint64_t* dims, const uint64_t* strides,
                      const unsigned* box, const unsigned* estr, int interleave, int swizzle, int l2promo, int oob) {
  FILE* f = fopen("/tmp/tmaplog.txt", "a");
  if (f) {
    fprintf(f, "encode dtype=%d rank=%u addr=%p dims=", dtype, rank, addr);
    for (unsigned i = 0; i < rank; ++i) fprintf(f, "%llu%s", (unsigned long long)dims[i], i + 1 < rank ? "," : "");
    fprintf(f, " strides=");
    for (unsigned i = 0; i + 1 < rank; ++i) fprintf(f, "%llu%s", (unsigned long long)strides[i], i + 2 < rank ? "," : "");
    fprintf(f, " box=");
    for (unsigned i = 0; i < rank; ++i) fprintf(f, "%u%s", box[i], i + 1 < rank ? "," : "");
    fprintf(f, " estr=");
    for (unsigned i = 0; i < rank; ++i) fprintf(f, "%u%s", estr[i], i + 1 < rank ? "," : "");
    fprintf(f, " interleave=%d swizzle=%d l2promo=%d oob=%d\n", interleave, swizzle, l2promo, oob);
    fclose(f);
  }
  return real_encode(map, dtype, rank, addr, dims, strides, box, estr, interleave, swizzle, l2promo, oob);
}

static void* wrap(const char* s, void* p) {
  if (p && strcmp(s, "cuTensorMapEncodeTiled") == 0) {
    real_encode = (encode_fn)p;
    return (void*)log_encode;
  }
  return p;
}

static int my_gpa2(const char* s, void** pfn, int v, uint64_t fl, void* st) {
  int r = real_gpa2(s, pfn, v, fl, st);
  if (r == 0 && pfn) *pfn = wrap(s, *pfn);
  return r;
}
static int my_gpa1(const char* s, void** pfn, int v, uint64_t fl) {
  int r = real_gpa1(s, pfn, v, fl);
  if (r == 0 && pfn) *pfn = wrap(s, *pfn);
  return r;
}

void* dlsym(void* h, const char* s) {
  void* p = real_dlsym(h, s);
  if (!p || !s) return p;
  if (strcmp(s, "cuGetProcAddress_v2") == 0) { real_gpa2 = (gpa2_fn)p; return (void*)my_gpa2; }
  if (strcmp(s, "cuGetProcAddress") == 0) { real_gpa1 = (gpa1_fn)p; return (void*)my_gpa1; }
  return wrap(s, p);
}

int cuGetProcAddress_v2(const char* s, void** pfn, int v, uint64_t fl, void* st) {
  if (!real_gpa2) real_gpa2 = (gpa2_fn)real_dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
  return my_gpa2(s, pfn, v, fl, st);
}
int cuGetProcAddress(const char* s, void** pfn, int v, uint64_t fl) {
  if (!real_gpa1) real_gpa1 = (gpa1_fn)real_dlsym(RTLD_NEXT, "cuGetProcAddress");
  return my_gpa1(s, pfn, v, fl);
}
