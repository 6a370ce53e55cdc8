/*
 * A plugin-style module for scope_loader: linked against libibverbs.so.1
 * like any application module (NEEDED, no RUNPATH), it hands out the address
 * its own reference to a verb resolved to.
 */
#include <infiniband/verbs.h>

void *scope_mod_ref(void);

void *scope_mod_ref(void)
{
	return (void *)&ibv_alloc_pd;
}
