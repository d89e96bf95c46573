// shareable: physical allocations and memory pools shared between processes as POSIX file
// descriptors, as NVIDIA's memMapIPCDrv and streamOrderedAllocationIPC samples do. The parent
// makes a VMM allocation and a pool allocation that allow POSIX descriptors, fills them,
// exports the allocation's and the pool's descriptors and the pool allocation's export data,
// and sends them over a Unix socket (SCM_RIGHTS) to a child (this program run again). The
// child imports the allocation (and reads its properties from the handle), maps it, reads it
// and writes half of it; imports the pool, gives its device access, imports the pointer, reads
// it and writes it; frees and releases what it imported. The parent then sees the child's
// writes. Also: a descriptor that is not a shareable handle is refused.
//
//   nvcc -O2 -o shareable shareable.cu -lcuda && ./shareable
//
// Prints `CHECK` lines, then `PASS shareable`, or `FAIL shareable: why` and exit status 1.
#include <cuda.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "shareable"
#include "check.h"

#define POOL_WORDS (1 << 20)

// What travels with the two descriptors.
struct Message {
    size_t vmm_size;
    CUmemPoolPtrExportData pool_data;
};

static void send_with_fds(int sock, const int fds[2], const void *data, size_t len) {
    struct iovec iov = {(void *)data, len};
    char control[CMSG_SPACE(2 * sizeof(int))] = {};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(2 * sizeof(int));
    memcpy(CMSG_DATA(cmsg), fds, 2 * sizeof(int));
    EXPECT(sendmsg(sock, &msg, 0) == (ssize_t)len, "sendmsg");
}

static void receive_with_fds(int sock, int fds[2], void *data, size_t len) {
    struct iovec iov = {data, len};
    char control[CMSG_SPACE(2 * sizeof(int))] = {};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    EXPECT(recvmsg(sock, &msg, MSG_WAITALL) == (ssize_t)len, "recvmsg");
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    EXPECT(cmsg && cmsg->cmsg_type == SCM_RIGHTS && cmsg->cmsg_len == CMSG_LEN(2 * sizeof(int)),
           "two descriptors came");
    memcpy(fds, CMSG_DATA(cmsg), 2 * sizeof(int));
}

static long long sum_words(CUdeviceptr ptr, size_t words) {
    unsigned *host = (unsigned *)malloc(words * sizeof(unsigned));
    CU(cuMemcpyDtoH(host, ptr, words * sizeof(unsigned)));
    long long sum = 0;
    for (size_t i = 0; i < words; ++i) sum += host[i];
    free(host);
    return sum;
}

static CUmemAccessDesc device_access(CUdevice device) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return access;
}

static CUdevice setup() {
    CU(cuInit(0));
    CUdevice device;
    CU(cuDeviceGet(&device, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, device));
    CU(cuCtxSetCurrent(ctx));
    return device;
}

static int child(int sock) {
    CUdevice device = setup();
    int fds[2];
    Message message;
    receive_with_fds(sock, fds, &message, sizeof message);

    // The physical allocation: imported, described, mapped, read, half rewritten.
    CUmemGenericAllocationHandle handle;
    CU(cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fds[0],
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fds[0]);
    CUmemAllocationProp prop = {};
    CU(cuMemGetAllocationPropertiesFromHandle(&prop, handle));
    printf("CHECK child_properties %d %d %d %d\n", (int)prop.type, (int)prop.location.type,
           prop.location.id, (int)prop.requestedHandleTypes);
    size_t size = message.vmm_size;
    CUdeviceptr va;
    CU(cuMemAddressReserve(&va, size, 0, 0, 0));
    CU(cuMemMap(va, size, 0, handle, 0));
    CUmemAccessDesc access = device_access(device);
    CU(cuMemSetAccess(va, size, &access, 1));
    printf("CHECK child_vmm_read %lld\n", sum_words(va, size / 4));
    CU(cuMemsetD32(va, 9, size / 8));
    CU(cuCtxSynchronize());
    CU(cuMemUnmap(va, size));
    CU(cuMemRelease(handle));
    CU(cuMemAddressFree(va, size));

    // The pool: imported, made accessible, its allocation imported, read, rewritten, freed.
    CUmemoryPool pool;
    CU(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fds[1],
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(fds[1]);
    CU(cuMemPoolSetAccess(pool, &access, 1));
    CUdeviceptr ptr;
    CU(cuMemPoolImportPointer(&ptr, pool, &message.pool_data));
    printf("CHECK child_pool_read %lld\n", sum_words(ptr, POOL_WORDS));
    CU(cuMemsetD32(ptr, 13, POOL_WORDS));
    CU(cuCtxSynchronize());
    CU(cuMemFreeAsync(ptr, 0));
    CU(cuCtxSynchronize());
    CU(cuMemPoolDestroy(pool));
    fflush(stdout);
    char done = 1;
    EXPECT(write(sock, &done, 1) == 1, "telling the parent");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0) return child(atoi(argv[2]));
    CUdevice device = setup();

    // A physical allocation that may be shared as a POSIX descriptor, filled with 7s.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity;
    CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = 2 * granularity;
    CUmemGenericAllocationHandle handle;
    CU(cuMemCreate(&handle, size, &prop, 0));
    CUdeviceptr va;
    CU(cuMemAddressReserve(&va, size, 0, 0, 0));
    CU(cuMemMap(va, size, 0, handle, 0));
    CUmemAccessDesc access = device_access(device);
    CU(cuMemSetAccess(va, size, &access, 1));
    CU(cuMemsetD32(va, 7, size / 4));
    int fds[2];
    CU(cuMemExportToShareableHandle(&fds[0], handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int again;
    CU(cuMemExportToShareableHandle(&again, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("CHECK exported_twice %d\n", again >= 0 && again != fds[0]);
    close(again);

    // A pool whose allocations may be shared, and an allocation from it filled with 11s.
    CUmemPoolProps pool_props = {};
    pool_props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pool_props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pool_props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pool_props.location.id = device;
    CUmemoryPool pool;
    CU(cuMemPoolCreate(&pool, &pool_props));
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr pooled;
    CU(cuMemAllocFromPoolAsync(&pooled, POOL_WORDS * 4, pool, stream));
    CU(cuMemsetD32Async(pooled, 11, POOL_WORDS, stream));
    CU(cuStreamSynchronize(stream));
    CU(cuMemPoolExportToShareableHandle(&fds[1], pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    Message message = {};
    message.vmm_size = size;
    CU(cuMemPoolExportPointer(&message.pool_data, pooled));

    // A descriptor that is no shareable handle (a pipe's) is refused.
    int pipe_ends[2];
    EXPECT(pipe(pipe_ends) == 0, "a pipe");
    CUmemGenericAllocationHandle bogus;
    CUresult refused = cuMemImportFromShareableHandle(
        &bogus, (void *)(uintptr_t)pipe_ends[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    printf("CHECK pipe_refused %d\n", refused != CUDA_SUCCESS);
    close(pipe_ends[0]);
    close(pipe_ends[1]);

    // The child, on the other end of a socket, gets the descriptors as the samples pass them.
    int sv[2];
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork");
    if (pid == 0) {
        close(sv[0]);
        std::string sock = std::to_string(sv[1]);
        execl("/proc/self/exe", argv[0], "child", sock.c_str(), (char *)nullptr);
        _exit(127);
    }
    close(sv[1]);
    send_with_fds(sv[0], fds, &message, sizeof message);
    close(fds[0]);
    close(fds[1]);
    char done = 0;
    ssize_t got = read(sv[0], &done, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(got == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the child failed (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);

    // The child's writes, seen here.
    printf("CHECK parent_vmm_after %lld\n", sum_words(va, size / 4));
    printf("CHECK parent_pool_after %lld\n", sum_words(pooled, POOL_WORDS));

    CU(cuMemFreeAsync(pooled, stream));
    CU(cuStreamSynchronize(stream));
    CU(cuMemPoolDestroy(pool));
    CU(cuStreamDestroy(stream));
    CU(cuMemUnmap(va, size));
    CU(cuMemRelease(handle));
    CU(cuMemAddressFree(va, size));
    printf("PASS shareable\n");
    return 0;
}
