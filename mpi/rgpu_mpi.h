/* rgpu's MPI interposer (librgpu_mpi.so): MPI calls on rgpu device buffers.
 *
 * CUDA buffers need nothing: a device pointer passed to MPI_Send, MPI_Recv, ... is recognised
 * by its address (rgpu's libcuda answers from its own tables, without a network round trip).
 *
 * OpenCL buffers (cl_mem handles) are marked by their datatype, as MPI-ACC does: a datatype
 * made by rgpu_mpi_opencl_type() carries the command queue that orders the buffer's work, and
 * a call given such a datatype takes its buffer argument as a cl_mem:
 *
 *     MPI_Datatype cl_float;
 *     rgpu_mpi_opencl_type(MPI_FLOAT, queue, &cl_float);
 *     MPI_Send(buffer_mem, n, cl_float, peer, tag, MPI_COMM_WORLD);
 *
 * The library is loaded with LD_PRELOAD by `rgpu run --mpi` (or linked in); it intercepts MPI
 * through the standard PMPI profiling interface.
 */
#ifndef RGPU_MPI_H
#define RGPU_MPI_H

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds of buffer a datatype attribute can name. */
#define RGPU_MPI_BUFFER_OPENCL 1

/* What a datatype's RGPU_MPI_BUFFER_KEYVAL attribute points to. */
struct rgpu_mpi_buffer {
    int kind;          /* RGPU_MPI_BUFFER_OPENCL */
    void *queue;       /* the cl_command_queue whose earlier work the transfer follows */
    MPI_Datatype base; /* the datatype it marks (what reductions compute in) */
};

/* The datatype attribute key (valid after MPI_Init). */
extern int RGPU_MPI_BUFFER_KEYVAL;

/* A copy of `base` (a contiguous datatype) marking buffers as OpenCL buffers ordered by
 * `queue`. Free it with MPI_Type_free. Returns an MPI error code. */
int rgpu_mpi_opencl_type(MPI_Datatype base, void *queue, MPI_Datatype *out);

/* Whether device sends of 64 KiB or more move between the servers directly (1, the default;
 * RGPU_MPI_DIRECT=0 turns it off at MPI_Init) or staged through the ranks' host memory (0).
 * Each rank decides for its own sends; receives take either. */
void rgpu_mpi_set_direct(int on);

/* Whether MPI_Allreduce, MPI_Reduce, MPI_Bcast and MPI_Allgather on CUDA device buffers run as
 * NCCL collectives on the ranks' servers (1, the default; RGPU_MPI_NCCL=0 turns it off at
 * MPI_Init) or staged through the ranks' host memory (0). Every rank of a communicator must
 * say the same. */
void rgpu_mpi_set_nccl(int on);

#ifdef __cplusplus
}
#endif

#endif
