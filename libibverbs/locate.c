/*
 * Finding the real libibverbs at run time (docs/dropin.md, "Finding the real
 * library").
 *
 * Order: SHIFT_REAL_LIBIBVERBS (an absolute path; no fallback when it is set,
 * except when it names SHIFT itself); then <libdir>/shift/real/libibverbs.so.1,
 * where the system-wide package moves the distro's library, and the same
 * under each system library directory below (a drop-in built with another
 * prefix on a host with the package); then the path
 * found at build time; then libibverbs.so.1 in the multiarch directories,
 * /usr/lib64, /lib64, /usr/lib, /lib. ld.so.cache is not parsed: its format
 * is glibc-private, and every distro puts libibverbs in one of those
 * directories.
 *
 * A candidate is skipped when it is this very file (same device and inode
 * as the drop-in, found with dladdr), when it is not an ELF shared object of
 * this process's class and machine, and when, once opened, it lacks
 * ibv_get_device_list@IBVERBS_1.1.
 */
#include "libibverbs/dropin.h"
#include "shift/base/log.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHIFT_REAL_LIBIBVERBS_DEFAULT
#error "the build must define SHIFT_REAL_LIBIBVERBS_DEFAULT"
#endif
#ifndef SHIFT_LIBDIR
#define SHIFT_LIBDIR "/usr/lib"
#endif
#ifndef SHIFT_MULTIARCH
#define SHIFT_MULTIARCH ""
#endif

#if defined(__x86_64__)
#define SHIFT_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define SHIFT_ELF_MACHINE EM_AARCH64
#else
#error "unsupported architecture: add its ELF machine here"
#endif

#if __SIZEOF_POINTER__ == 8
#define SHIFT_ELF_CLASS ELFCLASS64
#else
#define SHIFT_ELF_CLASS ELFCLASS32
#endif

/* Same file as the drop-in itself (device and inode of the mapped file). */
static int is_dropin_file(const char *path)
{
	Dl_info ours;
	struct stat a, b;

	if (!dladdr((void *)shift_dropin_init, &ours) || !ours.dli_fname ||
	    stat(ours.dli_fname, &a) || stat(path, &b))
		return 0;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* 0 if path is an ELF shared object this process can load, else a reason. */
static const char *elf_check(const char *path)
{
	unsigned char h[EI_NIDENT + 4];
	uint16_t type, machine;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return errno == ENOENT ? "no such file" : strerror(errno);
	n = read(fd, h, sizeof(h));
	close(fd);
	if (n != (ssize_t)sizeof(h) || memcmp(h, ELFMAG, SELFMAG))
		return "not an ELF file";
	if (h[EI_CLASS] != SHIFT_ELF_CLASS)
		return "wrong ELF class (32/64-bit)";
	if (h[EI_DATA] != ELFDATA2LSB)
		return "wrong byte order";
	memcpy(&type, h + EI_NIDENT, sizeof(type));
	memcpy(&machine, h + EI_NIDENT + 2, sizeof(machine));
	if (type != ET_DYN)
		return "not a shared object";
	if (machine != SHIFT_ELF_MACHINE)
		return "built for another machine";
	return NULL;
}

/* Open one candidate; NULL with the reason in why (static storage). */
static void *try_open(const char *path, const char **why)
{
	static char dlmsg[512];
	void *h;
	const char *e;

	if (is_dropin_file(path)) {
		*why = "it is SHIFT's own drop-in";
		return NULL;
	}
	e = elf_check(path);
	if (e) {
		*why = e;
		return NULL;
	}
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *d = dlerror();

		snprintf(dlmsg, sizeof(dlmsg), "%s", d ? d : "dlopen failed");
		*why = dlmsg;
		return NULL;
	}
	if (!dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1")) {
		dlclose(h);
		*why = "no ibv_get_device_list@IBVERBS_1.1 (not a libibverbs)";
		return NULL;
	}
	return h;
}

static void *try_search(const char *path, char *out, size_t cap, const char **why)
{
	void *h = try_open(path, why);

	if (h)
		snprintf(out, cap, "%s", path);
	else
		shift_debug("real libibverbs candidate %s skipped: %s", path, *why);
	return h;
}

static const char *const sys_dirs[] = {
	"/usr/lib/" SHIFT_MULTIARCH, "/lib/" SHIFT_MULTIARCH,
	"/usr/lib64", "/lib64", "/usr/lib", "/lib",
};

/* leaf ("libibverbs.so.1" or "shift/real/libibverbs.so.1") in each system
 * library directory, in order. */
static void *search_dirs(const char *leaf, char *out, size_t cap, const char **why)
{
	char path[SHIFT_REAL_PATH_MAX];
	void *h = NULL;

	for (size_t i = 0; !h && i < sizeof(sys_dirs) / sizeof(sys_dirs[0]); i++) {
		size_t l = strlen(sys_dirs[i]);

		if (sys_dirs[i][l - 1] == '/')
			continue; /* no multiarch triplet compiled in */
		snprintf(path, sizeof(path), "%s/%s", sys_dirs[i], leaf);
		h = try_search(path, out, cap, why);
	}
	return h;
}

void *shift_real_open(const char *override, char *out, size_t cap, const char **why)
{
	void *h;

	if (override && *override) {
		snprintf(out, cap, "%s", override);
		if (override[0] != '/') {
			*why = "SHIFT_REAL_LIBIBVERBS must be an absolute path";
			return NULL;
		}
		h = try_open(override, why);
		if (h || !is_dropin_file(override))
			return h;
		shift_err("SHIFT_REAL_LIBIBVERBS=%s is SHIFT itself; searching instead", override);
	}
	/* the system-wide package's diverted library: this build's libdir,
	 * then the system's (a drop-in built with another prefix) */
	h = try_search(SHIFT_LIBDIR "/shift/real/libibverbs.so.1", out, cap, why);
	if (!h)
		h = search_dirs("shift/real/libibverbs.so.1", out, cap, why);
	if (!h && SHIFT_REAL_LIBIBVERBS_DEFAULT[0])
		h = try_search(SHIFT_REAL_LIBIBVERBS_DEFAULT, out, cap, why);
	if (!h)
		h = search_dirs("libibverbs.so.1", out, cap, why);
	if (!h) {
		snprintf(out, cap, "libibverbs.so.1");
		*why = "not found in SHIFT_REAL_LIBIBVERBS, " SHIFT_LIBDIR
		       "/shift/real, the build-time path or the system library directories";
	}
	return h;
}
