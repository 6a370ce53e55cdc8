/* SHIFT's pages touched ahead of a failover (shift/base/prefault.h). */
#include "shift/base/prefault.h"

#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

struct prefault {
	uintptr_t self; /* an address inside the object */
	size_t page;
	size_t pages;
	bool found;
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

/* (its reads are of whole pages, not of C objects: a sanitizer's redzones
 * between globals, or a global another thread writes meanwhile, are read
 * too, harmlessly, and must not be reported) */
__attribute__((no_sanitize_address, no_sanitize_thread))
static int touch_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct prefault *pf = arg;
	unsigned sum = 0;

	(void)size;
	if (!holds(info, pf->self))
		return 0;
	pf->found = true;
	for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *p = &info->dlpi_phdr[i];

		/* (the file-backed part only: touching .bss would allocate it) */
		if (p->p_type != PT_LOAD || !p->p_filesz)
			continue;
		uintptr_t lo = (info->dlpi_addr + p->p_vaddr) & ~(uintptr_t)(pf->page - 1);
		uintptr_t hi = info->dlpi_addr + p->p_vaddr + p->p_filesz;

		for (uintptr_t a = lo; a < hi; a += pf->page) {
			sum += *(const volatile unsigned char *)a;
			pf->pages++;
		}
	}
	__asm__ volatile("" : : "r"(sum)); /* (the reads are the point) */
	return 1;
}

size_t shift_prefault_object(const void *addr)
{
	long page = sysconf(_SC_PAGESIZE);
	struct prefault pf = {
		.self = (uintptr_t)addr,
		.page = page > 0 ? (size_t)page : 4096,
	};

	dl_iterate_phdr(touch_object, &pf);
	return pf.found ? pf.pages : 0;
}

size_t shift_prefault_self(void)
{
	return shift_prefault_object((const void *)(uintptr_t)&shift_prefault_self);
}
