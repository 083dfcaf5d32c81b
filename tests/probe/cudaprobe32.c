/* cudaprobe32: the 32-bit (i386) side of cudaprobe.c, for compat32 containers.
 *
 * Built by the tests with the host's gcc -m32 (tests/helpers/realdriver32.py:
 * build_probe32) WITHOUT a 32-bit C development set (gcc-multilib is not needed): no
 * header is included, the few libc functions are declared here, there is no crt1.o
 * (the entry point is _start itself), and the program links against the libc.so.6 of
 * Debian's libc6:i386 package. It dlopen()s "libcuda.so.1" by SONAME, so the container's
 * 32-bit loader (/lib/ld-linux.so.2, its ld.so.cache's i386 entries) decides which file is
 * loaded. Output, one line, as cudaprobe's first:
 *
 *   libcuda=<path the loader mapped> cuDriverGetVersion=<rc> version=<int> cuInit=<rc>
 *
 * or "dlopen libcuda.so.1 failed: <dlerror()>" and exit status 2. Run it only inside a
 * container: as root, cuInit may create /dev/nvidia* nodes where they are missing.
 */
void *dlopen(const char *file, int mode);
void *dlsym(void *handle, const char *name);
char *dlerror(void);
int dlinfo(void *handle, int request, void *arg);
int printf(const char *format, ...);
void exit(int status) __attribute__((noreturn));

#define RTLD_NOW 2
#define RTLD_DI_LINKMAP 2

/* The leading fields of glibc's struct link_map (<link.h>). */
struct link_map_head {
    unsigned long l_addr;
    const char *l_name;
};

typedef int (*get_version_fn)(int *);
typedef int (*init_fn)(unsigned int);

/* The kernel enters _start with the stack 16-byte aligned and no return address:
 * force_align_arg_pointer gives the compiled code the alignment it assumes. */
__attribute__((force_align_arg_pointer, noreturn)) void _start(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == 0) {
        printf("dlopen libcuda.so.1 failed: %s\n", dlerror());
        exit(2);
    }
    struct link_map_head *map = 0;
    const char *path = "?";
    if (dlinfo(cuda, RTLD_DI_LINKMAP, &map) == 0 && map != 0 && map->l_name != 0)
        path = map->l_name;
    get_version_fn get_version = (get_version_fn)dlsym(cuda, "cuDriverGetVersion");
    init_fn init = (init_fn)dlsym(cuda, "cuInit");
    int version = -1;
    int rc_version = get_version ? get_version(&version) : -1;
    int rc_init = init ? init(0) : -1;
    printf("libcuda=%s cuDriverGetVersion=%d version=%d cuInit=%d\n", path, rc_version,
           version, rc_init);
    exit(0);
}
