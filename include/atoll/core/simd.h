// Function multiversioning for the few hot loops that touch every value of a round (codecs,
// merges): GCC on x86-64 compiles them for AVX-512, AVX2 and the baseline, and the loader picks
// the best the CPU has (ifunc). The binary stays portable; elsewhere the macro is empty. Under
// ThreadSanitizer it is empty too: the loader runs ifunc resolvers while it relocates, before the
// TSan runtime is initialised, and an instrumented resolver crashes the process at start.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define ATOLL_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATOLL_SIMD_CLONES
#endif
