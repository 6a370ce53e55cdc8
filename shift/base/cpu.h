/*
 * The spin-wait hint of the CPU SHIFT is built for: PAUSE on x86-64,
 * YIELD on arm64 (both tell the core a spin loop is waiting on another).
 */
#ifndef SHIFT_BASE_CPU_H
#define SHIFT_BASE_CPU_H

static inline void shift_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#else
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
#endif
}

#endif /* SHIFT_BASE_CPU_H */
