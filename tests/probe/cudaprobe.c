/* cudaprobe: what a CUDA program sees of the driver, without the CUDA toolkit.
 *
 * Built by the tests with the host's gcc (tests/helpers/realdriver.py: build_probe) and run
 * inside containers. It dlopen()s "libcuda.so.1" by SONAME, as the CUDA runtime does, so
 * the container's loader (its ld.so.cache, its default directories) decides which file is
 * loaded. Output, one line:
 *
 *   libcuda=<path the loader mapped> cuDriverGetVersion=<rc> version=<int> cuInit=<rc>
 *
 * With --alloc (real GPU only): after cuInit, device 0's primary context is retained and
 * made current, 1 MiB is allocated and freed; the line goes on with
 * " devices=<n> cuMemAlloc=<rc> cuMemFree=<rc>".
 * Every other argument is a SONAME the image ships: one more line each,
 *   dlopen <soname> ok <path>      or      dlopen <soname> failed: <dlerror()>
 *
 * Exit status: 0 when every dlopen succeeded, 2 when libcuda.so.1 did not load (the line
 * then reads "dlopen libcuda.so.1 failed: <dlerror()>" and nothing else is tried), 3 when
 * an image library did not load. CUDA error codes are printed, never turned into the exit
 * status: the tests compare them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

typedef int (*get_version_fn)(int *);
typedef int (*init_fn)(unsigned int);
typedef int (*device_count_fn)(int *);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_retain_fn)(void **, int);
typedef int (*ctx_set_fn)(void *);
typedef int (*mem_alloc_fn)(unsigned long long *, size_t);
typedef int (*mem_free_fn)(unsigned long long);

/* The file the loader mapped for a dlopen() handle ("?" when it cannot say). */
static const char *mapped_path(void *handle)
{
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL || map->l_name == NULL)
        return "?";
    return map->l_name;
}

static void *symbol(void *handle, const char *name)
{
    void *sym = dlsym(handle, name);
    if (sym == NULL)
        printf(" missing-symbol=%s", name);
    return sym;
}

/* The --alloc part: device 0, its primary context, one allocation. */
static void allocate(void *cuda)
{
    device_count_fn count = (device_count_fn)symbol(cuda, "cuDeviceGetCount");
    device_get_fn get = (device_get_fn)symbol(cuda, "cuDeviceGet");
    ctx_retain_fn retain = (ctx_retain_fn)symbol(cuda, "cuDevicePrimaryCtxRetain");
    ctx_set_fn set_current = (ctx_set_fn)symbol(cuda, "cuCtxSetCurrent");
    /* cuda.h maps cuMemAlloc/cuMemFree to their _v2 symbols (64-bit device pointers) */
    mem_alloc_fn alloc = (mem_alloc_fn)symbol(cuda, "cuMemAlloc_v2");
    mem_free_fn release = (mem_free_fn)symbol(cuda, "cuMemFree_v2");
    if (!count || !get || !retain || !set_current || !alloc || !release)
        return;
    int devices = -1, device = -1;
    void *ctx = NULL;
    unsigned long long ptr = 0;
    int rc = count(&devices);
    printf(" devices=%d", rc == 0 ? devices : -rc);
    if (rc != 0 || devices < 1)
        return;
    if ((rc = get(&device, 0)) != 0) {
        printf(" cuDeviceGet=%d", rc);
        return;
    }
    if ((rc = retain(&ctx, device)) != 0) {
        printf(" cuDevicePrimaryCtxRetain=%d", rc);
        return;
    }
    if ((rc = set_current(ctx)) != 0) {
        printf(" cuCtxSetCurrent=%d", rc);
        return;
    }
    rc = alloc(&ptr, 1 << 20);
    printf(" cuMemAlloc=%d", rc);
    if (rc == 0)
        printf(" cuMemFree=%d", release(ptr));
}

int main(int argc, char **argv)
{
    int want_alloc = 0, status = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--alloc") == 0)
            want_alloc = 1;

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == NULL) {
        printf("dlopen libcuda.so.1 failed: %s\n", dlerror());
        return 2;
    }
    printf("libcuda=%s", mapped_path(cuda));
    get_version_fn get_version = (get_version_fn)symbol(cuda, "cuDriverGetVersion");
    init_fn init = (init_fn)symbol(cuda, "cuInit");
    if (get_version != NULL) {
        int version = 0;
        int rc = get_version(&version);
        printf(" cuDriverGetVersion=%d version=%d", rc, version);
    }
    if (init != NULL) {
        int rc = init(0);
        printf(" cuInit=%d", rc);
        if (rc == 0 && want_alloc)
            allocate(cuda);
    }
    printf("\n");

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--alloc") == 0)
            continue;
        void *lib = dlopen(argv[i], RTLD_NOW);
        if (lib == NULL) {
            printf("dlopen %s failed: %s\n", argv[i], dlerror());
            status = 3;
        } else {
            printf("dlopen %s ok %s\n", argv[i], mapped_path(lib));
        }
    }
    fflush(stdout);
    return status;
}
