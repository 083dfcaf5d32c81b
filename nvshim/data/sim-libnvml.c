/* libnvidia-ml.so.1 of a simulated node (nvshim sim): NVML's C ABI answering from the
 * node's model, so that pynvml, NVIDIA's go-nvml/go-nvlib (nvidia-ctk, the device plugin)
 * and nvshim's own NVML path run where no GPU is. Compiled by nvshim/sim/libnvml.py with
 * the machine's C compiler; never shipped prebuilt.
 *
 * The model is the text file nvshim-sim-nvml.txt at the node's root, found from this
 * library's own path (<root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*), written by the
 * simulator from the same records as the device nodes, procfs and nvml-facts.json:
 *   driver <version>
 *   cuda <version as NVML's int, 12020>
 *   gpu <index> <minor> <uuid> <pci bus id> <arch> <brand> <cc major> <cc minor> <mig mode>
 *       <memory MiB> <name>
 *   mig <gpu index> <gpu instance> <compute instance> <uuid> <profile> <GI slices>
 *       <CI slices> <memory MiB>
 * (arch and brand as NVML's nvmlDeviceArchitecture_t and nvmlBrandType_t numbers). A MIG
 * device's handle is also its GPU instance's (the first of that instance) and its compute
 * instance's: nvmlGpuInstance_t and nvmlComputeInstance_t point into the same table.
 * Read at nvmlInit; a node without it (the library mounted into a container) answers
 * NVML_ERROR_DRIVER_NOT_LOADED, as NVML without a driver does. What the model does not
 * have is NVML_ERROR_NOT_SUPPORTED; every call checks its handles and pointers and answers
 * NVML's codes, never crashes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 1024
#define MAX_MIGS 64 /* per GPU */
#define TEXT 96

typedef struct sim_device {
    unsigned magic;          /* SIM_MAGIC: a handle of ours */
    int is_mig;
    unsigned index, minor;   /* a MIG device: its parent's */
    unsigned arch, brand, mig_mode;
    int cc_major, cc_minor;
    unsigned gi, ci, gi_slices, ci_slices;
    unsigned long long memory_mib;
    char uuid[TEXT], bus[TEXT], name[TEXT], profile[TEXT];
    struct sim_device *parent;
    struct sim_device *migs;
    unsigned n_migs;
} sim_device;

typedef sim_device *nvmlDevice_t;
typedef sim_device *nvmlGpuInstance_t;
typedef sim_device *nvmlComputeInstance_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
typedef struct { unsigned int start, size; } nvmlPlacement_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define SIM_MAGIC 0x4e56534dU

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refs;
static sim_device *gpus;
static unsigned n_gpus;
static char driver[TEXT];
static int cuda;

static void copy(char *to, const char *from) {
    snprintf(to, TEXT, "%s", from);
}

/* The model's path: this library's own, its last four components replaced. */
static int model_path(char *out, size_t size) {
    Dl_info info;
    if (!dladdr((void *)model_path, &info) || !info.dli_fname) return -1;
    char here[4096];
    snprintf(here, sizeof here, "%s", info.dli_fname);
    for (int i = 0; i < 4; i++) {
        char *slash = strrchr(here, '/');
        if (!slash) return -1;
        *slash = '\0';
    }
    return snprintf(out, size, "%s/nvshim-sim-nvml.txt", here) < (int)size ? 0 : -1;
}

static void forget(void) {
    for (unsigned i = 0; i < n_gpus; i++) free(gpus[i].migs);
    free(gpus);
    gpus = NULL;
    n_gpus = 0;
}

static nvmlReturn_t load(void) {
    char path[4200], line[1024];
    if (model_path(path, sizeof path)) return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "re");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    gpus = calloc(MAX_GPUS, sizeof *gpus);
    if (!gpus) { fclose(f); return NVML_ERROR_UNKNOWN; }
    nvmlReturn_t ret = NVML_SUCCESS;
    while (ret == NVML_SUCCESS && fgets(line, sizeof line, f)) {
        char a[TEXT], b[TEXT];
        unsigned i, minor, mig, gi, ci, arch, brand, gs, cs;
        unsigned long long mib;
        int major, low, used = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "driver %95s", a) == 1) {
            copy(driver, a);
        } else if (sscanf(line, "cuda %d", &cuda) == 1) {
        } else if (sscanf(line, "gpu %u %u %95s %95s %u %u %d %d %u %llu %n", &i, &minor, a,
                          b, &arch, &brand, &major, &low, &mig, &mib, &used) == 10 && used) {
            if (i != n_gpus || n_gpus == MAX_GPUS) { ret = NVML_ERROR_UNKNOWN; break; }
            sim_device *g = &gpus[n_gpus++];
            g->magic = SIM_MAGIC;
            g->index = i;
            g->minor = minor;
            copy(g->uuid, a);
            copy(g->bus, b);
            g->arch = arch;
            g->brand = brand;
            g->cc_major = major;
            g->cc_minor = low;
            g->mig_mode = mig;
            g->memory_mib = mib;
            copy(g->name, line + used);
        } else if (sscanf(line, "mig %u %u %u %95s %95s %u %u %llu", &i, &gi, &ci, a, b, &gs,
                          &cs, &mib) == 8) {
            if (i >= n_gpus) { ret = NVML_ERROR_UNKNOWN; break; }
            sim_device *g = &gpus[i];
            if (!g->migs && !(g->migs = calloc(MAX_MIGS, sizeof *g->migs))) {
                ret = NVML_ERROR_UNKNOWN;
                break;
            }
            if (g->n_migs == MAX_MIGS) { ret = NVML_ERROR_UNKNOWN; break; }
            sim_device *m = &g->migs[g->n_migs++];
            *m = *g;
            m->migs = NULL;
            m->n_migs = 0;
            m->is_mig = 1;
            m->parent = g;
            m->gi = gi;
            m->ci = ci;
            m->gi_slices = gs;
            m->ci_slices = cs;
            m->memory_mib = mib;
            copy(m->uuid, a);
            copy(m->profile, b);
            snprintf(m->name, TEXT, "%.60s MIG %.30s", g->name, b);
        } else if (line[0] != '\0' && line[0] != '#') {
            ret = NVML_ERROR_UNKNOWN;
        }
    }
    fclose(f);
    if (ret != NVML_SUCCESS) forget();
    return ret;
}

#define API __attribute__((visibility("default")))  /* all else: -fvisibility=hidden */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = load();
    if (ret == NVML_SUCCESS) refs++;
    pthread_mutex_unlock(&lock);
    return ret;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = NVML_ERROR_UNINITIALIZED;
    else if (--refs == 0) forget();
    pthread_mutex_unlock(&lock);
    return ret;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    default: return "Unknown Error";
    }
}

#define READY() do { if (refs == 0) return NVML_ERROR_UNINITIALIZED; } while (0)

/* Whether d is one of our handles (a GPU's or a MIG device's), without reading through a
 * pointer that is not. */
static int ours(nvmlDevice_t d) {
    if (!d || !gpus) return 0;
    if (d >= gpus && d < gpus + n_gpus) return ((char *)d - (char *)gpus) % sizeof *d == 0;
    for (unsigned i = 0; i < n_gpus; i++)
        if (gpus[i].migs && d >= gpus[i].migs && d < gpus[i].migs + gpus[i].n_migs)
            return ((char *)d - (char *)gpus[i].migs) % sizeof *d == 0;
    return 0;
}

#define DEVICE(d) do { READY(); if (!ours(d)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

static nvmlReturn_t text(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    READY();
    return text(version, length, driver);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    READY();
    char v[TEXT * 2];
    snprintf(v, sizeof v, "%d.%s", cuda / 1000, driver);
    return text(version, length, v);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    READY();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    READY();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = n_gpus;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    READY();
    if (!device || index >= n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    READY();
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n_gpus; i++) {
        if (strcasecmp(gpus[i].uuid, uuid) == 0) { *device = &gpus[i]; return NVML_SUCCESS; }
        for (unsigned j = 0; j < gpus[i].n_migs; j++)
            if (strcasecmp(gpus[i].migs[j].uuid, uuid) == 0) {
                *device = &gpus[i].migs[j];
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *device) {
    READY();
    if (!bus || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n_gpus; i++) {
        /* "0000:18:00.0" or the legacy "00000000:18:00.0" */
        size_t a = strlen(gpus[i].bus), b = strlen(bus);
        const char *tail = b >= a ? bus + b - a : NULL;
        if (tail && strcasecmp(tail, gpus[i].bus) == 0) { *device = &gpus[i]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus, device);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    DEVICE(d);
    return text(uuid, length, d->uuid);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    DEVICE(d);
    return text(name, length, d->name);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    DEVICE(d);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    DEVICE(d);
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *minor = d->minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    DEVICE(d);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(d->bus, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) return NVML_ERROR_UNKNOWN;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus,
             dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x10de; /* vendor NVIDIA in the low half; no device id modelled */
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(d, pci);
}
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(d, pci);
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    DEVICE(d);
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    *brand = (int)d->brand;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) {
    DEVICE(d);
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->arch == 0) return NVML_ERROR_NOT_SUPPORTED;
    *arch = d->arch;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    DEVICE(d);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current,
                                      unsigned int *pending) {
    DEVICE(d);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = d->mig_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    DEVICE(d);
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = (unsigned)d->is_mig;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    DEVICE(d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *count = d->mig_mode ? (d->n_migs > 7 ? d->n_migs : 7) : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index,
                                                     nvmlDevice_t *mig) {
    DEVICE(d);
    if (!mig || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= d->n_migs) return NVML_ERROR_NOT_FOUND;
    *mig = &d->migs[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                              nvmlDevice_t *device) {
    DEVICE(mig);
    if (!device || !mig->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *device = mig->parent;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    DEVICE(d);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    DEVICE(d);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->ci;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    DEVICE(d);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->memory_mib == 0) return NVML_ERROR_NOT_SUPPORTED;
    memory->total = memory->free = d->memory_mib << 20;
    memory->used = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    DEVICE(d);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->memory_mib == 0) return NVML_ERROR_NOT_SUPPORTED;
    memory->total = memory->free = d->memory_mib << 20;
    memory->reserved = memory->used = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *attrs) {
    DEVICE(d);
    if (!attrs) return NVML_ERROR_INVALID_ARGUMENT;
    memset(attrs, 0, sizeof *attrs);
    attrs->gpuInstanceSliceCount = d->is_mig ? d->gi_slices : 0;
    attrs->computeInstanceSliceCount = d->is_mig ? d->ci_slices : 0;
    attrs->memorySizeMB = d->memory_mib;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *attrs) {
    return nvmlDeviceGetAttributes_v2(d, attrs);
}

/* NVML's profile ids of the slice counts (GPU and compute instances number them alike). */
static int profile_id(unsigned slices) {
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    case 8: return 5;
    case 6: return 6;
    default: return -1;
    }
}

static sim_device *first_of_gi(sim_device *gpu, unsigned gi) {
    for (unsigned i = 0; i < gpu->n_migs; i++)
        if (gpu->migs[i].gi == gi) return &gpu->migs[i];
    return NULL;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id,
                                              nvmlGpuInstance_t *gi) {
    DEVICE(d);
    if (!gi || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    sim_device *found = first_of_gi(d, id);
    if (!found) return NVML_ERROR_NOT_FOUND;
    *gi = found;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    DEVICE(gi);
    if (!info || !gi->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = gi->parent;
    info->id = gi->gi;
    info->profileId = (unsigned)profile_id(gi->gi_slices);
    info->placement.size = gi->gi_slices;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                       nvmlComputeInstance_t *ci) {
    DEVICE(gi);
    if (!ci || !gi->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    sim_device *gpu = gi->parent;
    for (unsigned i = 0; i < gpu->n_migs; i++)
        if (gpu->migs[i].gi == gi->gi && gpu->migs[i].ci == id) {
            *ci = &gpu->migs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci,
                                               nvmlComputeInstanceInfo_t *info) {
    DEVICE(ci);
    if (!info || !ci->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = ci->parent;
    info->gpuInstance = first_of_gi(ci->parent, ci->gi);
    info->id = ci->ci;
    info->profileId = (unsigned)profile_id(ci->ci_slices);
    info->placement.size = ci->ci_slices;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci,
                                            nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(ci, info);
}

/* The profiles the model's instances use; any other is NVML_ERROR_NOT_SUPPORTED. */
API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info) {
    DEVICE(d);
    if (!info || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < d->n_migs; i++) {
        sim_device *m = &d->migs[i];
        if (profile_id(m->gi_slices) != (int)profile) continue;
        memset(info, 0, sizeof *info);
        info->id = profile;
        info->sliceCount = m->gi_slices;
        info->instanceCount = m->gi_slices ? 7 / m->gi_slices : 0;
        info->memorySizeMB = m->memory_mib;
        return NVML_SUCCESS;
    }
    return profile < 32 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
        nvmlGpuInstance_t gi, unsigned int profile, unsigned int engine,
        nvmlComputeInstanceProfileInfo_t *info) {
    DEVICE(gi);
    if (!info || !gi->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (engine != 0) return NVML_ERROR_NOT_SUPPORTED;
    sim_device *gpu = gi->parent;
    for (unsigned i = 0; i < gpu->n_migs; i++) {
        sim_device *m = &gpu->migs[i];
        if (m->gi != gi->gi || profile_id(m->ci_slices) != (int)profile) continue;
        memset(info, 0, sizeof *info);
        info->id = profile;
        info->sliceCount = m->ci_slices;
        info->instanceCount = m->ci_slices ? gi->gi_slices / m->ci_slices : 0;
        return NVML_SUCCESS;
    }
    return profile < 32 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

/* Events: a simulated GPU never has one (no Xid, no ECC error), so a wait sleeps its
 * timeout and says NVML_ERROR_TIMEOUT, as NVML on a healthy GPU does (NVIDIA's device
 * plugin's health check waits this way). */
#define EVENT_SETS 64
#define SUPPORTED_EVENTS 0xbULL /* single- and double-bit ECC errors, Xid critical errors */

typedef struct { unsigned magic; } sim_event_set;
typedef sim_event_set *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static sim_event_set *event_sets[EVENT_SETS];

static int event_set_ours(nvmlEventSet_t set) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; set && i < EVENT_SETS; i++) found |= event_sets[i] == set;
    pthread_mutex_unlock(&lock);
    return found;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    READY();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = NVML_ERROR_UNKNOWN;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < EVENT_SETS; i++)
        if (!event_sets[i] && (event_sets[i] = calloc(1, sizeof **event_sets))) {
            event_sets[i]->magic = SIM_MAGIC;
            *set = event_sets[i];
            ret = NVML_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return ret;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    READY();
    nvmlReturn_t ret = NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    for (int i = 0; set && i < EVENT_SETS; i++)
        if (event_sets[i] == set) {
            free(event_sets[i]);
            event_sets[i] = NULL;
            ret = NVML_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    DEVICE(d);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                          nvmlEventSet_t set) {
    DEVICE(d);
    if (!event_set_ours(set)) return NVML_ERROR_INVALID_ARGUMENT;
    return types & ~SUPPORTED_EVENTS ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeout_ms) {
    READY();
    if (!data || !event_set_ours(set)) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec t = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
    return NVML_ERROR_TIMEOUT;
}
API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                  unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* Topology: no NVLink is modelled (its calls are NOT_SUPPORTED, which callers skip); on PCIe
 * the first half of the GPUs (by index) sits under one CPU and the rest under another, as on
 * a two-socket server. NVML's levels: 0 the same board, 40 the same CPU, 50 across CPUs. */
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                     int *level) {
    DEVICE(a);
    if (!ours(b) || !level) return NVML_ERROR_INVALID_ARGUMENT;
    if (a->is_mig) a = a->parent;
    if (b->is_mig) b = b->parent;
    if (a == b) *level = 0;
    else *level = (a->index * 2 / n_gpus == b->index * 2 / n_gpus) ? 40 : 50;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    DEVICE(d);
    (void)link;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link,
                                                     nvmlPciInfo_t *pci) {
    DEVICE(d);
    (void)link;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}
API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned int link,
                                                  nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(d, link, pci);
}
