/* librgpu_mpi.so: MPI calls on rgpu device buffers, through the PMPI profiling interface
 * (rgpu_mpi.h says how programs use it).
 *
 * Point-to-point calls (MPI_Send, MPI_Recv, MPI_Isend, MPI_Irecv, MPI_Sendrecv and the
 * MPI_Wait and MPI_Test families) and MPI_Bcast and MPI_Allreduce look at each buffer:
 *
 * - host memory goes to the real MPI as it is (the check is one call into rgpu's libcuda,
 *   answered from its own tables, and nothing at all before CUDA is initialized);
 * - a CUDA device buffer (recognised by address: rgpu's libcuda registers its entry points
 *   here at cuInit) or an OpenCL buffer (a cl_mem, marked by its datatype) is staged through
 *   host memory: read from its device before a send, written to it when a receive completes.
 *   Both sides decide alone, so device and host buffers mix freely (device -> host,
 *   host -> device).
 *
 * A failed device copy is reported as an MPI error through the communicator's error handler,
 * with a message on stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_mpi.h"

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

/* Copies a device buffer's first `bytes` into host memory. */
static int to_host(const Buffer *b, void *host, size_t bytes, MPI_Comm comm) {
    int rc = 0;
    if (bytes == 0) return MPI_SUCCESS;
    if (b->kind == CUDA) {
        rc = cuda.dtoh(host, (uint64_t)(uintptr_t)b->address, bytes);
        if (rc) return device_error(comm, "reading a CUDA buffer", rc);
    } else {
        pthread_once(&opencl_once, find_opencl);
        rc = opencl.read ? opencl.read(b->queue, b->address, 1, 0, bytes, host, 0, NULL, NULL) : -1;
        if (rc) return device_error(comm, "reading an OpenCL buffer", rc);
    }
    return MPI_SUCCESS;
}

/* Copies `bytes` of host memory into a device buffer. */
static int to_device(const Buffer *b, const void *host, size_t bytes, MPI_Comm comm) {
    int rc = 0;
    if (bytes == 0) return MPI_SUCCESS;
    if (bytes > b->bytes) bytes = b->bytes;
    if (b->kind == CUDA) {
        rc = cuda.htod((uint64_t)(uintptr_t)b->address, host, bytes);
        if (rc) return device_error(comm, "writing a CUDA buffer", rc);
    } else {
        pthread_once(&opencl_once, find_opencl);
        rc = opencl.write ? opencl.write(b->queue, b->address, 1, 0, bytes, host, 0, NULL, NULL) : -1;
        if (rc) return device_error(comm, "writing an OpenCL buffer", rc);
    }
    return MPI_SUCCESS;
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

/* ---- requests with device work left: receives to write to the device, staging to free ------ */

typedef struct Pending {
    MPI_Request request;
    Buffer device;  /* a receive's destination (kind HOST for a send) */
    void *host;     /* the staging memory */
    MPI_Datatype type;
    MPI_Comm comm;
    struct Pending *next;
} Pending;

static Pending *pending;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
/* Whether any request has device work left: the Wait/Test calls skip the lookups otherwise. */
static int pending_count;

static void remember(MPI_Request request, Buffer device, void *host, MPI_Datatype type, MPI_Comm comm) {
    Pending *p = malloc(sizeof *p);
    if (!p) abort();
    p->request = request;
    p->device = device;
    p->host = host;
    p->type = type;
    p->comm = comm;
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

/* Finishes a completed request: a receive's data goes to its device buffer. */
static int finish(Pending *p, MPI_Status *status) {
    int rc = MPI_SUCCESS;
    if (!p) return rc;
    if (p->device.kind != HOST) {
        int received = 0;
        PMPI_Get_count(status, MPI_BYTE, &received);
        if (received == MPI_UNDEFINED || received < 0) received = 0;
        rc = to_device(&p->device, p->host, (size_t)received, p->comm);
    }
    staging_put(p->host);
    free(p);
    return rc;
}

/* ---- initialization ------------------------------------------------------------------------- */

static int copy_attribute(MPI_Datatype old, int key, void *extra, void *in, void *out, int *flag) {
    (void)old, (void)key, (void)extra;
    *(void **)out = in;
    *flag = 1;
    return MPI_SUCCESS;
}

static void make_keyval(void) {
    if (RGPU_MPI_BUFFER_KEYVAL == MPI_KEYVAL_INVALID)
        PMPI_Type_create_keyval(copy_attribute, MPI_TYPE_NULL_DELETE_FN, &RGPU_MPI_BUFFER_KEYVAL, NULL);
}

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) make_keyval();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) make_keyval();
    return rc;
}

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

int MPI_Send(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Send(buf, count, type, dest, tag, comm);
    int rc;
    void *host = staged_for_send(&b, comm, &rc);
    if (!host) return rc;
    rc = PMPI_Send(host, (int)b.bytes, MPI_BYTE, dest, tag, comm);
    staging_put(host);
    return rc;
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status *status) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Recv(buf, count, type, source, tag, comm, status);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    void *host = staging_get(b.bytes);
    if (!host) return device_error(comm, "allocating host staging", -1);
    int rc = PMPI_Recv(host, (int)b.bytes, MPI_BYTE, source, tag, comm, status);
    if (rc == MPI_SUCCESS) {
        int received = 0;
        PMPI_Get_count(status, MPI_BYTE, &received);
        rc = to_device(&b, host, (size_t)(received > 0 ? received : 0), comm);
    }
    staging_put(host);
    return rc;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *request) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Isend(buf, count, type, dest, tag, comm, request);
    int rc;
    void *host = staged_for_send(&b, comm, &rc);
    if (!host) return rc;
    rc = PMPI_Isend(host, (int)b.bytes, MPI_BYTE, dest, tag, comm, request);
    if (rc != MPI_SUCCESS) {
        staging_put(host);
        return rc;
    }
    Buffer none = {HOST, NULL, NULL, 0, type};
    remember(*request, none, host, type, comm);
    return rc;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
    Buffer b = classify(buf, count, type);
    if (b.kind == HOST) return PMPI_Irecv(buf, count, type, source, tag, comm, request);
    void *host = staging_get(b.bytes);
    if (!host) return device_error(comm, "allocating host staging", -1);
    int rc = PMPI_Irecv(host, (int)b.bytes, MPI_BYTE, source, tag, comm, request);
    if (rc != MPI_SUCCESS) {
        staging_put(host);
        return rc;
    }
    remember(*request, b, host, type, comm);
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

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
    MPI_Status *given = statuses;
    Pending **taken = take_all(count, requests, &statuses);
    int rc = PMPI_Waitall(count, requests, statuses);
    if (!taken) return rc;
    for (int i = 0; i < count; ++i) {
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
    int rc = PMPI_Testall(count, requests, flag, statuses);
    if (!taken) return rc;
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

int MPI_Waitany(int count, MPI_Request requests[], int *index, MPI_Status *status) {
    MPI_Status *scratch = MPI_STATUSES_IGNORE;
    Pending **taken = take_all(count, requests, &scratch);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    int rc = PMPI_Waitany(count, requests, index, status);
    return finish_one(taken, count, 1, *index, status, scratch, rc);
}

int MPI_Testany(int count, MPI_Request requests[], int *index, int *flag, MPI_Status *status) {
    MPI_Status *scratch = MPI_STATUSES_IGNORE;
    Pending **taken = take_all(count, requests, &scratch);
    MPI_Status local;
    if (status == MPI_STATUS_IGNORE) status = &local;
    int rc = PMPI_Testany(count, requests, index, flag, status);
    return finish_one(taken, count, *flag, *index, status, scratch, rc);
}

int MPI_Waitsome(int incount, MPI_Request requests[], int *outcount, int indices[],
                 MPI_Status statuses[]) {
    MPI_Status *given = statuses;
    Pending **taken = take_all(incount, requests, &statuses);
    int rc = PMPI_Waitsome(incount, requests, outcount, indices, statuses);
    if (!taken) return rc;
    for (int k = 0; k < *outcount && *outcount != MPI_UNDEFINED; ++k) {
        int i = indices[k];
        int finished = finish(taken[i], &statuses[k]);
        taken[i] = NULL;
        if (rc == MPI_SUCCESS) rc = finished;
    }
    for (int i = 0; i < incount; ++i)
        if (taken[i]) put_back(taken[i]);
    free(taken);
    if (given == MPI_STATUSES_IGNORE) free(statuses);
    return rc;
}

int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                 void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                 MPI_Comm comm, MPI_Status *status) {
    Buffer s = classify(sendbuf, sendcount, sendtype), r = classify(recvbuf, recvcount, recvtype);
    if (s.kind == HOST && r.kind == HOST)
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
    if (s.kind == HOST && r.kind == HOST) return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
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
