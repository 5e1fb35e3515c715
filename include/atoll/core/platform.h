// Process-level platform set-up done once by the `atoll` launcher before any BLAS is loaded.
//
// OpenBLAS picks its kernels when the library loads; on this virtual CPU it misdetects the core
// (≈2.5× slower) unless OPENBLAS_CORETYPE is in the environment before the process starts. The
// launcher therefore chooses a core type from the CPU flags when the variable is absent (a value
// that is already present is never overridden) and re-executes itself once with it set.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace atl {

// The OpenBLAS core type for a /proc/cpuinfo "flags" line: "SkylakeX" with avx512f+avx512bw,
// "Haswell" with avx2+fma, "" (let OpenBLAS decide) otherwise.
std::string OpenblasCoretypeForFlags(std::string_view cpu_flags);

// Whether a /proc/cpuinfo "flags" line has bf16 matrix hardware (amx_bf16 or avx512_bf16), on
// which bf16 matrix products through oneDNN are several times faster than fp32 ones.
bool FlagsHaveFastBf16(std::string_view cpu_flags);

// Reads the flags of the first CPU from /proc/cpuinfo ("" if unavailable).
std::string ReadCpuFlags();

// If OPENBLAS_CORETYPE is unset and a core type can be chosen, sets it and re-executes the
// current binary with the same argv (never returns on success). Also sets OMP_NUM_THREADS=1 when
// unset (atoll sets torch's thread count explicitly) and, when GLIBC_TUNABLES is unset,
// glibc.malloc.hugetlb=1 (malloc's heap on transparent huge pages: far fewer page faults in a
// training step; a user's own GLIBC_TUNABLES is left as it is). Returns normally when nothing needs doing
// or re-exec is impossible. Marker variable ATOLL_LAUNCHED prevents loops.
void EnsureBlasEnvironmentOrReexec(int argc, char** argv);

// Keeps freed memory in the process instead of returning it to the kernel: glibc serves blocks
// above its mmap threshold (at most 32 MiB, usually far less) with fresh mmaps and trims the heap
// on free, so every training step's activations and gradients were new pages the kernel had to
// fault in and zero (≈ 20 % of a learner's CPU in perf). Sets M_MMAP_THRESHOLD and
// M_TRIM_THRESHOLD to 1 GiB unless MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ are in the
// environment (glibc reads those itself; a value there wins). Returns whether it changed anything.
bool KeepFreedMemory();

// Every thread allocates from glibc's main heap (M_ARENA_MAX = 1) unless MALLOC_ARENA_MAX is in the
// environment. A thread other than the main one gets its own arena, whose heaps are at most 64 MiB:
// larger blocks are fresh mmaps unmapped on free whatever the thresholds above say. The syncer's
// live evaluation of the global model runs on its own thread, and each evaluation faulted in its
// forward pass's tensors anew (≈ 800 page faults a second over a run, 9 % of the syncer's CPU).
// Only for processes whose threads allocate little concurrently: a learner's exchange thread
// beside its training thread made early steps 2x slower when they shared one arena. Call before
// starting threads. Returns whether it changed anything.
bool OneHeapForAllThreads();

// Seconds since this process was created (fork; exec does not reset it), from the process's
// start time in /proc/self/stat and the system uptime in `proc_uptime` (/proc/uptime's text):
// 10 ms resolution. Nullopt where /proc is missing or unreadable.
std::optional<double> ProcessAgeSeconds();
// The parsing behind it, for tests: the text of /proc/<pid>/stat and /proc/uptime, and the
// clock ticks per second. Nullopt on malformed input.
std::optional<double> ProcessAgeFrom(std::string_view proc_stat, std::string_view proc_uptime, long ticks_per_second);

}  // namespace atl
