/* SHIFT's pages touched ahead of a failover (shift/base/prefault.h). */
#include "shift/base/prefault.h"

#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* (Linux 5.14; older kernels say EINVAL) */
#endif

enum { PREFAULT_SEGS = 16 };

/* The readable, file-backed ranges of one object, page-aligned: found
 * under the loader's lock (dl_iterate_phdr), populated after it, so that
 * neither a fork (whose child would inherit the lock held) nor the
 * application's dlopen waits for the population. */
struct prefault {
	uintptr_t self; /* an address inside the object */
	uintptr_t page;
	unsigned n; /* (0: no object holds self) */
	uintptr_t lo[PREFAULT_SEGS], hi[PREFAULT_SEGS];
};

static bool holds(const struct dl_phdr_info *info, uintptr_t a)
{
	for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *p = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + p->p_vaddr;

		if (p->p_type == PT_LOAD && a >= lo && a - lo < p->p_memsz)
			return true;
	}
	return false;
}

static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct prefault *pf = arg;

	(void)size;
	if (!holds(info, pf->self))
		return 0;
	for (ElfW(Half) i = 0; i < info->dlpi_phnum && pf->n < PREFAULT_SEGS; i++) {
		const ElfW(Phdr) *p = &info->dlpi_phdr[i];

		/* (the file-backed part only: populating .bss would allocate
		 * it; an execute-only segment cannot be read) */
		if (p->p_type != PT_LOAD || !p->p_filesz || !(p->p_flags & PF_R))
			continue;
		uintptr_t start = info->dlpi_addr + p->p_vaddr;

		pf->lo[pf->n] = start & ~(pf->page - 1);
		pf->hi[pf->n] = (start + p->p_filesz + pf->page - 1) & ~(pf->page - 1);
		pf->n++;
	}
	return 1;
}

size_t shift_prefault_object(const void *addr)
{
	long page = sysconf(_SC_PAGESIZE);
	struct prefault pf = {
		.self = (uintptr_t)addr,
		.page = page > 0 ? (uintptr_t)page : 4096,
	};
	size_t pages = 0;

	dl_iterate_phdr(find_object, &pf);
	/* MADV_POPULATE_READ faults the pages in as reads would, but a page
	 * beyond the end of a file truncated since it was mapped is an error
	 * here, not a SIGBUS (so also no plain reads where the kernel lacks
	 * it: nothing is touched then) */
	for (unsigned i = 0; i < pf.n; i++)
		if (!madvise((void *)pf.lo[i], pf.hi[i] - pf.lo[i], MADV_POPULATE_READ))
			pages += (pf.hi[i] - pf.lo[i]) / pf.page;
	return pages;
}

size_t shift_prefault_self(void)
{
	return shift_prefault_object((const void *)(uintptr_t)&shift_prefault_self);
}
