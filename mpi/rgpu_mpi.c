/* librgpu_mpi.so: MPI calls on rgpu device buffers, through the PMPI profiling interface
 * (rgpu_mpi.h says how programs use it).
 *
 * Point-to-point calls (MPI_Send, MPI_Recv, MPI_Isend, MPI_Irecv, MPI_Sendrecv and the
 * MPI_Wait and MPI_Test families) and MPI_Bcast and MPI_Allreduce look at each buffer:
 *
 * - host memory goes to the real MPI as it is (the check is one call into rgpu's libcuda,
 *   answered from its own tables, and nothing at all before CUDA is initialized);
 * - a CUDA device buffer (recognised by address: rgpu's libcuda registers its entry points
 *   here at cuInit) or an OpenCL buffer (a cl_mem, marked by its datatype) of 64 KiB or more
 *   moves *directly between the servers*: the message carries an envelope (the buffer
 *   exported by its server), and the receiving rank's server pulls the bytes from the sending
 *   one into its device (a host receive pulls them into host memory); the receiver then tells
 *   the sender, whose send completes. Smaller buffers are staged through host memory: read
 *   from the device before a send, written to it when a receive completes. Both sides decide
 *   alone, so device and host buffers mix freely (device -> host, host -> device).
 *
 * A failed device copy is reported as an MPI error through the communicator's error handler,
 * with a message on stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rgpu_mpi.h"

#ifdef OPEN_MPI
/* Open MPI's predefined handles are the addresses of objects in libmpi. A reference to one in
 * this library would be bound when the library is loaded, which fails where it is preloaded
 * into a program that loads libmpi only later (Python's mpi4py): they are looked up the first
 * time one is used, which is always after an MPI call (libmpi is loaded by then). MPICH's
 * handles are constants and need none of this. */
#define LATE_HANDLE(type, symbol)                                       \
    __attribute__((unused)) static type late_##symbol(void) {           \
        static void *found;                                             \
        void *at = __atomic_load_n(&found, __ATOMIC_ACQUIRE);           \
        if (!at) {                                                      \
            at = dlsym(RTLD_DEFAULT, #symbol);                          \
            __atomic_store_n(&found, at, __ATOMIC_RELEASE);             \
        }                                                               \
        return (type)at;                                                \
    }
LATE_HANDLE(MPI_Comm, ompi_mpi_comm_world)
LATE_HANDLE(MPI_Comm, ompi_mpi_comm_null)
LATE_HANDLE(MPI_Group, ompi_mpi_group_null)
LATE_HANDLE(MPI_Datatype, ompi_mpi_byte)
LATE_HANDLE(MPI_Datatype, ompi_mpi_datatype_null)
LATE_HANDLE(MPI_Request, ompi_request_null)
LATE_HANDLE(MPI_Type_delete_attr_function *, OMPI_C_MPI_TYPE_NULL_DELETE_FN)
LATE_HANDLE(MPI_Datatype, ompi_mpi_int)
LATE_HANDLE(MPI_Op, ompi_mpi_op_min)
LATE_HANDLE(MPI_Op, ompi_mpi_op_sum)
LATE_HANDLE(MPI_Op, ompi_mpi_op_prod)
LATE_HANDLE(MPI_Op, ompi_mpi_op_max)
#undef MPI_COMM_WORLD
#define MPI_COMM_WORLD late_ompi_mpi_comm_world()
#undef MPI_COMM_NULL
#define MPI_COMM_NULL late_ompi_mpi_comm_null()
#undef MPI_GROUP_NULL
#define MPI_GROUP_NULL late_ompi_mpi_group_null()
#undef MPI_BYTE
#define MPI_BYTE late_ompi_mpi_byte()
#undef MPI_DATATYPE_NULL
#define MPI_DATATYPE_NULL late_ompi_mpi_datatype_null()
#undef MPI_REQUEST_NULL
#define MPI_REQUEST_NULL late_ompi_request_null()
#undef MPI_TYPE_NULL_DELETE_FN
#define MPI_TYPE_NULL_DELETE_FN late_OMPI_C_MPI_TYPE_NULL_DELETE_FN()
#undef MPI_INT
#define MPI_INT late_ompi_mpi_int()
#undef MPI_MIN
#define MPI_MIN late_ompi_mpi_op_min()
#undef MPI_SUM
#define MPI_SUM late_ompi_mpi_op_sum()
#undef MPI_PROD
#define MPI_PROD late_ompi_mpi_op_prod()
#undef MPI_MAX
#define MPI_MAX late_ompi_mpi_op_max()
#endif

int RGPU_MPI_BUFFER_KEYVAL = MPI_KEYVAL_INVALID;

/* ---- the device APIs ----------------------------------------------------------------------- */

/* rgpu's libcuda entry points, registered at its cuInit (rgpu_mpi_register_cuda). */
typedef int (*PointerGetAttribute)(void *data, int attribute, uint64_t ptr);
typedef int (*CopyDtoH)(void *dst, uint64_t src, size_t bytes);
typedef int (*CopyHtoD)(uint64_t dst, const void *src, size_t bytes);

static struct {
    PointerGetAttribute pointer_attribute;
    CopyDtoH dtoh;
    CopyHtoD htod;
} cuda;

/* Called by rgpu's libcuda once cuInit succeeded: from then on its device pointers are
 * recognised. */
void rgpu_mpi_register_cuda(void *pointer_attribute, void *dtoh, void *htod) {
    cuda.dtoh = (CopyDtoH)dtoh;
    cuda.htod = (CopyHtoD)htod;
    __atomic_store_n(&cuda.pointer_attribute, (PointerGetAttribute)pointer_attribute,
                     __ATOMIC_RELEASE);
}

/* OpenCL, looked up when a datatype first names an OpenCL buffer. */
typedef int (*EnqueueRead)(void *queue, void *mem, unsigned blocking, size_t offset, size_t size,
                           void *ptr, unsigned n_events, const void *events, void *event);
typedef int (*EnqueueWrite)(void *queue, void *mem, unsigned blocking, size_t offset, size_t size,
                            const void *ptr, unsigned n_events, const void *events, void *event);

static struct {
    EnqueueRead read;
    EnqueueWrite write;
} opencl;
static pthread_once_t opencl_once = PTHREAD_ONCE_INIT;

static void *symbol(const char *library, const char *name) {
    void *found = dlsym(RTLD_DEFAULT, name);
    if (!found) {
        void *handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
        if (!handle) handle = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
        if (handle) found = dlsym(handle, name);
    }
    return found;
}

static void find_opencl(void) {
    opencl.read = (EnqueueRead)symbol("libOpenCL.so.1", "clEnqueueReadBuffer");
    opencl.write = (EnqueueWrite)symbol("libOpenCL.so.1", "clEnqueueWriteBuffer");
}

/* ---- buffers --------------------------------------------------------------------------------- */

enum Kind { HOST = 0, CUDA = 1, OPENCL = 2 };

/* One buffer argument of an MPI call, as rgpu sees it. */
typedef struct {
    enum Kind kind;
    void *address;     /* the argument: a host or CUDA device address, or a cl_mem */
    void *queue;       /* OpenCL: the queue */
    size_t bytes;      /* count * the datatype's size */
    MPI_Datatype base; /* the datatype without rgpu's mark */
} Buffer;

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2

static Buffer classify(const void *address, int count, MPI_Datatype type) {
    Buffer b = {HOST, (void *)address, NULL, 0, type};
    if (address == MPI_IN_PLACE || address == MPI_BOTTOM) return b;
    if (type != MPI_DATATYPE_NULL && RGPU_MPI_BUFFER_KEYVAL != MPI_KEYVAL_INVALID) {
        void *value = NULL;
        int found = 0;
        PMPI_Type_get_attr(type, RGPU_MPI_BUFFER_KEYVAL, &value, &found);
        if (found && value && ((struct rgpu_mpi_buffer *)value)->kind == RGPU_MPI_BUFFER_OPENCL) {
            b.kind = OPENCL;
            b.queue = ((struct rgpu_mpi_buffer *)value)->queue;
            b.base = ((struct rgpu_mpi_buffer *)value)->base;
        }
    }
    PointerGetAttribute attribute = __atomic_load_n(&cuda.pointer_attribute, __ATOMIC_ACQUIRE);
    if (b.kind == HOST && attribute && address) {
        unsigned memory_type = 0;
        if (attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (uint64_t)(uintptr_t)address) ==
                0 &&
            memory_type == CU_MEMORYTYPE_DEVICE)
            b.kind = CUDA;
    }
    if (b.kind != HOST) {
        int size = 0;
        PMPI_Type_size(type, &size);
        b.bytes = (size_t)size * (size_t)(count > 0 ? count : 0);
    }
    return b;
}

/* Reports a failed device copy: a message, then the communicator's error handler. */
static int device_error(MPI_Comm comm, const char *what, int code) {
    fprintf(stderr, "rgpu: %s failed (error %d)\n", what, code);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* Copies between a device buffer's first `bytes` and host memory: into the device when
 * `write`, else out of it. */
static int device_copy(const Buffer *b, void *host, size_t bytes, int write, MPI_Comm comm) {
    int rc = 0;
    if (bytes == 0) return MPI_SUCCESS;
    if (write && bytes > b->bytes) bytes = b->bytes;
    uint64_t address = (uint64_t)(uintptr_t)b->address;
    if (b->kind == CUDA) {
        rc = write ? cuda.htod(address, host, bytes) : cuda.dtoh(host, address, bytes);
        if (rc) return device_error(comm, write ? "writing a CUDA buffer" : "reading a CUDA buffer", rc);
    } else {
        pthread_once(&opencl_once, find_opencl);
        if (write)
            rc = opencl.write ? opencl.write(b->queue, b->address, 1, 0, bytes, host, 0, NULL, NULL) : -1;
        else
            rc = opencl.read ? opencl.read(b->queue, b->address, 1, 0, bytes, host, 0, NULL, NULL) : -1;
        if (rc)
            return device_error(comm, write ? "writing an OpenCL buffer" : "reading an OpenCL buffer", rc);
    }
    return MPI_SUCCESS;
}

static int to_host(const Buffer *b, void *host, size_t bytes, MPI_Comm comm) {
    return device_copy(b, host, bytes, 0, comm);
}

static int to_device(const Buffer *b, const void *host, size_t bytes, MPI_Comm comm) {
    return device_copy(b, (void *)host, bytes, 1, comm);
}

/* ---- host staging memory: kept for reuse (a fresh allocation of many MiB costs its page
 * faults on every message) ---------------------------------------------------------------- */

#define STAGING_HEADER 64
#define STAGING_SLOTS 16
#define STAGING_KEPT_MAX ((size_t)1 << 30)

static struct {
    char *block; /* header + memory */
    size_t capacity;
} staging_cache[STAGING_SLOTS];
static pthread_mutex_t staging_lock = PTHREAD_MUTEX_INITIALIZER;

/* Host memory for `bytes` of staging (NULL when none can be had). */
static void *staging_get(size_t bytes) {
    char *block = NULL;
    pthread_mutex_lock(&staging_lock);
    int best = -1;
    for (int i = 0; i < STAGING_SLOTS; ++i) {
        size_t c = staging_cache[i].capacity;
        if (staging_cache[i].block && c >= bytes && c / 2 <= bytes + 4096 &&
            (best < 0 || c < staging_cache[best].capacity))
            best = i;
    }
    if (best >= 0) {
        block = staging_cache[best].block;
        staging_cache[best].block = NULL;
    }
    pthread_mutex_unlock(&staging_lock);
    if (!block) {
        size_t capacity = (bytes + 4095) & ~(size_t)4095;
        block = malloc(STAGING_HEADER + (capacity ? capacity : 4096));
        if (!block) return NULL;
        *(size_t *)block = capacity ? capacity : 4096;
    }
    return block + STAGING_HEADER;
}

/* Gives staging memory back: kept for the next message (up to STAGING_SLOTS buffers of at
 * most 1 GiB each), else freed. */
static void staging_put(void *memory) {
    if (!memory) return;
    char *block = (char *)memory - STAGING_HEADER;
    size_t capacity = *(size_t *)block;
    pthread_mutex_lock(&staging_lock);
    for (int i = 0; i < STAGING_SLOTS && capacity <= STAGING_KEPT_MAX; ++i) {
        if (!staging_cache[i].block) {
            staging_cache[i].block = block;
            staging_cache[i].capacity = capacity;
            block = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&staging_lock);
    free(block);
}

/* A host copy of a device buffer to send (NULL on failure, after reporting it). */
static void *staged_for_send(const Buffer *b, MPI_Comm comm, int *rc) {
    void *host = staging_get(b->bytes);
    if (!host) {
        *rc = device_error(comm, "allocating host staging", -1);
        return NULL;
    }
    *rc = to_host(b, host, b->bytes, comm);
    if (*rc != MPI_SUCCESS) {
        staging_put(host);
        return NULL;
    }
    return host;
}

/* ---- direct transfers between servers (docs/mpi.md) ------------------------------------------ */

/* An export, as rgpu's client libraries describe it (rgpu_client::ExportRecord). */
struct rgpu_export {
    char endpoint[256];
    uint64_t session;
    unsigned char ticket[32];
};

typedef int (*CudaExport)(uint64_t ptr, uint64_t size, struct rgpu_export *out);
typedef int (*CudaPull)(uint64_t dst, uint64_t size, const struct rgpu_export *from);
typedef int (*CudaUnexport)(uint64_t ptr, const struct rgpu_export *from);
typedef int (*PullHost)(void *dst, uint64_t size, const struct rgpu_export *from);
typedef int (*CudaPullBatch)(uint32_t count, const uint64_t *dsts, const uint64_t *sizes,
                             const struct rgpu_export *from);
typedef int (*ClExport)(void *queue, void *mem, size_t offset, size_t size, struct rgpu_export *out);
typedef int (*ClPull)(void *queue, void *mem, size_t offset, size_t size,
                      const struct rgpu_export *from);
typedef int (*ClUnexport)(void *queue, const struct rgpu_export *from);

static struct {
    CudaExport export_;
    CudaPull pull;
    CudaUnexport unexport;
    PullHost pull_host;
} cuda_peers;

static struct {
    ClExport export_;
    ClPull pull;
    ClUnexport unexport;
    PullHost pull_host;
} cl_peers;
static pthread_once_t cl_peers_once = PTHREAD_ONCE_INIT;

/* Called by rgpu's libcuda at cuInit: exports, pulls into device and host memory. */
void rgpu_mpi_register_cuda_peers(void *export_, void *pull, void *unexport, void *pull_host) {
    cuda_peers.export_ = (CudaExport)export_;
    cuda_peers.pull = (CudaPull)pull;
    cuda_peers.unexport = (CudaUnexport)unexport;
    cuda_peers.pull_host = (PullHost)pull_host;
}

/* Pulls of several messages into CUDA buffers at once, by their servers, side by side. */
static CudaPullBatch cuda_pull_batch;

/* Called by rgpu's libcuda at cuInit, after rgpu_mpi_register_cuda_peers. */
void rgpu_mpi_register_cuda_batch(void *pull_batch) { cuda_pull_batch = (CudaPullBatch)pull_batch; }

/* The rgpu platform's extension functions for the same (crates/opencl/src/api/peers.rs). */
static void find_cl_peers(void) {
    typedef int (*GetPlatformIDs)(unsigned, void **, unsigned *);
    typedef int (*GetPlatformInfo)(void *, unsigned, size_t, void *, size_t *);
    typedef void *(*GetExtension)(void *, const char *);
    GetPlatformIDs ids = (GetPlatformIDs)symbol("libOpenCL.so.1", "clGetPlatformIDs");
    GetPlatformInfo info = (GetPlatformInfo)symbol("libOpenCL.so.1", "clGetPlatformInfo");
    GetExtension extension =
        (GetExtension)symbol("libOpenCL.so.1", "clGetExtensionFunctionAddressForPlatform");
    void *platforms[32];
    unsigned n = 0;
    if (!ids || !info || !extension || ids(32, platforms, &n)) return;
    for (unsigned i = 0; i < n && i < 32; ++i) {
        char name[64] = "";
        if (info(platforms[i], 0x0902 /* CL_PLATFORM_NAME */, sizeof name, name, NULL) ||
            strcmp(name, "rgpu"))
            continue;
        cl_peers.export_ = (ClExport)extension(platforms[i], "rgpu_opencl_export");
        cl_peers.pull = (ClPull)extension(platforms[i], "rgpu_opencl_pull");
        cl_peers.unexport = (ClUnexport)extension(platforms[i], "rgpu_opencl_unexport");
        cl_peers.pull_host = (PullHost)extension(platforms[i], "rgpu_opencl_pull_host");
    }
}

/* Device sends of at least this many bytes go direct (RGPU_MPI_DIRECT=0: never). */
#define DIRECT_MIN ((size_t)64 << 10)
/* Direct messages up to this size are pulled by the receiving process itself, over its link to
 * the exporting server, and written to its device, unless MPI_Waitall has several for CUDA
 * buffers (then their servers pull them, side by side) (RGPU_MPI_CLIENT_PULL=0: never; bytes:
 * up to that size instead). */
static size_t client_pull_max = (size_t)512 << 10;
static const unsigned char MAGIC[16] = {'r', 'g', 'p', 'u', '-', 'm', 'p', 'i',
                                        '-', 'd', 'i', 'r', 'e', 'c', 't', 1};

/* What a direct send sends in place of the data, on the program's communicator and tag. */
struct envelope {
    unsigned char magic[16];
    uint64_t bytes;
    uint64_t id;
    int32_t world_rank; /* the sender's, in MPI_COMM_WORLD: where the reply goes */
    int32_t version;
    struct rgpu_export from;
};
#define ENVELOPE_BYTES ((int)sizeof(struct envelope))

/* The receiver's answer, on the control communicator: the data was pulled; it could not be
 * (then the receiver waits for it from the sender, staged, on the control communicator);
 * the receive was too small for it. */
enum { PULLED = 1, SEND_IT = 2, TRUNCATED = 3 };
struct reply {
    uint64_t id;
    int32_t verdict;
    int32_t code;
};

/* Both set up after MPI_Init when `have_control` (no static initializer: see LATE_HANDLE). */
static MPI_Comm control;
static MPI_Group world_group;
static int have_control;
static int world_rank;
static int direct_enabled = 1;
static uint64_t next_id;

static int control_tag(uint64_t id) { return (int)(id % 30000) + 1; }

/* A direct send in flight: its envelope, and the reply it waits for. */
typedef struct {
    struct envelope envelope;
    struct reply reply;
    MPI_Request reply_request;
    int replied;
    int dest_world;
    Buffer source;
    MPI_Comm comm;
} Direct;

static int export_buffer(const Buffer *b, struct rgpu_export *out) {
    if (b->kind == CUDA)
        return cuda_peers.export_ ? cuda_peers.export_((uint64_t)(uintptr_t)b->address, b->bytes, out) : -1;
    pthread_once(&cl_peers_once, find_cl_peers);
    return cl_peers.export_ ? cl_peers.export_(b->queue, b->address, 0, b->bytes, out) : -1;
}

static void unexport_buffer(const Buffer *b, const struct rgpu_export *from) {
    if (b->kind == CUDA && cuda_peers.unexport)
        cuda_peers.unexport((uint64_t)(uintptr_t)b->address, from);
    else if (b->kind == OPENCL && cl_peers.unexport)
        cl_peers.unexport(b->queue, from);
}

/* Starts a direct send of `b` (a new Direct, or NULL when the staged path must be used: a small
 * buffer, no export, direct transfers turned off). */
static Direct *start_direct(const Buffer *b, int dest, MPI_Comm comm) {
    if (!direct_enabled || !have_control || b->bytes < DIRECT_MIN || dest == MPI_PROC_NULL)
        return NULL;
    Direct *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    if (export_buffer(b, &d->envelope.from) != 0) {
        free(d);
        return NULL;
    }
    MPI_Group group;
    int dest_world = MPI_UNDEFINED;
    PMPI_Comm_group(comm, &group);
    PMPI_Group_translate_ranks(group, 1, &dest, world_group, &dest_world);
    PMPI_Group_free(&group);
    memcpy(d->envelope.magic, MAGIC, sizeof MAGIC);
    d->envelope.bytes = b->bytes;
    d->envelope.id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    d->envelope.world_rank = world_rank;
    d->envelope.version = 1;
    d->source = *b;
    d->comm = comm;
    d->dest_world = dest_world;
    if (dest_world == MPI_UNDEFINED ||
        PMPI_Irecv(&d->reply, sizeof d->reply, MPI_BYTE, dest_world, control_tag(d->envelope.id),
                   control, &d->reply_request) != MPI_SUCCESS) {
        unexport_buffer(b, &d->envelope.from);
        free(d);
        return NULL;
    }
    return d;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits for the receiver's reply to a direct send. The receiver answers when the program
 * completes its receive, which may be late; meanwhile, once a second, a one-byte read of the
 * source buffer checks that its server is still there (it fails at once when the connection is
 * gone). Returns 0 when it is gone (the read's failure reported), 1 once the reply is in. */
static int await_reply(Direct *d) {
    double start = seconds_now(), probe_at = start + 1.0;
    useconds_t nap = 0;
    for (;;) {
        int done = 0;
        PMPI_Test(&d->reply_request, &done, MPI_STATUS_IGNORE);
        if (done) return 1;
        /* Spin for the first millisecond (a prompt reply), then nap up to 100 µs at a time (a
         * late reply is taken at most that late). */
        double now = seconds_now();
        if (now - start > 1e-3) {
            nap = nap ? (nap * 2 > 100 ? 100 : nap * 2) : 10;
            usleep(nap);
        }
        if (now >= probe_at) {
            unsigned char byte;
            if (to_host(&d->source, &byte, 1, d->comm) != MPI_SUCCESS) return 0;
            probe_at = seconds_now() + 1.0;
        }
    }
}

/* Ends a direct send whose envelope went: waits for the receiver's reply (it pulls without
 * this rank's help, so waiting cannot deadlock where a rendezvous send would not). When the
 * receiver could not pull, the data goes to it staged, on the control communicator. */
static int finish_direct(Direct *d) {
    if (!d->replied && !await_reply(d)) {
        /* The buffer's server is gone: nobody can pull it, and the receiver may never answer. */
        PMPI_Cancel(&d->reply_request);
        PMPI_Request_free(&d->reply_request);
        free(d);
        return MPI_ERR_OTHER;
    }
    int rc = MPI_SUCCESS;
    /* An export that was pulled has ended at its server already (its last byte pulled, or the
     * puller's word that it copied it by IPC); one that was not is withdrawn. */
    if (d->reply.verdict != PULLED) unexport_buffer(&d->source, &d->envelope.from);
    if (d->reply.verdict == SEND_IT) {
        void *host = staged_for_send(&d->source, d->comm, &rc);
        /* Without the data (its device failed), an empty message: the receiver must not wait. */
        int sent = PMPI_Send(host, host ? (int)d->source.bytes : 0, MPI_BYTE, d->dest_world,
                             control_tag(d->envelope.id), control);
        if (rc == MPI_SUCCESS) rc = sent;
        staging_put(host);
    } else if (d->reply.verdict == TRUNCATED) {
        rc = MPI_ERR_TRUNCATE;
    }
    free(d);
    return rc;
}

/* Gives up a direct send whose envelope could not be sent: `rc`. */
static int abandon_direct(Direct *d, int rc) {
    PMPI_Cancel(&d->reply_request);
    PMPI_Wait(&d->reply_request, MPI_STATUS_IGNORE);
    unexport_buffer(&d->source, &d->envelope.from);
    free(d);
    return rc;
}

/* Whether a completed receive got an envelope rather than data. */
static int is_envelope(const void *data, MPI_Status *status) {
    int n = 0;
    PMPI_Get_count(status, MPI_BYTE, &n);
    return n == ENVELOPE_BYTES && !memcmp(data, MAGIC, sizeof MAGIC);
}

/* Pulls an export straight into host memory, through whichever rgpu client library is here. */
static int pull_host(void *dst, uint64_t bytes, const struct rgpu_export *from) {
    if (cuda_peers.pull_host) return cuda_peers.pull_host(dst, bytes, from);
    pthread_once(&cl_peers_once, find_cl_peers);
    return cl_peers.pull_host ? cl_peers.pull_host(dst, bytes, from) : -1;
}

/* A direct message pulled before its receive is finished (MPI_Waitall pulls several at once):
 * a small one by this process, into `staging`; a larger one by the destination's server,
 * straight into the device buffer (`on_device`). Pulled when `rc` is 0. */
typedef struct {
    void *staging;
    int on_device;
    int rc;
    struct envelope envelope;
} Prefetch;

/* At most this many small direct messages are pulled at once (each over a link of its own). */
#define PULLS_AT_ONCE 8

typedef struct {
    Prefetch **items;
    int count;
    int next; /* taken atomically */
} PullBatch;

static void *pull_batch_worker(void *arg) {
    PullBatch *batch = arg;
    for (;;) {
        int i = __atomic_fetch_add(&batch->next, 1, __ATOMIC_RELAXED);
        if (i >= batch->count) return NULL;
        Prefetch *p = batch->items[i];
        p->rc = pull_host(p->staging, p->envelope.bytes, &p->envelope.from);
    }
}

/* Pulls `count` small direct messages into their staging at once: the round trips to the
 * exporting servers overlap (one after the other, each costs a round trip). */
static void pull_all(Prefetch **items, int count) {
    PullBatch batch = {items, count, 0};
    pthread_t threads[PULLS_AT_ONCE - 1];
    int started = 0;
    for (int i = 0; i < count - 1 && i < PULLS_AT_ONCE - 1; ++i)
        if (pthread_create(&threads[started], NULL, pull_batch_worker, &batch) == 0) ++started;
    pull_batch_worker(&batch);
    for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
}

/* Completes a receive that got an envelope (`data`): the data is pulled into `dst` (a device
 * buffer, by its server, else through this rank's host memory) or into host memory `host` of
 * `capacity` bytes; the sender is told. Where nothing could pull it, the sender sends it,
 * staged. The status counts the data, not the envelope. */
static int take_envelope(const void *data, const Buffer *dst, void *host, size_t capacity,
                         MPI_Comm comm, MPI_Status *status, Prefetch *ahead) {
    struct envelope e;
    memcpy(&e, data, sizeof e);
    int tag = control_tag(e.id);
    if (e.bytes > capacity) {
        struct reply r = {e.id, TRUNCATED, 0};
        PMPI_Send(&r, sizeof r, MPI_BYTE, e.world_rank, tag, control);
        return MPI_ERR_TRUNCATE;
    }
    int code = -1;
    void *staging = NULL;
    /* A small message goes through this process: one request on its persistent link to the
     * exporting server, then a write its own server is not waited for; a pull by its server
     * would cost two hops (measured with `rgpu bench mpi`: faster below client_pull_max). */
    int on_device = ahead && ahead->on_device; /* pulled already, with others, by its server */
    if (dst->kind != HOST && e.bytes <= client_pull_max && !on_device) {
        int pulled;
        if (ahead && ahead->staging) {
            staging = ahead->staging;
            pulled = ahead->rc == 0;
            ahead->staging = NULL;
        } else {
            staging = staging_get(e.bytes);
            pulled = staging && pull_host(staging, e.bytes, &e.from) == 0;
        }
        if (pulled) {
            code = to_device(dst, staging, e.bytes, comm);
            staging_put(staging);
            if (e.id != 0) {
                struct reply r = {e.id, PULLED, 0};
                PMPI_Send(&r, sizeof r, MPI_BYTE, e.world_rank, tag, control);
            }
            if (code != MPI_SUCCESS) return code;
            PMPI_Status_set_elements(status, MPI_BYTE, (int)e.bytes);
            return MPI_SUCCESS;
        }
        staging_put(staging);
        staging = NULL;
    }
    if (on_device) {
        code = ahead->rc;
    } else if (dst->kind == CUDA && cuda_peers.pull) {
        code = cuda_peers.pull((uint64_t)(uintptr_t)dst->address, e.bytes, &e.from);
    } else if (dst->kind == OPENCL) {
        pthread_once(&cl_peers_once, find_cl_peers);
        if (cl_peers.pull) code = cl_peers.pull(dst->queue, dst->address, 0, e.bytes, &e.from);
    }
    if (code != 0) {
        /* Not by this rank's server: by this process, into host memory. */
        void *into = host;
        if (dst->kind != HOST) into = staging = staging_get(e.bytes);
        code = into ? pull_host(into, e.bytes, &e.from) : -1;
        if (code != 0 && into) {
            /* Nothing here reaches the exporting server: the sender sends the data. */
            MPI_Request raw;
            PMPI_Irecv(into, (int)e.bytes, MPI_BYTE, e.world_rank, tag, control, &raw);
            struct reply r = {e.id, SEND_IT, code};
            PMPI_Send(&r, sizeof r, MPI_BYTE, e.world_rank, tag, control);
            MPI_Status got;
            int received = 0;
            code = PMPI_Wait(&raw, &got);
            PMPI_Get_count(&got, MPI_BYTE, &received);
            if (code == MPI_SUCCESS && (uint64_t)received != e.bytes) code = -1; /* sender failed */
            e.id = 0; /* replied */
        }
        if (code == 0 && dst->kind != HOST) code = to_device(dst, staging, e.bytes, comm);
        staging_put(staging);
    }
    if (e.id != 0) {
        struct reply r = {e.id, PULLED, 0};
        PMPI_Send(&r, sizeof r, MPI_BYTE, e.world_rank, tag, control);
    }
    if (code != 0) return device_error(comm, "receiving a device buffer", code);
    PMPI_Status_set_elements(status, MPI_BYTE, (int)e.bytes);
    return MPI_SUCCESS;
}

/* ---- requests with work left ---------------------------------------------------------------- */

enum PendingKind {
    SEND_STAGED, /* staging to free */
    RECV_STAGED, /* staging to write to a device buffer (or an envelope) */
    RECV_HOST,   /* a large host receive: maybe an envelope */
    SEND_DIRECT, /* an envelope sent: the reply to wait for */
};

typedef struct Pending {
    MPI_Request request;
    enum PendingKind kind;
    Buffer device;   /* RECV_STAGED: the destination */
    void *host;      /* staging (owned), or RECV_HOST's buffer (the program's) */
    size_t capacity; /* RECV_HOST: bytes the buffer holds */
    Direct *direct;  /* SEND_DIRECT */
    MPI_Comm comm;
    int masked;      /* left out of the current MPI call: its receiver has not pulled yet */
    int advanced;    /* a receive's data already handled (its request not completed yet) */
    int advanced_rc;
    int received;    /* bytes the handled receive got */
    struct Pending *next;
    Prefetch *ahead; /* a small direct message's bytes, pulled before the receive is finished */
} Pending;

static Pending *pending;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
/* Whether any request has work left: the Wait/Test calls skip the lookups otherwise. */
static int pending_count;

static void remember(MPI_Request request, Pending entry) {
    Pending *p = malloc(sizeof *p);
    if (!p) abort();
    *p = entry;
    p->request = request;
    pthread_mutex_lock(&pending_lock);
    p->next = pending;
    pending = p;
    __atomic_add_fetch(&pending_count, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pending_lock);
}

/* Takes the pending entry of `request` out of the list (NULL: none). */
static Pending *take(MPI_Request request) {
    if (request == MPI_REQUEST_NULL || !__atomic_load_n(&pending_count, __ATOMIC_ACQUIRE)) return NULL;
    pthread_mutex_lock(&pending_lock);
    Pending **at = &pending;
    while (*at && (*at)->request != request) at = &(*at)->next;
    Pending *found = *at;
    if (found) {
        *at = found->next;
        __atomic_sub_fetch(&pending_count, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pending_lock);
    return found;
}

/* Puts an entry back (its request is not complete yet). */
static void put_back(Pending *p) {
    pthread_mutex_lock(&pending_lock);
    p->next = pending;
    pending = p;
    __atomic_add_fetch(&pending_count, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pending_lock);
}

/* Whether a pending request may complete now as far as rgpu is concerned: a direct send only
 * once its receiver replied (tested here without waiting). */
static int ready(Pending *p) {
    if (!p || p->kind != SEND_DIRECT || p->direct->replied) return 1;
    int flag = 0;
    PMPI_Test(&p->direct->reply_request, &flag, MPI_STATUS_IGNORE);
    p->direct->replied = flag;
    return flag;
}

/* A receive's work once its message is in: the data goes to its device buffer, or an
 * envelope is taken (the data pulled). Sets the bytes received in `p`. */
static int receive_work(Pending *p, MPI_Status *status) {
    int rc = MPI_SUCCESS, received = 0;
    int envelope = p->capacity >= (size_t)ENVELOPE_BYTES && is_envelope(p->host, status);
    if (envelope) {
        Buffer none = {HOST, NULL, NULL, 0, MPI_BYTE};
        const Buffer *dst = p->kind == RECV_STAGED ? &p->device : &none;
        rc = take_envelope(p->host, dst, p->kind == RECV_HOST ? p->host : NULL, p->capacity,
                           p->comm, status, p->ahead);
    } else if (p->kind == RECV_STAGED) {
        PMPI_Get_count(status, MPI_BYTE, &received);
        if (received == MPI_UNDEFINED || received < 0) received = 0;
        rc = to_device(&p->device, p->host, (size_t)received, p->comm);
    }
    PMPI_Get_count(status, MPI_BYTE, &received);
    p->received = received;
    return rc;
}

/* Handles a receive whose message is in although its request has not been completed (a Test
 * call that reports "not all done"): its peer may be waiting for it to pull. */
static void advance(Pending *p) {
    if (!p || p->advanced || (p->kind != RECV_STAGED && p->kind != RECV_HOST)) return;
    int flag = 0;
    MPI_Status status;
    PMPI_Request_get_status(p->request, &flag, &status);
    if (!flag) return;
    p->advanced_rc = receive_work(p, &status);
    p->advanced = 1;
}

/* Pulls the direct messages that completed receives of `taken` got, all at once, ahead of
 * finishing them one by one (each would otherwise wait for its own pull): those for CUDA
 * buffers by their servers, in one batch (measured faster at every size than this process
 * pulling them, which the servers do side by side); small ones for other buffers by this
 * process, several at a time. */
static void pull_ahead(Pending **taken, int count, MPI_Status *statuses) {
    if (!taken || count < 2 || (!client_pull_max && !cuda_pull_batch)) return;
    Prefetch **items = calloc((size_t)count, sizeof *items);
    Prefetch **batch = calloc((size_t)count, sizeof *batch);
    uint64_t *dsts = calloc((size_t)count, sizeof *dsts);
    uint64_t *sizes = calloc((size_t)count, sizeof *sizes);
    struct rgpu_export *from = calloc((size_t)count, sizeof *from);
    int n = 0, m = 0;
    for (int i = 0; items && batch && dsts && sizes && from && i < count; ++i) {
        Pending *p = taken[i];
        if (!p || p->kind != RECV_STAGED || p->advanced || p->ahead ||
            p->capacity < (size_t)ENVELOPE_BYTES || !is_envelope(p->host, &statuses[i]))
            continue;
        struct envelope e;
        memcpy(&e, p->host, sizeof e);
        if (e.bytes > p->capacity) continue;
        Prefetch *ahead = calloc(1, sizeof *ahead);
        if (!ahead) break;
        ahead->envelope = e;
        if (p->device.kind == CUDA && cuda_pull_batch) {
            ahead->on_device = 1;
            dsts[m] = (uint64_t)(uintptr_t)p->device.address;
            sizes[m] = e.bytes;
            from[m] = e.from;
            batch[m++] = ahead;
        } else if (e.bytes <= client_pull_max) {
            if (!(ahead->staging = staging_get(e.bytes))) {
                free(ahead);
                continue;
            }
            items[n++] = ahead;
        } else {
            free(ahead);
            continue;
        }
        p->ahead = ahead;
    }
    if (m > 0) {
        int rc = cuda_pull_batch((uint32_t)m, dsts, sizes, from);
        for (int i = 0; i < m; ++i) batch[i]->rc = rc;
    }
    if (n > 0) pull_all(items, n);
    free(items);
    free(batch);
    free(dsts);
    free(sizes);
    free(from);
}

/* Finishes a completed request: a receive's data goes to its device buffer (or an envelope
 * is taken), a direct send waits for its reply, staging is freed. */
static int finish(Pending *p, MPI_Status *status) {
    int rc = MPI_SUCCESS;
    if (!p) return rc;
    switch (p->kind) {
    case SEND_STAGED:
        staging_put(p->host);
        break;
    case RECV_STAGED:
    case RECV_HOST:
        if (p->advanced) {
            rc = p->advanced_rc;
            PMPI_Status_set_elements(status, MPI_BYTE, p->received);
        } else {
            rc = receive_work(p, status);
        }
        if (p->kind == RECV_STAGED) staging_put(p->host);
        break;
    case SEND_DIRECT:
        rc = finish_direct(p->direct);
        break;
    }
    if (p->ahead) staging_put(p->ahead->staging);
    free(p->ahead);
    free(p);
    return rc;
}

/* ---- initialization ------------------------------------------------------------------------- */

/* ---- collectives on the servers' NCCL -----------------------------------------------------
 * MPI_Allreduce, MPI_Reduce, MPI_Bcast and MPI_Allgather on CUDA device buffers run as NCCL
 * collectives on the ranks' servers (rgpu's libnccl.so.2, which `rgpu run` preloads), so the
 * data moves between the servers' GPUs (NVLink, PCIe, the network between servers) and never
 * through the ranks. The ranks must all take the same path while each sees only its own
 * buffers, so for every call NCCL could carry (its datatype and operation, the same on every
 * rank as MPI requires) they first agree, with one host MPI_Allreduce of a flag: NCCL when every
 * rank's buffers are device memory and its NCCL works, else staging through host memory as
 * before. A communicator's NCCL communicator is made at its first such call (kept as an
 * attribute, destroyed with the communicator); if it cannot be made on some rank, the
 * communicator stays staged. The collective runs on the legacy default stream (after the
 * program's earlier work on blocking streams) and the call returns when it is done, as MPI's
 * blocking semantics require. RGPU_MPI_NCCL=0 (the same on every rank) turns this off. */

static int comm_size(MPI_Comm comm) {
    int n = 1;
    PMPI_Comm_size(comm, &n);
    return n;
}

static int comm_rank(MPI_Comm comm) {
    int r = 0;
    PMPI_Comm_rank(comm, &r);
    return r;
}

#define NCCL_ID_BYTES 128
typedef struct {
    char internal[NCCL_ID_BYTES];
} NcclUniqueId;
typedef void *NcclComm;
/* nccl.h's enums, as numbers. */
enum { NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_UINT32 = 3, NCCL_INT64 = 4,
       NCCL_UINT64 = 5, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8 };
enum { NCCL_SUM = 0, NCCL_PROD = 1, NCCL_MAX = 2, NCCL_MIN = 3 };

static struct {
    int (*get_unique_id)(NcclUniqueId *);
    int (*init_rank)(NcclComm *, int, NcclUniqueId, int);
    int (*destroy)(NcclComm);
    int (*all_reduce)(const void *, void *, size_t, int, int, NcclComm, void *);
    int (*reduce)(const void *, void *, size_t, int, int, int, NcclComm, void *);
    int (*broadcast)(const void *, void *, size_t, int, int, NcclComm, void *);
    int (*all_gather)(const void *, void *, size_t, int, NcclComm, void *);
    int (*stream_synchronize)(void *);
    int usable;
} nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static int nccl_enabled = 1;
static int nccl_keyval = MPI_KEYVAL_INVALID;

/* rgpu's NCCL only: the machine's own could not use rgpu's device addresses. */
static void find_nccl(void) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!lib || !dlsym(lib, "rgpu_nccl_client")) return;
    *(void **)&nccl.get_unique_id = dlsym(lib, "ncclGetUniqueId");
    *(void **)&nccl.init_rank = dlsym(lib, "ncclCommInitRank");
    *(void **)&nccl.destroy = dlsym(lib, "ncclCommDestroy");
    *(void **)&nccl.all_reduce = dlsym(lib, "ncclAllReduce");
    *(void **)&nccl.reduce = dlsym(lib, "ncclReduce");
    *(void **)&nccl.broadcast = dlsym(lib, "ncclBroadcast");
    *(void **)&nccl.all_gather = dlsym(lib, "ncclAllGather");
    *(void **)&nccl.stream_synchronize = symbol("libcuda.so.1", "cuStreamSynchronize");
    nccl.usable = nccl.get_unique_id && nccl.init_rank && nccl.destroy && nccl.all_reduce &&
                  nccl.reduce && nccl.broadcast && nccl.all_gather && nccl.stream_synchronize;
}

/* A communicator's NCCL state (its attribute). */
typedef struct {
    NcclComm comm; /* NULL until made */
    int failed;    /* it could not be made: the communicator stays staged */
} NcclState;

static int nccl_state_copy(MPI_Comm old, int key, void *extra, void *in, void *out, int *flag) {
    (void)old, (void)key, (void)extra, (void)in, (void)out;
    *flag = 0; /* a duplicate makes its own */
    return MPI_SUCCESS;
}

static int nccl_state_delete(MPI_Comm comm, int key, void *value, void *extra) {
    (void)comm, (void)key, (void)extra;
    NcclState *state = value;
    if (state && state->comm) nccl.destroy(state->comm);
    free(state);
    return MPI_SUCCESS;
}

/* The NCCL datatype of an MPI datatype (by its predefined name, which needs no handle of the
 * MPI library), or -1. */
static int nccl_type(MPI_Datatype type) {
    static const struct {
        const char *name;
        int nccl;
    } types[] = {{"MPI_FLOAT", NCCL_FLOAT32},      {"MPI_DOUBLE", NCCL_FLOAT64},
                 {"MPI_INT", NCCL_INT32},          {"MPI_INT32_T", NCCL_INT32},
                 {"MPI_UNSIGNED", NCCL_UINT32},    {"MPI_UINT32_T", NCCL_UINT32},
                 {"MPI_LONG", NCCL_INT64},         {"MPI_INT64_T", NCCL_INT64},
                 {"MPI_LONG_LONG", NCCL_INT64},    {"MPI_LONG_LONG_INT", NCCL_INT64},
                 {"MPI_UNSIGNED_LONG", NCCL_UINT64}, {"MPI_UINT64_T", NCCL_UINT64},
                 {"MPI_UNSIGNED_LONG_LONG", NCCL_UINT64}, {"MPI_CHAR", NCCL_INT8},
                 {"MPI_SIGNED_CHAR", NCCL_INT8},   {"MPI_INT8_T", NCCL_INT8},
                 {"MPI_UNSIGNED_CHAR", NCCL_UINT8}, {"MPI_UINT8_T", NCCL_UINT8},
                 {"MPI_BYTE", NCCL_UINT8}};
    char name[MPI_MAX_OBJECT_NAME] = {0};
    int length = 0;
    if (type == MPI_DATATYPE_NULL || PMPI_Type_get_name(type, name, &length) != MPI_SUCCESS)
        return -1;
    if (sizeof(long) != 8 && !strncmp(name, "MPI_", 4) && strstr(name, "LONG") &&
        !strstr(name, "LONG_LONG"))
        return -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i)
        if (!strcmp(name, types[i].name)) return types[i].nccl;
    return -1;
}

static int nccl_op(MPI_Op op) {
    if (op == MPI_SUM) return NCCL_SUM;
    if (op == MPI_PROD) return NCCL_PROD;
    if (op == MPI_MAX) return NCCL_MAX;
    if (op == MPI_MIN) return NCCL_MIN;
    return -1;
}

/* Whether every rank of `comm` says `mine`. */
static int all_agree(int mine, MPI_Comm comm) {
    int all = 0;
    return PMPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && all;
}

/* The communicator's NCCL state, made at the first call. */
static NcclState *nccl_state(MPI_Comm comm) {
    NcclState *state = NULL;
    int found = 0;
    if (PMPI_Comm_get_attr(comm, nccl_keyval, &state, &found) == MPI_SUCCESS && found)
        return state;
    state = calloc(1, sizeof *state);
    if (state && PMPI_Comm_set_attr(comm, nccl_keyval, state) != MPI_SUCCESS) {
        free(state);
        state = NULL;
    }
    return state;
}

/* Makes the communicator's NCCL communicator (every rank calls it together). */
static int nccl_make(NcclState *state, MPI_Comm comm) {
    struct {
        int ok;
        NcclUniqueId id;
    } root = {0, {{0}}};
    int rank = comm_rank(comm), size = comm_size(comm);
    if (rank == 0) root.ok = nccl.get_unique_id(&root.id) == 0;
    if (PMPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, comm) != MPI_SUCCESS || !root.ok) {
        state->failed = 1;
        return 0;
    }
    NcclComm made = NULL;
    int ok = nccl.init_rank(&made, size, root.id, rank) == 0;
    if (!all_agree(ok, comm)) {
        if (made) nccl.destroy(made);
        state->failed = 1;
        return 0;
    }
    state->comm = made;
    return 1;
}

/* Whether this call runs on NCCL (decided with every rank): `eligible` is what every rank
 * knows alike (NCCL has the datatype and operation), `device` whether this rank's buffers are
 * device memory. Returns the communicator, or NULL to stage. */
static NcclComm nccl_decide(int eligible, int device, MPI_Comm comm) {
    if (!nccl_enabled || !eligible || nccl_keyval == MPI_KEYVAL_INVALID) return NULL;
    NcclState *state = nccl_state(comm);
    if (!state || state->failed) return NULL; /* the same on every rank */
    if (device) pthread_once(&nccl_once, find_nccl);
    if (!all_agree(device && nccl.usable, comm)) return NULL;
    if (!state->comm && !nccl_make(state, comm)) return NULL;
    return state->comm;
}

/* Runs a posted NCCL call's result to completion: MPI returns when the data is there. */
static int nccl_finish(int launched, MPI_Comm comm) {
    if (launched != 0) return device_error(comm, "an NCCL collective", launched);
    int rc = nccl.stream_synchronize(NULL);
    return rc == 0 ? MPI_SUCCESS : device_error(comm, "waiting for an NCCL collective", rc);
}

static int copy_attribute(MPI_Datatype old, int key, void *extra, void *in, void *out, int *flag) {
    (void)old, (void)key, (void)extra;
    *(void **)out = in;
    *flag = 1;
    return MPI_SUCCESS;
}

static void make_keyval(void) {
    if (RGPU_MPI_BUFFER_KEYVAL == MPI_KEYVAL_INVALID)
        PMPI_Type_create_keyval(copy_attribute, MPI_TYPE_NULL_DELETE_FN, &RGPU_MPI_BUFFER_KEYVAL,
                                NULL);
}

/* After MPI_Init: the datatype key, and the control communicator of direct transfers. */
static void initialize(void) {
    make_keyval();
    const char *on_nccl = getenv("RGPU_MPI_NCCL");
    nccl_enabled = !(on_nccl && !strcmp(on_nccl, "0"));
    if (nccl_keyval == MPI_KEYVAL_INVALID)
        PMPI_Comm_create_keyval(nccl_state_copy, nccl_state_delete, &nccl_keyval, NULL);
    const char *direct = getenv("RGPU_MPI_DIRECT");
    direct_enabled = !(direct && !strcmp(direct, "0"));
    const char *client_pull = getenv("RGPU_MPI_CLIENT_PULL");
    if (client_pull && !strcmp(client_pull, "0")) {
        client_pull_max = 0;
    } else if (client_pull) {
        char *end = NULL;
        unsigned long long max = strtoull(client_pull, &end, 0);
        if (end && !*end && max > 0) client_pull_max = (size_t)max;
    }
    PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    have_control = PMPI_Comm_group(MPI_COMM_WORLD, &world_group) == MPI_SUCCESS &&
                   PMPI_Comm_dup(MPI_COMM_WORLD, &control) == MPI_SUCCESS;
}

/* Finds the loaded MPI library (libmpi.so*) for make_mpi_global. */
static int find_mpi_library(struct dl_phdr_info *info, size_t size, void *found) {
    (void)size;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libmpi.so", 9) != 0) return 0;
    *(const char **)found = name;
    return 1;
}

/* A program may have opened its MPI library privately (Python's mpi4py loads it with
 * RTLD_LOCAL, as a dependency of its extension module): this library's PMPI calls, looked up
 * in the global scope, would not find it. Before the first one, the loaded MPI library is made
 * global (the same library, opened again; its handle is kept). */
static void make_mpi_global(void) {
    const char *path = NULL;
    dl_iterate_phdr(find_mpi_library, &path);
    if (path && *path) (void)dlopen(path, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

int MPI_Init(int *argc, char ***argv) {
    make_mpi_global();
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) initialize();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    make_mpi_global();
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) initialize();
    return rc;
}

int MPI_Finalize(void) {
    /* The world's NCCL communicator goes before MPI (its attribute would outlive rgpu's). */
    if (nccl_keyval != MPI_KEYVAL_INVALID) {
        void *state = NULL;
        int found = 0;
        PMPI_Comm_get_attr(MPI_COMM_WORLD, nccl_keyval, &state, &found);
        if (found) PMPI_Comm_delete_attr(MPI_COMM_WORLD, nccl_keyval);
    }
    if (have_control) {
        have_control = 0;
        PMPI_Comm_free(&control);
        PMPI_Group_free(&world_group);
    }
    return PMPI_Finalize();
}

void rgpu_mpi_set_direct(int on) { direct_enabled = on != 0; }

void rgpu_mpi_set_nccl(int on) { nccl_enabled = on != 0; }

int rgpu_mpi_opencl_type(MPI_Datatype base, void *queue, MPI_Datatype *out) {
    static struct rgpu_mpi_buffer descriptors[256];
    static int used;
    make_keyval();
    int rc = PMPI_Type_dup(base, out);
    if (rc != MPI_SUCCESS) return rc;
    /* The attribute points at a descriptor that lives as long as the program. */
    struct rgpu_mpi_buffer *d = NULL;
    pthread_mutex_lock(&pending_lock);
    for (int i = 0; i < used; ++i)
        if (descriptors[i].queue == queue && descriptors[i].base == base) d = &descriptors[i];
    if (!d && used < (int)(sizeof descriptors / sizeof *descriptors)) {
        d = &descriptors[used++];
        d->kind = RGPU_MPI_BUFFER_OPENCL;
        d->queue = queue;
        d->base = base;
    }
    pthread_mutex_unlock(&pending_lock);
    if (!d) return MPI_ERR_OTHER;
    return PMPI_Type_set_attr(*out, RGPU_MPI_BUFFER_KEYVAL, d);
}

/* ---- point to point -------------------------------------------------------------------------- */

/* Bytes a host receive can hold. */
static size_t capacity_of(int count, MPI_Datatype type) {
    int size = 0;
    if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
    return (size_t)size * (size_t)(count > 0 ? count : 0);
}

/* A blocking send of a device buffer: direct (complete once the receiver has pulled, as a
 * synchronous send is), else staged through host memory with the real MPI_Send or, when
 * `synchronous`, MPI_Ssend. */
static int send_device(Buffer *b, int dest, int tag, MPI_Comm comm, int synchronous) {
    Direct *d = start_direct(b, dest, comm);
    if (d) {
        int rc = PMPI_Send(&d->envelope, ENVELOPE_BYTES, MPI_BYTE, dest, tag, comm);
        if (rc != MPI_SUCCESS) return abandon_direct(d, rc);
        return finish_direct(d);
    }
    int rc;
    void *host = staged_for_send(b, comm, &rc);
    if (!host) return rc;
    rc = synchronous ? PMPI_Ssend(host, (int)b->bytes, MPI_BYTE, dest, tag, comm)
                     : PMPI_Send(host, (int)b->bytes, MPI_BYTE, dest, tag, comm);
    staging_put(host);
    return rc;
}

int MPI_Send(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Send(buf, count, type, dest, tag, comm);
    return send_device(&b, dest, tag, comm, 0);
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status *status) {
    Buffer b = classify(buf, count, type);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    if (b.kind == HOST) {
        int rc = PMPI_Recv(buf, count, type, source, tag, comm, status);
        size_t capacity = capacity_of(count, type);
        if (rc == MPI_SUCCESS && capacity >= (size_t)ENVELOPE_BYTES && is_envelope(buf, status))
            rc = take_envelope(buf, &b, buf, capacity, comm, status, NULL);
        return rc;
    }
    void *host = staging_get(b.bytes);
    if (!host) return device_error(comm, "allocating host staging", -1);
    int rc = PMPI_Recv(host, (int)b.bytes, MPI_BYTE, source, tag, comm, status);
    if (rc == MPI_SUCCESS) {
        if (b.bytes >= (size_t)ENVELOPE_BYTES && is_envelope(host, status)) {
            rc = take_envelope(host, &b, NULL, b.bytes, comm, status, NULL);
        } else {
            int received = 0;
            PMPI_Get_count(status, MPI_BYTE, &received);
            rc = to_device(&b, host, (size_t)(received > 0 ? received : 0), comm);
        }
    }
    staging_put(host);
    return rc;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *request) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Isend(buf, count, type, dest, tag, comm, request);
    Pending entry = {MPI_REQUEST_NULL, SEND_STAGED, b, NULL, 0, NULL, comm, 0, 0, 0, 0, NULL, NULL};
    Direct *d = start_direct(&b, dest, comm);
    int rc;
    if (d) {
        rc = PMPI_Isend(&d->envelope, ENVELOPE_BYTES, MPI_BYTE, dest, tag, comm, request);
        if (rc != MPI_SUCCESS) return abandon_direct(d, rc);
        entry.kind = SEND_DIRECT;
        entry.direct = d;
    } else {
        void *host = staged_for_send(&b, comm, &rc);
        if (!host) return rc;
        rc = PMPI_Isend(host, (int)b.bytes, MPI_BYTE, dest, tag, comm, request);
        if (rc != MPI_SUCCESS) {
            staging_put(host);
            return rc;
        }
        entry.host = host;
    }
    remember(*request, entry);
    return rc;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) {
        int rc = PMPI_Irecv(buf, count, type, source, tag, comm, request);
        size_t capacity = capacity_of(count, type);
        /* Only large receives can get a direct send's envelope (smaller ones would truncate). */
        if (rc == MPI_SUCCESS && capacity >= DIRECT_MIN) {
            Pending entry = {MPI_REQUEST_NULL, RECV_HOST, b, buf, capacity, NULL, comm, 0, 0, 0, 0, NULL, NULL};
            remember(*request, entry);
        }
        return rc;
    }
    void *host = staging_get(b.bytes);
    if (!host) return device_error(comm, "allocating host staging", -1);
    int rc = PMPI_Irecv(host, (int)b.bytes, MPI_BYTE, source, tag, comm, request);
    if (rc != MPI_SUCCESS) {
        staging_put(host);
        return rc;
    }
    Pending entry = {MPI_REQUEST_NULL, RECV_STAGED, b, host, b.bytes, NULL, comm, 0, 0, 0, 0, NULL, NULL};
    remember(*request, entry);
    return rc;
}

int MPI_Wait(MPI_Request *request, MPI_Status *status) {
    Pending *p = take(*request);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    int rc = PMPI_Wait(request, status);
    int finished = finish(p, status);
    return rc != MPI_SUCCESS ? rc : finished;
}

int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status) {
    Pending *p = take(*request);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    if (!ready(p)) {
        /* A direct send whose receiver has not pulled yet is not complete. */
        *flag = 0;
        put_back(p);
        return MPI_SUCCESS;
    }
    int rc = PMPI_Test(request, flag, status);
    if (p && !*flag) {
        put_back(p);
        return rc;
    }
    int finished = finish(p, status);
    return rc != MPI_SUCCESS ? rc : finished;
}

/* The pending entries of `count` requests (each NULL when it has none), and statuses to
 * complete them with. */
static Pending **take_all(int count, MPI_Request requests[], MPI_Status **statuses) {
    if (!__atomic_load_n(&pending_count, __ATOMIC_ACQUIRE) || count <= 0) return NULL;
    Pending **taken = calloc((size_t)count, sizeof *taken);
    int any = 0;
    for (int i = 0; taken && i < count; ++i) any |= (taken[i] = take(requests[i])) != NULL;
    if (!any) {
        free(taken);
        return NULL;
    }
    if (*statuses == MPI_STATUSES_IGNORE) *statuses = calloc((size_t)count, sizeof(MPI_Status));
    return taken;
}

/* The requests rgpu lets complete now: a copy where direct sends still waiting for their
 * receiver are MPI_REQUEST_NULL (NULL when there is none such); `masked` says whether any was. */
static MPI_Request *unmasked(int count, MPI_Request requests[], Pending **taken, int *masked) {
    *masked = 0;
    if (!taken) return NULL;
    MPI_Request *copy = NULL;
    for (int i = 0; i < count; ++i) {
        advance(taken[i]);
        if (ready(taken[i])) continue;
        taken[i]->masked = 1;
        if (!copy) {
            copy = malloc((size_t)count * sizeof *copy);
            if (!copy) abort();
            memcpy(copy, requests, (size_t)count * sizeof *copy);
        }
        copy[i] = MPI_REQUEST_NULL;
        *masked = 1;
    }
    return copy;
}

/* Copies back what MPI did to the requests it was given (the masked ones stay as they were). */
static void unmask(int count, MPI_Request requests[], MPI_Request *copy, Pending **taken) {
    if (!copy) return;
    for (int i = 0; i < count; ++i) {
        if (taken[i] && taken[i]->masked)
            taken[i]->masked = 0;
        else
            requests[i] = copy[i];
    }
    free(copy);
}

/* Waits for the requests in rounds: what has completed by then is finished (its direct
 * messages pulled in one batch) while the rest are still coming, so that the pulls of a window
 * of messages overlap its sending; the next round takes what came meanwhile. Direct sends are
 * finished last, once every receive has been (and its sender told): a send waits for its
 * receiver's word, which the receiver gives when it finishes its receives, so a rank waiting
 * on a send before its own receives could wait for a peer doing the same. */
static int wait_in_rounds(int count, MPI_Request requests[], MPI_Status statuses[],
                          Pending **taken) {
    int *indices = malloc((size_t)count * sizeof *indices);
    MPI_Status *got = malloc((size_t)count * sizeof *got);
    Pending **round = malloc((size_t)count * sizeof *round);
    if (!indices || !got || !round) {
        free(indices), free(got), free(round);
        int rc = PMPI_Waitall(count, requests, statuses);
        pull_ahead(taken, count, statuses);
        for (int i = 0; i < count; ++i)
            if (!taken[i] || taken[i]->kind != SEND_DIRECT) {
                int finished = finish(taken[i], &statuses[i]);
                if (rc == MPI_SUCCESS) rc = finished;
                taken[i] = NULL;
            }
        return rc;
    }
    int rc = MPI_SUCCESS;
    for (;;) {
        int n = 0;
        int waited = PMPI_Waitsome(count, requests, &n, indices, got);
        if (waited != MPI_SUCCESS && rc == MPI_SUCCESS) rc = waited;
        if (n == MPI_UNDEFINED || n <= 0) break;
        for (int j = 0; j < n; ++j) {
            statuses[indices[j]] = got[j];
            round[j] = taken[indices[j]];
        }
        pull_ahead(round, n, got);
        for (int j = 0; j < n; ++j) {
            int i = indices[j];
            if (taken[i] && taken[i]->kind == SEND_DIRECT) continue;
            int finished = finish(taken[i], &statuses[i]);
            if (rc == MPI_SUCCESS) rc = finished;
            taken[i] = NULL;
        }
    }
    free(indices);
    free(got);
    free(round);
    return rc;
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
    MPI_Status *given = statuses;
    Pending **taken = take_all(count, requests, &statuses);
    if (!taken) return PMPI_Waitall(count, requests, statuses);
    int rc = wait_in_rounds(count, requests, statuses, taken);
    for (int i = 0; i < count; ++i) {
        if (!taken[i]) continue;
        int finished = finish(taken[i], &statuses[i]);
        if (rc == MPI_SUCCESS) rc = finished;
    }
    free(taken);
    if (given == MPI_STATUSES_IGNORE) free(statuses);
    return rc;
}

int MPI_Testall(int count, MPI_Request requests[], int *flag, MPI_Status statuses[]) {
    MPI_Status *given = statuses;
    Pending **taken = take_all(count, requests, &statuses);
    int masked = 0, rc = MPI_SUCCESS;
    MPI_Request *copy = unmasked(count, requests, taken, &masked);
    unmask(count, requests, copy, taken);
    if (masked) {
        *flag = 0;
    } else {
        rc = PMPI_Testall(count, requests, flag, statuses);
    }
    if (!taken) return rc;
    if (*flag) pull_ahead(taken, count, statuses);
    for (int i = 0; i < count; ++i) {
        if (!taken[i]) continue;
        if (*flag) {
            int finished = finish(taken[i], &statuses[i]);
            if (rc == MPI_SUCCESS) rc = finished;
        } else {
            put_back(taken[i]);
        }
    }
    free(taken);
    if (given == MPI_STATUSES_IGNORE) free(statuses);
    return rc;
}

/* After an "any" call: the request at `index` (when `done`) is finished, the others' entries go
 * back to the list. */
static int finish_one(Pending **taken, int count, int done, int index, MPI_Status *status,
                      MPI_Status *scratch, int rc) {
    if (!taken) return rc;
    for (int i = 0; i < count; ++i) {
        if (!taken[i]) continue;
        if (done && i == index) {
            int finished = finish(taken[i], status);
            if (rc == MPI_SUCCESS) rc = finished;
        } else {
            put_back(taken[i]);
        }
    }
    free(taken);
    if (scratch != MPI_STATUSES_IGNORE) free(scratch);
    return rc;
}

int MPI_Testany(int count, MPI_Request requests[], int *index, int *flag, MPI_Status *status) {
    MPI_Status *scratch = MPI_STATUSES_IGNORE;
    Pending **taken = take_all(count, requests, &scratch);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    int masked = 0;
    MPI_Request *copy = unmasked(count, requests, taken, &masked);
    int rc = PMPI_Testany(count, copy ? copy : requests, index, flag, status);
    unmask(count, requests, copy, taken);
    if (masked && *flag && *index == MPI_UNDEFINED) *flag = 0; /* only masked ones were left */
    return finish_one(taken, count, *flag && *index != MPI_UNDEFINED, *index, status, scratch, rc);
}

int MPI_Waitany(int count, MPI_Request requests[], int *index, MPI_Status *status) {
    /* With direct sends waiting for their receivers, poll: one of them may be what completes. */
    for (;;) {
        int flag = 0;
        int rc = MPI_Testany(count, requests, index, &flag, status);
        if (rc != MPI_SUCCESS || flag) return rc;
        int any_left = 0;
        for (int i = 0; i < count; ++i) any_left |= requests[i] != MPI_REQUEST_NULL;
        if (!any_left) {
            *index = MPI_UNDEFINED;
            return MPI_SUCCESS;
        }
        if (!__atomic_load_n(&pending_count, __ATOMIC_ACQUIRE)) {
            /* Nothing of rgpu's among them any more: MPI's own wait. */
            return PMPI_Waitany(count, requests, index, status);
        }
    }
}

int MPI_Waitsome(int incount, MPI_Request requests[], int *outcount, int indices[],
                 MPI_Status statuses[]) {
    /* One at a time, as Waitany: at least one completes, which is what Waitsome promises. */
    MPI_Status status;
    int index = MPI_UNDEFINED;
    int rc = MPI_Waitany(incount, requests, &index, &status);
    if (index == MPI_UNDEFINED) {
        *outcount = MPI_UNDEFINED;
        return rc;
    }
    *outcount = 1;
    indices[0] = index;
    if (statuses != MPI_STATUSES_IGNORE) statuses[0] = status;
    return rc;
}

int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                 void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                 MPI_Comm comm, MPI_Status *status) {
    Buffer s = classify(sendbuf, sendcount, sendtype), r = classify(recvbuf, recvcount, recvtype);
    if (s.kind == HOST && r.kind == HOST && capacity_of(recvcount, recvtype) < DIRECT_MIN)
        return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                             recvtype, source, recvtag, comm, status);
    MPI_Request requests[2];
    MPI_Status statuses[2];
    int rc = MPI_Irecv(recvbuf, recvcount, recvtype, source, recvtag, comm, &requests[0]);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Isend(sendbuf, sendcount, sendtype, dest, sendtag, comm, &requests[1]);
    if (rc != MPI_SUCCESS) {
        MPI_Cancel(&requests[0]);
        MPI_Wait(&requests[0], MPI_STATUS_IGNORE);
        return rc;
    }
    rc = MPI_Waitall(2, requests, statuses);
    if (status != MPI_STATUS_IGNORE) *status = statuses[0];
    return rc;
}

/* ---- collectives ----------------------------------------------------------------------------- */

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    Buffer b = classify(buf, count, type);
    NcclComm on_nccl = nccl_decide(1, b.kind == CUDA, comm);
    if (on_nccl)
        return nccl_finish(nccl.broadcast(buf, buf, b.bytes, NCCL_UINT8, root, on_nccl, NULL), comm);
    if (b.kind == HOST) return PMPI_Bcast(buf, count, type, root, comm);
    int rank = 0, rc = MPI_SUCCESS;
    PMPI_Comm_rank(comm, &rank);
    void *host = staging_get(b.bytes);
    if (!host) return device_error(comm, "allocating host staging", -1);
    if (rank == root) rc = to_host(&b, host, b.bytes, comm);
    if (rc == MPI_SUCCESS) rc = PMPI_Bcast(host, (int)b.bytes, MPI_BYTE, root, comm);
    if (rc == MPI_SUCCESS && rank != root) rc = to_device(&b, host, b.bytes, comm);
    staging_put(host);
    return rc;
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm) {
    Buffer r = classify(recvbuf, count, type);
    Buffer s = sendbuf == MPI_IN_PLACE ? r : classify(sendbuf, count, type);
    int datatype = nccl_type(r.base);
    NcclComm on_nccl =
        nccl_decide(nccl_op(op) >= 0, s.kind == CUDA && r.kind == CUDA && datatype >= 0, comm);
    if (on_nccl) {
        const void *from = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
        return nccl_finish(nccl.all_reduce(from, recvbuf, (size_t)count, datatype, nccl_op(op),
                                           on_nccl, NULL),
                           comm);
    }
    if (s.kind == HOST && r.kind == HOST) return PMPI_Allreduce(sendbuf, recvbuf, count, type, op,
        comm);
    int size = 0, rc = MPI_SUCCESS;
    PMPI_Type_size(type, &size);
    size_t bytes = (size_t)size * (size_t)count;
    /* The reduction runs on host copies, in the base type (the attribute does not matter to
     * MPI's arithmetic). */
    void *host_send = NULL, *host_recv = r.kind == HOST ? recvbuf : staging_get(bytes);
    if (!host_recv) return device_error(comm, "allocating host staging", -1);
    const void *send = sendbuf;
    if (sendbuf == MPI_IN_PLACE) {
        if (r.kind != HOST) rc = to_host(&r, host_recv, bytes, comm);
    } else if (s.kind != HOST) {
        host_send = staging_get(bytes);
        if (!host_send) rc = device_error(comm, "allocating host staging", -1);
        else rc = to_host(&s, host_send, bytes, comm);
        send = host_send;
    }
    MPI_Datatype base = r.kind != HOST ? r.base : s.base;
    if (rc == MPI_SUCCESS) rc = PMPI_Allreduce(send, host_recv, count, base, op, comm);
    if (rc == MPI_SUCCESS && r.kind != HOST) rc = to_device(&r, host_recv, bytes, comm);
    staging_put(host_send);
    if (r.kind != HOST) staging_put(host_recv);
    return rc;
}

/* ---- more collectives, staged through host memory -------------------------------------------
 * Each buffer argument that is device memory is copied to host staging (when the call reads
 * it), the real MPI runs on host memory with the plain datatype, and the results are copied
 * back to the device (when the call writes them). */

/* One buffer argument of a collective as the real MPI gets it. */
typedef struct {
    Buffer b;
    void *host;        /* the program's pointer (host memory), else staging */
    MPI_Datatype type; /* the datatype without rgpu's mark */
} Arg;

/* `count` elements of `type` at `buf`, which the call reads when `reads`. */
static int arg_stage(Arg *a, const void *buf, size_t count, MPI_Datatype type, int reads,
                     MPI_Comm comm) {
    a->b = classify(buf, count > INT32_MAX ? INT32_MAX : (int)count, type);
    a->host = (void *)buf;
    a->type = a->b.base;
    if (a->b.kind == HOST) return MPI_SUCCESS;
    int size = 0;
    PMPI_Type_size(type, &size);
    a->b.bytes = (size_t)size * count;
    a->host = staging_get(a->b.bytes);
    if (!a->host) return device_error(comm, "allocating host staging", -1);
    return reads ? to_host(&a->b, a->host, a->b.bytes, comm) : MPI_SUCCESS;
}

/* After the call: its results back to the device (when it wrote them, and it succeeded). */
static int arg_unstage(Arg *a, int writes, int rc, MPI_Comm comm) {
    if (a->b.kind == HOST) return rc;
    if (rc == MPI_SUCCESS && writes) rc = to_device(&a->b, a->host, a->b.bytes, comm);
    staging_put(a->host);
    return rc;
}

/* An argument the call does not look at on this rank (a root-only buffer elsewhere). */
static Arg arg_unused(const void *buf, MPI_Datatype type) {
    Arg a = {{HOST, (void *)buf, NULL, 0, type}, (void *)buf, type};
    return a;
}

/* The send and receive arguments of a rooted or all-to-all collective; `send_in_place`: the
 * send buffer is MPI_IN_PLACE, so the receive buffer is read too. */
static int stage_pair(Arg *s, const void *sendbuf, size_t scount, MPI_Datatype stype, Arg *r,
                      void *recvbuf, size_t rcount, MPI_Datatype rtype, int send_used,
                      int recv_used, MPI_Comm comm) {
    int in_place = sendbuf == MPI_IN_PLACE;
    *s = send_used && !in_place ? arg_unused(NULL, stype) : arg_unused(sendbuf, stype);
    *r = arg_unused(recvbuf, rtype);
    int rc = MPI_SUCCESS;
    if (send_used && !in_place) rc = arg_stage(s, sendbuf, scount, stype, 1, comm);
    if (rc == MPI_SUCCESS && recv_used)
        rc = arg_stage(r, recvbuf, rcount, rtype, in_place, comm);
    return rc;
}

/* Whether neither argument is device memory (the call goes to the real MPI unchanged). */
static int both_host(const void *sendbuf, size_t scount, MPI_Datatype stype, int send_used,
                     const void *recvbuf, size_t rcount, MPI_Datatype rtype, int recv_used) {
    int s = !send_used || sendbuf == MPI_IN_PLACE ||
            classify(sendbuf, (int)(scount > INT32_MAX ? INT32_MAX : scount), stype).kind == HOST;
    int r = !recv_used ||
            classify(recvbuf, (int)(rcount > INT32_MAX ? INT32_MAX : rcount), rtype).kind == HOST;
    return s && r;
}

int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
               int root, MPI_Comm comm) {
    int at_root = comm_rank(comm) == root;
    /* In place (at the root), the receive buffer is the send buffer too. */
    const void *from = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    Buffer source = classify(from, count, type);
    int datatype = nccl_type(source.base);
    int device = source.kind == CUDA && datatype >= 0 &&
                 (!at_root || classify(recvbuf, count, type).kind == CUDA);
    NcclComm on_nccl = nccl_decide(nccl_op(op) >= 0, device, comm);
    if (on_nccl)
        return nccl_finish(nccl.reduce(from, at_root ? recvbuf : NULL, (size_t)count, datatype,
                                       nccl_op(op), root, on_nccl, NULL),
                           comm);
    if (both_host(sendbuf, count, type, 1, recvbuf, count, type, at_root))
        return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, count, type, &r, recvbuf, count, type, 1, at_root, comm);
    MPI_Datatype plain = s.b.kind != HOST ? s.type : r.type;
    if (rc == MPI_SUCCESS) rc = PMPI_Reduce(s.host, r.host, count, plain, op, root, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, at_root, rc, comm);
}

/* Scan and Exscan: every rank's send and receive buffers. */
static int scan(int exclusive, const void *sendbuf, void *recvbuf, int count, MPI_Datatype type,
                MPI_Op op, MPI_Comm comm) {
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, count, type, &r, recvbuf, count, type, 1, 1, comm);
    MPI_Datatype plain = s.b.kind != HOST ? s.type : r.type;
    if (rc == MPI_SUCCESS)
        rc = exclusive ? PMPI_Exscan(s.host, r.host, count, plain, op, comm)
                       : PMPI_Scan(s.host, r.host, count, plain, op, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Scan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
             MPI_Comm comm) {
    if (both_host(sendbuf, count, type, 1, recvbuf, count, type, 1))
        return PMPI_Scan(sendbuf, recvbuf, count, type, op, comm);
    return scan(0, sendbuf, recvbuf, count, type, op, comm);
}

int MPI_Exscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
               MPI_Comm comm) {
    if (both_host(sendbuf, count, type, 1, recvbuf, count, type, 1))
        return PMPI_Exscan(sendbuf, recvbuf, count, type, op, comm);
    return scan(1, sendbuf, recvbuf, count, type, op, comm);
}

int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                             MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    size_t n = (size_t)comm_size(comm), all = n * (size_t)recvcount;
    /* In place, the result is the first recvcount elements of the (whole) receive buffer. */
    size_t rcount = sendbuf == MPI_IN_PLACE ? all : (size_t)recvcount;
    if (both_host(sendbuf, all, type, 1, recvbuf, rcount, type, 1))
        return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, all, type, &r, recvbuf, rcount, type, 1, 1, comm);
    MPI_Datatype plain = s.b.kind != HOST ? s.type : r.type;
    if (rc == MPI_SUCCESS) rc = PMPI_Reduce_scatter_block(s.host, r.host, recvcount, plain, op,
        comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Gather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
               int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
    int at_root = comm_rank(comm) == root;
    size_t all = (size_t)comm_size(comm) * (size_t)recvcount;
    if (both_host(sendbuf, sendcount, sendtype, 1, recvbuf, all, recvtype, at_root))
        return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sendcount, sendtype, &r, recvbuf, all, recvtype, 1, at_root,
                        comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Gather(s.host, sendcount, s.type, r.host, recvcount, r.type, root, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, at_root, rc, comm);
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    size_t all = (size_t)comm_size(comm) * (size_t)recvcount;
    /* Each rank's part, in bytes; in place, it is already at its place in the receive buffer. */
    int rsize = 0;
    PMPI_Type_size(recvtype, &rsize);
    size_t part = (size_t)rsize * (size_t)recvcount;
    int in_place = sendbuf == MPI_IN_PLACE;
    const void *from = in_place ? (const char *)recvbuf + part * (size_t)comm_rank(comm) : sendbuf;
    int device = classify(recvbuf, (int)(all > INT32_MAX ? INT32_MAX : all), recvtype).kind == CUDA &&
                 (in_place || classify(sendbuf, sendcount, sendtype).kind == CUDA);
    NcclComm on_nccl = nccl_decide(1, device, comm);
    if (on_nccl)
        return nccl_finish(nccl.all_gather(from, recvbuf, part, NCCL_UINT8, on_nccl, NULL), comm);
    if (both_host(sendbuf, sendcount, sendtype, 1, recvbuf, all, recvtype, 1))
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sendcount, sendtype, &r, recvbuf, all, recvtype, 1, 1, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Allgather(s.host, sendcount, s.type, r.host, recvcount, r.type, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Scatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
    int at_root = comm_rank(comm) == root;
    size_t all = (size_t)comm_size(comm) * (size_t)sendcount;
    /* At the root, MPI_IN_PLACE is the receive buffer: the root keeps its part in sendbuf. */
    int recv_used = recvbuf != MPI_IN_PLACE;
    if (both_host(sendbuf, all, sendtype, at_root, recvbuf, recvcount, recvtype, recv_used))
        return PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    Arg s = arg_unused(sendbuf, sendtype), r = arg_unused(recvbuf, recvtype);
    int rc = at_root ? arg_stage(&s, sendbuf, all, sendtype, 1, comm) : MPI_SUCCESS;
    if (rc == MPI_SUCCESS && recv_used) rc = arg_stage(&r, recvbuf, recvcount, recvtype, 0, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Scatter(s.host, sendcount, s.type, r.host, recvcount, r.type, root, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, recv_used, rc, comm);
}

int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    size_t n = (size_t)comm_size(comm);
    size_t sall = n * (size_t)sendcount, rall = n * (size_t)recvcount;
    if (both_host(sendbuf, sall, sendtype, 1, recvbuf, rall, recvtype, 1))
        return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sall, sendtype, &r, recvbuf, rall, recvtype, 1, 1, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Alltoall(s.host, sendcount, s.type, r.host, recvcount, r.type, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

/* The elements a v-collective's buffer spans: the furthest displs[i] + counts[i] over n ranks. */
static size_t v_span(const int counts[], const int displs[], int n) {
    size_t span = 0;
    for (int i = 0; counts && displs && i < n; ++i) {
        size_t end = (size_t)(displs[i] < 0 ? 0 : displs[i]) + (size_t)(counts[i] < 0 ? 0 : counts[i]);
        if (end > span) span = end;
    }
    return span;
}

static size_t v_sum(const int counts[], int n) {
    size_t sum = 0;
    for (int i = 0; counts && i < n; ++i) sum += (size_t)(counts[i] < 0 ? 0 : counts[i]);
    return sum;
}

int MPI_Gatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                MPI_Comm comm) {
    int at_root = comm_rank(comm) == root;
    size_t span = at_root ? v_span(recvcounts, displs, comm_size(comm)) : 0;
    if (both_host(sendbuf, sendcount, sendtype, 1, recvbuf, span, recvtype, at_root))
        return PMPI_Gatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                            root, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sendcount, sendtype, &r, recvbuf, span, recvtype, 1, at_root,
                        comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Gatherv(s.host, sendcount, s.type, r.host, recvcounts, displs, r.type, root,
                          comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, at_root, rc, comm);
}

int MPI_Allgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                   MPI_Comm comm) {
    size_t span = v_span(recvcounts, displs, comm_size(comm));
    if (both_host(sendbuf, sendcount, sendtype, 1, recvbuf, span, recvtype, 1))
        return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                               recvtype, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sendcount, sendtype, &r, recvbuf, span, recvtype, 1, 1, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Allgatherv(s.host, sendcount, s.type, r.host, recvcounts, displs, r.type, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Scatterv(const void *sendbuf, const int sendcounts[], const int displs[],
                 MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                 int root, MPI_Comm comm) {
    int at_root = comm_rank(comm) == root;
    size_t span = at_root ? v_span(sendcounts, displs, comm_size(comm)) : 0;
    int recv_used = recvbuf != MPI_IN_PLACE;
    if (both_host(sendbuf, span, sendtype, at_root, recvbuf, recvcount, recvtype, recv_used))
        return PMPI_Scatterv(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype,
                             root, comm);
    Arg s = arg_unused(sendbuf, sendtype), r = arg_unused(recvbuf, recvtype);
    int rc = at_root ? arg_stage(&s, sendbuf, span, sendtype, 1, comm) : MPI_SUCCESS;
    if (rc == MPI_SUCCESS && recv_used) rc = arg_stage(&r, recvbuf, recvcount, recvtype, 0, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Scatterv(s.host, sendcounts, displs, s.type, r.host, recvcount, r.type, root,
                           comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, recv_used, rc, comm);
}

int MPI_Alltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[],
                  MPI_Datatype sendtype, void *recvbuf, const int recvcounts[],
                  const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm) {
    int n = comm_size(comm);
    size_t sspan = v_span(sendcounts, sdispls, n), rspan = v_span(recvcounts, rdispls, n);
    if (both_host(sendbuf, sspan, sendtype, 1, recvbuf, rspan, recvtype, 1))
        return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                              rdispls, recvtype, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, sspan, sendtype, &r, recvbuf, rspan, recvtype, 1, 1, comm);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Alltoallv(s.host, sendcounts, sdispls, s.type, r.host, recvcounts, rdispls,
                            r.type, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Reduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[],
                       MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    int n = comm_size(comm);
    size_t all = v_sum(recvcounts, n);
    /* In place, the result is this rank's block at the start of the (whole) receive buffer. */
    size_t rcount = sendbuf == MPI_IN_PLACE ? all : (size_t)recvcounts[comm_rank(comm)];
    if (both_host(sendbuf, all, type, 1, recvbuf, rcount, type, 1))
        return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, type, op, comm);
    Arg s, r;
    int rc = stage_pair(&s, sendbuf, all, type, &r, recvbuf, rcount, type, 1, 1, comm);
    MPI_Datatype plain = s.b.kind != HOST ? s.type : r.type;
    if (rc == MPI_SUCCESS) rc = PMPI_Reduce_scatter(s.host, r.host, recvcounts, plain, op, comm);
    rc = arg_unstage(&s, 0, rc, comm);
    return arg_unstage(&r, 1, rc, comm);
}

int MPI_Ssend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Ssend(buf, count, type, dest, tag, comm);
    return send_device(&b, dest, tag, comm, 1);
}

/* ---- calls rgpu does not handle: refused on device buffers -----------------------------------
 * The real MPI would read or write a device address as host memory (garbage, or a crash); a
 * device buffer here is an MPI error with a message instead. */

static int refuse_device(const char *call, const void *buf, int count, MPI_Datatype type,
                         MPI_Comm comm) {
    if (buf == NULL || classify(buf, count, type).kind == HOST) return MPI_SUCCESS;
    fprintf(stderr, "rgpu: %s on a device buffer is not supported (use MPI_Send/Recv, "
                    "collectives, or stage it through host memory)\n", call);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_BUFFER);
    return MPI_ERR_BUFFER;
}

/* Returns the refusal's error, else what the real MPI call returns (made only then). */
#define UNLESS_REFUSED(refusal, call)                                                             \
    do {                                                                                          \
        int refused_ = (refusal);                                                                 \
        return refused_ != MPI_SUCCESS ? refused_ : (call);                                       \
    } while (0)

#define REFUSED_SEND(name, ...)                                                                   \
    int MPI_##name(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm \
                   __VA_ARGS__)

REFUSED_SEND(Rsend) {
    UNLESS_REFUSED(refuse_device("MPI_Rsend", buf, count, type, comm),
                   PMPI_Rsend(buf, count, type, dest, tag, comm));
}
REFUSED_SEND(Bsend) {
    UNLESS_REFUSED(refuse_device("MPI_Bsend", buf, count, type, comm),
                   PMPI_Bsend(buf, count, type, dest, tag, comm));
}
REFUSED_SEND(Issend, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Issend", buf, count, type, comm),
                   PMPI_Issend(buf, count, type, dest, tag, comm, request));
}
REFUSED_SEND(Irsend, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Irsend", buf, count, type, comm),
                   PMPI_Irsend(buf, count, type, dest, tag, comm, request));
}
REFUSED_SEND(Ibsend, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Ibsend", buf, count, type, comm),
                   PMPI_Ibsend(buf, count, type, dest, tag, comm, request));
}
REFUSED_SEND(Send_init, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Send_init", buf, count, type, comm),
                   PMPI_Send_init(buf, count, type, dest, tag, comm, request));
}
REFUSED_SEND(Ssend_init, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Ssend_init", buf, count, type, comm),
                   PMPI_Ssend_init(buf, count, type, dest, tag, comm, request));
}

int MPI_Recv_init(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
                  MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Recv_init", buf, count, type, comm),
                   PMPI_Recv_init(buf, count, type, source, tag, comm, request));
}

int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype type, int dest, int sendtag,
                         int source, int recvtag, MPI_Comm comm, MPI_Status *status) {
    UNLESS_REFUSED(refuse_device("MPI_Sendrecv_replace", buf, count, type, comm),
                   PMPI_Sendrecv_replace(buf, count, type, dest, sendtag, source, recvtag, comm,
                                         status));
}

int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
               MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Ibcast", buf, count, type, comm),
                   PMPI_Ibcast(buf, count, type, root, comm, request));
}

int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request *request) {
    int rc = refuse_device("MPI_Iallreduce", sendbuf == MPI_IN_PLACE ? NULL : sendbuf, count,
                           type, comm);
    if (rc == MPI_SUCCESS) rc = refuse_device("MPI_Iallreduce", recvbuf, count, type, comm);
    return rc != MPI_SUCCESS ? rc : PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm,
                                                    request);
}

int MPI_Ireduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                int root, MPI_Comm comm, MPI_Request *request) {
    int rc = refuse_device("MPI_Ireduce", sendbuf == MPI_IN_PLACE ? NULL : sendbuf, count, type,
                           comm);
    if (rc == MPI_SUCCESS && comm_rank(comm) == root)
        rc = refuse_device("MPI_Ireduce", recvbuf, count, type, comm);
    return rc != MPI_SUCCESS ? rc
                             : PMPI_Ireduce(sendbuf, recvbuf, count, type, op, root, comm, request);
}

int MPI_Put(const void *origin, int origin_count, MPI_Datatype origin_type, int target_rank,
            MPI_Aint target_disp, int target_count, MPI_Datatype target_type, MPI_Win win) {
    if (classify(origin, origin_count, origin_type).kind != HOST) {
        fprintf(stderr, "rgpu: MPI_Put from a device buffer is not supported\n");
        PMPI_Win_call_errhandler(win, MPI_ERR_BUFFER);
        return MPI_ERR_BUFFER;
    }
    return PMPI_Put(origin, origin_count, origin_type, target_rank, target_disp, target_count,
                    target_type, win);
}

int MPI_Get(void *origin, int origin_count, MPI_Datatype origin_type, int target_rank,
            MPI_Aint target_disp, int target_count, MPI_Datatype target_type, MPI_Win win) {
    if (classify(origin, origin_count, origin_type).kind != HOST) {
        fprintf(stderr, "rgpu: MPI_Get into a device buffer is not supported\n");
        PMPI_Win_call_errhandler(win, MPI_ERR_BUFFER);
        return MPI_ERR_BUFFER;
    }
    return PMPI_Get(origin, origin_count, origin_type, target_rank, target_disp, target_count,
                    target_type, win);
}

/* Non-blocking and persistent collectives, matched receives and accumulates: refused on
 * device buffers (each buffer checked by its address). */

static int refuse_pair(const char *call, const void *a, MPI_Datatype atype, const void *b,
                       MPI_Datatype btype, MPI_Comm comm) {
    int rc = refuse_device(call, a == MPI_IN_PLACE ? NULL : a, 1, atype, comm);
    if (rc == MPI_SUCCESS) rc = refuse_device(call, b == MPI_IN_PLACE ? NULL : b, 1, btype, comm);
    return rc;
}

int MPI_Igather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Igather", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Igather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                comm, req));
}

int MPI_Iallgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iallgather", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                   comm, req));
}

int MPI_Iscatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                 MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iscatter", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Iscatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                 comm, req));
}

int MPI_Ialltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Ialltoall", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Ialltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                  comm, req));
}

int MPI_Igatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                 MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Igatherv", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Igatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                 recvtype, root, comm, req));
}

int MPI_Iallgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                    const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                    MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iallgatherv", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                    recvtype, comm, req));
}

int MPI_Iscatterv(const void *sendbuf, const int sendcounts[], const int displs[],
                  MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                  int root, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iscatterv", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Iscatterv(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount,
                                  recvtype, root, comm, req));
}

int MPI_Ialltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[],
                   MPI_Datatype sendtype, void *recvbuf, const int recvcounts[],
                   const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Ialltoallv", sendbuf, sendtype, recvbuf, recvtype, comm),
                   PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                   rdispls, recvtype, comm, req));
}

int MPI_Iscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
              MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iscan", sendbuf, type, recvbuf, type, comm),
                   PMPI_Iscan(sendbuf, recvbuf, count, type, op, comm, req));
}

int MPI_Iexscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Iexscan", sendbuf, type, recvbuf, type, comm),
                   PMPI_Iexscan(sendbuf, recvbuf, count, type, op, comm, req));
}

int MPI_Ireduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                              MPI_Datatype type, MPI_Op op, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Ireduce_scatter_block", sendbuf, type, recvbuf, type, comm),
                   PMPI_Ireduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm, req));
}

int MPI_Ireduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[],
                        MPI_Datatype type, MPI_Op op, MPI_Comm comm, MPI_Request *req) {
    UNLESS_REFUSED(refuse_pair("MPI_Ireduce_scatter", sendbuf, type, recvbuf, type, comm),
                   PMPI_Ireduce_scatter(sendbuf, recvbuf, recvcounts, type, op, comm, req));
}

REFUSED_SEND(Bsend_init, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Bsend_init", buf, count, type, comm),
                   PMPI_Bsend_init(buf, count, type, dest, tag, comm, request));
}
REFUSED_SEND(Rsend_init, , MPI_Request *request) {
    UNLESS_REFUSED(refuse_device("MPI_Rsend_init", buf, count, type, comm),
                   PMPI_Rsend_init(buf, count, type, dest, tag, comm, request));
}

int MPI_Mrecv(void *buf, int count, MPI_Datatype type, MPI_Message *message, MPI_Status *status) {
    if (classify(buf, count, type).kind != HOST) {
        fprintf(stderr, "rgpu: MPI_Mrecv into a device buffer is not supported\n");
        return MPI_ERR_BUFFER;
    }
    return PMPI_Mrecv(buf, count, type, message, status);
}

int MPI_Imrecv(void *buf, int count, MPI_Datatype type, MPI_Message *message,
               MPI_Request *request) {
    if (classify(buf, count, type).kind != HOST) {
        fprintf(stderr, "rgpu: MPI_Imrecv into a device buffer is not supported\n");
        return MPI_ERR_BUFFER;
    }
    return PMPI_Imrecv(buf, count, type, message, request);
}

int MPI_Accumulate(const void *origin, int origin_count, MPI_Datatype origin_type,
                   int target_rank, MPI_Aint target_disp, int target_count,
                   MPI_Datatype target_type, MPI_Op op, MPI_Win win) {
    if (classify(origin, origin_count, origin_type).kind != HOST) {
        fprintf(stderr, "rgpu: MPI_Accumulate from a device buffer is not supported\n");
        PMPI_Win_call_errhandler(win, MPI_ERR_BUFFER);
        return MPI_ERR_BUFFER;
    }
    return PMPI_Accumulate(origin, origin_count, origin_type, target_rank, target_disp,
                           target_count, target_type, op, win);
}
