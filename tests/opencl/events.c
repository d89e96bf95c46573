/* Events: wait lists across commands and queues, clWaitForEvents, event info, user events,
 * callbacks, profiling, markers/barriers (1.2 and 1.1 style), flush/finish. */
#include <pthread.h>
#include "common.h"

static const char *SRC =
    "__kernel void axpb(__global int *a, int m, int b) {\n"
    "  size_t i = get_global_id(0); a[i] = a[i] * m + b; }\n"
    "__kernel void spin(__global int *a, int iters) {\n"
    "  size_t i = get_global_id(0); int v = a[i];\n"
    "  for (int j = 0; j < iters; j++) v = (v * 1103515245 + 12345) & 0x7fffffff;\n"
    "  a[i] = v; }\n";

static cl_context ctx;
static cl_command_queue q, qp, qo; /* in-order, profiling, out-of-order (or in-order) */
static cl_program prog;
static cl_kernel kaxpb;
static int have_ooo;

static cl_int ev_status(cl_event e) {
    cl_int s = 99;
    CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL));
    return s;
}

static void enqueue_axpb(cl_command_queue qq, cl_mem b, size_t n, cl_int m, cl_int add,
                         cl_uint nw, const cl_event *wl, cl_event *ev) {
    CHECK(clSetKernelArg(kaxpb, 0, sizeof b, &b));
    CHECK(clSetKernelArg(kaxpb, 1, sizeof m, &m));
    CHECK(clSetKernelArg(kaxpb, 2, sizeof add, &add));
    CHECK(clEnqueueNDRangeKernel(qq, kaxpb, 1, NULL, &n, NULL, nw, wl, ev));
}

/* write -> kernel -> read, each non-blocking and waiting on the previous event. */
static void test_chain(void) {
    enum { N = 1 << 16 };
    cl_int *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst);
    for (int i = 0; i < N; i++) src[i] = i - 5000;
    cl_mem b = CHKE(clCreateBuffer(ctx, 0, N * sizeof(cl_int), NULL, E));
    cl_command_queue qs[2] = {qo, q};
    for (int round = 0; round < 2; round++) {
        /* round 0: one (out-of-order) queue; round 1: write/read on q, kernel on qo. */
        cl_command_queue qa = qs[0], qb = round ? qs[1] : qs[0];
        cl_event ew, ek, er;
        memset(dst, 0, N * sizeof *dst);
        CHECK(clEnqueueWriteBuffer(qb, b, CL_FALSE, 0, N * sizeof(cl_int), src, 0, NULL, &ew));
        enqueue_axpb(qa, b, N, 3, round + 1, 1, &ew, &ek);
        CHECK(clEnqueueReadBuffer(qb, b, CL_FALSE, 0, N * sizeof(cl_int), dst, 1, &ek, &er));
        CHECK(clFlush(qa));
        CHECK(clFlush(qb));
        CHECK(clWaitForEvents(1, &er));
        for (int i = 0; i < N; i++)
            REQUIRE(dst[i] == src[i] * 3 + round + 1, "chain round %d: dst[%d] = %d expected %d",
                    round, i, dst[i], src[i] * 3 + round + 1);
        cl_event all[3] = {ew, ek, er};
        CHECK(clWaitForEvents(3, all));
        for (int j = 0; j < 3; j++) REQUIRE(ev_status(all[j]) == CL_COMPLETE, "event %d status", j);

        /* Event info. */
        cl_command_type ct = 0;
        cl_command_queue eq = NULL;
        cl_context ec = NULL;
        cl_uint rc = 0;
        CHECK(clGetEventInfo(ew, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
        REQUIRE(ct == CL_COMMAND_WRITE_BUFFER, "write type %#x", ct);
        CHECK(clGetEventInfo(ek, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
        REQUIRE(ct == CL_COMMAND_NDRANGE_KERNEL, "kernel type %#x", ct);
        CHECK(clGetEventInfo(er, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
        REQUIRE(ct == CL_COMMAND_READ_BUFFER, "read type %#x", ct);
        CHECK(clGetEventInfo(ek, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
        REQUIRE(eq == qa, "kernel event queue");
        CHECK(clGetEventInfo(er, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
        REQUIRE(eq == qb, "read event queue");
        CHECK(clGetEventInfo(ek, CL_EVENT_CONTEXT, sizeof ec, &ec, NULL));
        REQUIRE(ec == ctx, "event context");
        CHECK(clGetEventInfo(ek, CL_EVENT_REFERENCE_COUNT, sizeof rc, &rc, NULL));
        REQUIRE(rc >= 1, "event refcount %u", rc);
        cl_uint rc0 = rc;
        CHECK(clRetainEvent(ek));
        CHECK(clGetEventInfo(ek, CL_EVENT_REFERENCE_COUNT, sizeof rc, &rc, NULL));
        REQUIRE(rc == rc0 + 1, "event refcount after retain %u (was %u)", rc, rc0);
        CHECK(clReleaseEvent(ek));
        CHECK(clGetEventInfo(ek, CL_EVENT_REFERENCE_COUNT, sizeof rc, &rc, NULL));
        REQUIRE(rc == rc0, "event refcount after release %u", rc);
        EXPECT(CL_INVALID_VALUE, clGetEventInfo(ek, 0x7fff, sizeof rc, &rc, NULL));
        for (int j = 0; j < 3; j++) CHECK(clReleaseEvent(all[j]));
    }
    /* A long chain of dependent kernels on the out-of-order queue. */
    cl_int one = 1;
    CHECK(clEnqueueFillBuffer(q, b, &one, sizeof one, 0, N * sizeof(cl_int), 0, NULL, NULL));
    CHECK(clFinish(q));
    cl_event prev = NULL;
    cl_int model = 1;
    for (int i = 0; i < 40; i++) {
        cl_event e;
        enqueue_axpb(qo, b, N, 2, -i, prev ? 1 : 0, prev ? &prev : NULL, &e);
        model = model * 2 - i;
        if (prev) CHECK(clReleaseEvent(prev));
        prev = e;
    }
    CHECK(clEnqueueReadBuffer(qo, b, CL_TRUE, 0, N * sizeof(cl_int), dst, 1, &prev, NULL));
    CHECK(clReleaseEvent(prev));
    for (int i = 0; i < N; i++) REQUIRE(dst[i] == model, "40-kernel chain dst[%d] = %d expected %d",
                                        i, dst[i], model);
    /* Errors. */
    EXPECT(CL_INVALID_VALUE, clWaitForEvents(0, NULL));
    EXPECT(CL_INVALID_EVENT_WAIT_LIST, clEnqueueReadBuffer(q, b, CL_TRUE, 0, 4, dst, 1, NULL, NULL));
    EXPECT(CL_INVALID_EVENT_WAIT_LIST, clEnqueueReadBuffer(q, b, CL_TRUE, 0, 4, dst, 0,
                                                           (cl_event[1]){0}, NULL));
    CHECK(clReleaseMemObject(b));
    free(src);
    free(dst);
}

struct cb_rec {
    volatile int called[4]; /* indexed by status: COMPLETE 0, RUNNING 1, SUBMITTED 2 */
    volatile int bad;
    int magic;
};
static void CL_CALLBACK ev_cb(cl_event e, cl_int status, void *ud) {
    (void)e;
    struct cb_rec *r = ud;
    if (r->magic != 0x5eed) r->bad = 1;
    if (status >= 0 && status <= 2) r->called[status]++;
    else r->bad = 2;
}

static struct {
    cl_event ue;
    int delay_ms;
    cl_int status;
} g_setter;
static void *set_later(void *arg) {
    (void)arg;
    sleep_ms(g_setter.delay_ms);
    cl_int e = clSetUserEventStatus(g_setter.ue, g_setter.status);
    if (e != CL_SUCCESS) fprintf(stderr, "FAIL thread: clSetUserEventStatus -> %d\n", e);
    return NULL;
}

static void test_user_events(void) {
    enum { N = 4096 };
    cl_int *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) host[i] = i;
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, N * sizeof(cl_int), host, E));

    cl_event ue = CHKE(clCreateUserEvent(ctx, E));
    REQUIRE(ev_status(ue) == CL_SUBMITTED, "new user event status %d", ev_status(ue));
    cl_command_type ct = 0;
    cl_command_queue eq = (cl_command_queue)1;
    CHECK(clGetEventInfo(ue, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_USER, "user event type %#x", ct);
    CHECK(clGetEventInfo(ue, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
    REQUIRE(eq == NULL, "user event queue %p", (void *)eq);
    struct cb_rec ucb = {{0}, 0, 0x5eed};
    CHECK(clSetEventCallback(ue, CL_COMPLETE, ev_cb, &ucb));

    /* A kernel waiting on the user event does not run until it completes. */
    cl_event ek, er;
    enqueue_axpb(q, b, N, 10, 1, 1, &ue, &ek);
    CHECK(clFlush(q));
    sleep_ms(300);
    cl_int st = ev_status(ek);
    REQUIRE(st == CL_QUEUED || st == CL_SUBMITTED, "kernel waiting on a user event has status %d",
            st);
    /* Another queue reads the buffer meanwhile: still the old contents. */
    CHECK(clEnqueueReadBuffer(qp, b, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == i, "kernel ran before its user event: %d", back[i]);
    REQUIRE(ucb.called[CL_COMPLETE] == 0, "user event callback before completion");
    CHECK(clSetUserEventStatus(ue, CL_COMPLETE));
    CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, N * sizeof(cl_int), back, 1, &ek, &er));
    CHECK(clWaitForEvents(1, &er));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == i * 10 + 1, "after user event: %d", back[i]);
    REQUIRE(ev_status(ue) == CL_COMPLETE, "user event status");
    for (int i = 0; i < 3000 && !ucb.called[CL_COMPLETE]; i++) sleep_ms(10);
    REQUIRE(ucb.called[CL_COMPLETE] == 1 && !ucb.bad, "user event callback %d bad %d",
            ucb.called[CL_COMPLETE], ucb.bad);
    EXPECT(CL_INVALID_OPERATION, clSetUserEventStatus(ue, CL_COMPLETE)); /* only once */
    CHECK(clReleaseEvent(ek));
    CHECK(clReleaseEvent(er));
    CHECK(clReleaseEvent(ue));

    /* A blocking read waiting on a user event that another thread completes. */
    ue = CHKE(clCreateUserEvent(ctx, E));
    g_setter.ue = ue;
    g_setter.delay_ms = 200;
    g_setter.status = CL_COMPLETE;
    pthread_t th;
    pthread_create(&th, NULL, set_later, NULL);
    double t0 = now_s();
    memset(back, 0, N * sizeof *back);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N * sizeof(cl_int), back, 1, &ue, NULL));
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    REQUIRE(dt >= 0.15, "blocking read returned after %.3f s, before its user event", dt);
    for (int i = 0; i < N; i++) REQUIRE(back[i] == i * 10 + 1, "blocked read: %d", back[i]);
    CHECK(clReleaseEvent(ue));

    /* A negative status: dependents fail, the data is untouched. */
    cl_command_queue q2 = make_queue(ctx, 0);
    ue = CHKE(clCreateUserEvent(ctx, E));
    cl_event ek2;
    enqueue_axpb(q2, b, N, 0, 0, 1, &ue, &ek2);
    CHECK(clFlush(q2));
    CHECK(clSetUserEventStatus(ue, -77));
    cl_int we = clWaitForEvents(1, &ek2);
    REQUIRE(we == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, "wait on dependent of failed user "
            "event: %d (%s)", we, cl_err_name(we));
    st = ev_status(ek2);
    REQUIRE(st < 0, "dependent of a failed user event has status %d", st);
    REQUIRE(ev_status(ue) == -77, "failed user event status %d", ev_status(ue));
    CHECK(clReleaseEvent(ek2));
    CHECK(clReleaseEvent(ue));
    CHECK(clReleaseCommandQueue(q2));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++)
        REQUIRE(back[i] == i * 10 + 1, "kernel of a failed wait list ran: back[%d] = %d", i, back[i]);

    /* Errors. */
    EXPECTE(CL_INVALID_CONTEXT, clCreateUserEvent(NULL, E));
    cl_event ue2 = CHKE(clCreateUserEvent(ctx, E));
    EXPECT(CL_INVALID_VALUE, clSetUserEventStatus(ue2, CL_RUNNING));
    CHECK(clSetUserEventStatus(ue2, CL_COMPLETE));
    CHECK(clReleaseEvent(ue2));
    CHECK(clReleaseMemObject(b));
    free(host);
    free(back);
}

static void test_callbacks(void) {
    enum { N = 1 << 16 };
    cl_mem b = CHKE(clCreateBuffer(ctx, 0, N * sizeof(cl_int), NULL, E));
    cl_int zero = 0;
    CHECK(clEnqueueFillBuffer(q, b, &zero, sizeof zero, 0, N * sizeof(cl_int), 0, NULL, NULL));
    struct cb_rec rec = {{0}, 0, 0x5eed};
    cl_event ek;
    enqueue_axpb(q, b, N, 1, 5, 0, NULL, &ek);
    CHECK(clSetEventCallback(ek, CL_SUBMITTED, ev_cb, &rec));
    CHECK(clSetEventCallback(ek, CL_RUNNING, ev_cb, &rec));
    CHECK(clSetEventCallback(ek, CL_COMPLETE, ev_cb, &rec));
    CHECK(clFinish(q));
    for (int i = 0; i < 3000 && !rec.called[CL_COMPLETE]; i++) sleep_ms(10);
    REQUIRE(rec.called[CL_COMPLETE] == 1, "CL_COMPLETE callback called %d times",
            rec.called[CL_COMPLETE]);
    for (int i = 0; i < 3000 && !(rec.called[CL_SUBMITTED] && rec.called[CL_RUNNING]); i++)
        sleep_ms(10);
    REQUIRE(rec.called[CL_SUBMITTED] == 1 && rec.called[CL_RUNNING] == 1,
            "SUBMITTED/RUNNING callbacks called %d/%d times", rec.called[CL_SUBMITTED],
            rec.called[CL_RUNNING]);
    REQUIRE(!rec.bad, "callback got wrong user data or status (%d)", rec.bad);
    /* A callback registered on an already complete event is still called. */
    struct cb_rec late = {{0}, 0, 0x5eed};
    CHECK(clSetEventCallback(ek, CL_COMPLETE, ev_cb, &late));
    for (int i = 0; i < 3000 && !late.called[CL_COMPLETE]; i++) sleep_ms(10);
    REQUIRE(late.called[CL_COMPLETE] == 1 && !late.bad, "late callback %d", late.called[CL_COMPLETE]);
    EXPECT(CL_INVALID_VALUE, clSetEventCallback(ek, CL_COMPLETE, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clSetEventCallback(ek, CL_QUEUED, ev_cb, &rec));
    CHECK(clReleaseEvent(ek));
    /* Many events, each with a callback, on a chain of non-blocking commands. */
    enum { M = 30 };
    struct cb_rec recs[M];
    cl_event evs[M];
    for (int i = 0; i < M; i++) {
        recs[i] = (struct cb_rec){{0}, 0, 0x5eed};
        enqueue_axpb(q, b, N, 1, 1, 0, NULL, &evs[i]);
        CHECK(clSetEventCallback(evs[i], CL_COMPLETE, ev_cb, &recs[i]));
    }
    cl_int *back = malloc(N * sizeof *back);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == 5 + M, "after %d kernels: %d", M, back[i]);
    free(back);
    for (int i = 0; i < M; i++) {
        for (int t = 0; t < 3000 && !recs[i].called[CL_COMPLETE]; t++) sleep_ms(10);
        REQUIRE(recs[i].called[CL_COMPLETE] == 1 && !recs[i].bad, "callback %d called %d times", i,
                recs[i].called[CL_COMPLETE]);
        CHECK(clReleaseEvent(evs[i]));
    }
    CHECK(clReleaseMemObject(b));
}

static void test_profiling(void) {
    enum { N = 1 << 18 };
    cl_mem b = CHKE(clCreateBuffer(ctx, 0, N * sizeof(cl_int), NULL, E));
    cl_int *host = calloc(N, sizeof *host);
    cl_event ew, ek, er;
    CHECK(clEnqueueWriteBuffer(qp, b, CL_FALSE, 0, N * sizeof(cl_int), host, 0, NULL, &ew));
    cl_kernel ks = CHKE(clCreateKernel(prog, "spin", E));
    cl_int iters = 200;
    CHECK(clSetKernelArg(ks, 0, sizeof b, &b));
    CHECK(clSetKernelArg(ks, 1, sizeof iters, &iters));
    size_t g = N;
    CHECK(clEnqueueNDRangeKernel(qp, ks, 1, NULL, &g, NULL, 0, NULL, &ek));
    CHECK(clEnqueueReadBuffer(qp, b, CL_TRUE, 0, N * sizeof(cl_int), host, 0, NULL, &er));
    cl_event evs[3] = {ew, ek, er};
    const char *names[3] = {"write", "kernel", "read"};
    cl_ulong prev_end = 0;
    for (int i = 0; i < 3; i++) {
        cl_ulong t[4];
        static const cl_profiling_info what[4] = {CL_PROFILING_COMMAND_QUEUED,
                                                  CL_PROFILING_COMMAND_SUBMIT,
                                                  CL_PROFILING_COMMAND_START,
                                                  CL_PROFILING_COMMAND_END};
        for (int j = 0; j < 4; j++) {
            size_t n = 0;
            CHECK(clGetEventProfilingInfo(evs[i], what[j], sizeof t[j], &t[j], &n));
            REQUIRE(n == sizeof(cl_ulong), "profiling size %zu", n);
        }
        REQUIRE(t[0] > 0 && t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3],
                "%s: queued %llu submit %llu start %llu end %llu", names[i],
                (unsigned long long)t[0], (unsigned long long)t[1], (unsigned long long)t[2],
                (unsigned long long)t[3]);
        /* In-order queue: each command starts after the previous one ended. */
        REQUIRE(t[2] >= prev_end, "%s started at %llu before the previous command ended at %llu",
                names[i], (unsigned long long)t[2], (unsigned long long)prev_end);
        prev_end = t[3];
        cl_ulong complete = 0;
        cl_int e = clGetEventProfilingInfo(evs[i], CL_PROFILING_COMMAND_COMPLETE, sizeof complete,
                                           &complete, NULL);
        if (e == CL_SUCCESS) REQUIRE(complete >= t[3], "complete %llu < end", (unsigned long long)complete);
    }
    cl_ulong ks_t[2];
    CHECK(clGetEventProfilingInfo(ek, CL_PROFILING_COMMAND_START, sizeof ks_t[0], &ks_t[0], NULL));
    CHECK(clGetEventProfilingInfo(ek, CL_PROFILING_COMMAND_END, sizeof ks_t[1], &ks_t[1], NULL));
    REQUIRE(ks_t[1] > ks_t[0], "kernel of %d iterations took 0 ns", iters);
    for (int i = 0; i < 3; i++) CHECK(clReleaseEvent(evs[i]));
    /* Not available on a queue without profiling, nor on user events. */
    cl_event e2;
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, 16, host, 0, NULL, &e2));
    cl_ulong v;
    EXPECT(CL_PROFILING_INFO_NOT_AVAILABLE,
           clGetEventProfilingInfo(e2, CL_PROFILING_COMMAND_START, sizeof v, &v, NULL));
    CHECK(clReleaseEvent(e2));
    cl_event ue = CHKE(clCreateUserEvent(ctx, E));
    EXPECT(CL_PROFILING_INFO_NOT_AVAILABLE,
           clGetEventProfilingInfo(ue, CL_PROFILING_COMMAND_START, sizeof v, &v, NULL));
    CHECK(clSetUserEventStatus(ue, CL_COMPLETE));
    CHECK(clReleaseEvent(ue));
    CHECK(clReleaseKernel(ks));
    CHECK(clReleaseMemObject(b));
    free(host);
}

static void test_markers_barriers(void) {
    enum { N = 1 << 14 };
    cl_int *back = malloc(N * sizeof *back);
    cl_mem b1 = CHKE(clCreateBuffer(ctx, 0, N * sizeof(cl_int), NULL, E));
    cl_mem b2 = CHKE(clCreateBuffer(ctx, 0, N * sizeof(cl_int), NULL, E));
    cl_int v1 = 3, v2 = 4;
    /* Out-of-order queue: two independent fills, a barrier, then kernels on both. */
    CHECK(clEnqueueFillBuffer(qo, b1, &v1, sizeof v1, 0, N * sizeof(cl_int), 0, NULL, NULL));
    CHECK(clEnqueueFillBuffer(qo, b2, &v2, sizeof v2, 0, N * sizeof(cl_int), 0, NULL, NULL));
    cl_event bar;
    CHECK(clEnqueueBarrierWithWaitList(qo, 0, NULL, &bar));
    cl_command_type ct = 0;
    CHECK(clGetEventInfo(bar, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_BARRIER, "barrier command type %#x", ct);
    cl_event k1, k2;
    enqueue_axpb(qo, b1, N, 5, 0, 0, NULL, &k1);
    enqueue_axpb(qo, b2, N, 7, 0, 0, NULL, &k2);
    cl_event mk;
    cl_event ks[2] = {k1, k2};
    CHECK(clEnqueueMarkerWithWaitList(qo, 2, ks, &mk));
    CHECK(clGetEventInfo(mk, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_MARKER, "marker command type %#x", ct);
    CHECK(clWaitForEvents(1, &mk));
    REQUIRE(ev_status(k1) == CL_COMPLETE && ev_status(k2) == CL_COMPLETE,
            "marker complete before the events it waits on");
    CHECK(clEnqueueReadBuffer(q, b1, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == 15, "b1[%d] = %d", i, back[i]);
    CHECK(clEnqueueReadBuffer(q, b2, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == 28, "b2[%d] = %d", i, back[i]);
    CHECK(clReleaseEvent(bar));
    CHECK(clReleaseEvent(k1));
    CHECK(clReleaseEvent(k2));
    CHECK(clReleaseEvent(mk));

    /* A marker waiting on a user event completes only after it. */
    cl_event ue = CHKE(clCreateUserEvent(ctx, E));
    CHECK(clEnqueueMarkerWithWaitList(q, 1, &ue, &mk));
    CHECK(clFlush(q));
    sleep_ms(100);
    cl_int st = ev_status(mk);
    REQUIRE(st != CL_COMPLETE, "marker completed before its user event");
    CHECK(clSetUserEventStatus(ue, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &mk));
    CHECK(clReleaseEvent(mk));
    CHECK(clReleaseEvent(ue));

    /* Marker without wait list on an in-order queue: completes after everything before it. */
    cl_event kk;
    enqueue_axpb(q, b1, N, 2, 1, 0, NULL, &kk);
    CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &mk));
    CHECK(clWaitForEvents(1, &mk));
    REQUIRE(ev_status(kk) == CL_COMPLETE, "kernel not complete after the marker after it");
    CHECK(clReleaseEvent(mk));
    CHECK(clReleaseEvent(kk));

    /* OpenCL 1.1 style: clEnqueueMarker, clEnqueueBarrier.  (clEnqueueWaitForEvents makes
     * PoCL 3.1 exit the process: "unimplemented", so it is not called.) */
    cl_event m11;
    enqueue_axpb(q, b1, N, 1, 100, 0, NULL, NULL);
    CHECK(clEnqueueMarker(q, &m11));
    CHECK(clEnqueueBarrier(q));
    CHECK(clEnqueueBarrierWithWaitList(q, 1, &m11, NULL));
    enqueue_axpb(q, b1, N, 1, 1000, 0, NULL, NULL);
    CHECK(clFlush(q));
    CHECK(clWaitForEvents(1, &m11));
    CHECK(clGetEventInfo(m11, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_MARKER, "1.1 marker command type %#x", ct);
    CHECK(clReleaseEvent(m11));
    CHECK(clFinish(q));
    CHECK(clEnqueueReadBuffer(q, b1, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == 31 + 100 + 1000, "b1 after 1.1 markers: %d", back[i]);
    EXPECT(CL_INVALID_VALUE, clEnqueueMarker(q, NULL));

    /* clFinish waits for everything; clFlush returns. */
    cl_event last;
    for (int i = 0; i < 20; i++) enqueue_axpb(q, b2, N, 1, 1, 0, NULL, i == 19 ? &last : NULL);
    CHECK(clFlush(q));
    CHECK(clFinish(q));
    REQUIRE(ev_status(last) == CL_COMPLETE, "status after clFinish %d", ev_status(last));
    CHECK(clReleaseEvent(last));
    CHECK(clEnqueueReadBuffer(q, b2, CL_TRUE, 0, N * sizeof(cl_int), back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) REQUIRE(back[i] == 48, "b2 after 20 kernels: %d", back[i]);
    CHECK(clReleaseMemObject(b1));
    CHECK(clReleaseMemObject(b2));
    free(back);
}

/* Events of another context in a wait list. */
static void test_cross_context(void) {
    cl_context c2 = make_context();
    cl_event ue = CHKE(clCreateUserEvent(c2, E));
    cl_event ue1 = CHKE(clCreateUserEvent(ctx, E));
    cl_event both[2] = {ue, ue1};
    EXPECT(CL_INVALID_CONTEXT, clWaitForEvents(2, both));
    cl_mem b = CHKE(clCreateBuffer(ctx, 0, 64, NULL, E));
    cl_int x[16];
    EXPECT(CL_INVALID_CONTEXT, clEnqueueWriteBuffer(q, b, CL_TRUE, 0, 64, x, 1, &ue, NULL));
    CHECK(clSetUserEventStatus(ue, CL_COMPLETE));
    CHECK(clSetUserEventStatus(ue1, CL_COMPLETE));
    CHECK(clReleaseEvent(ue));
    CHECK(clReleaseEvent(ue1));
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseContext(c2));
}

int main(void) {
    select_device();
    ctx = make_context();
    cl_command_queue_properties sup = 0;
    CHECK(clGetDeviceInfo(g_device, CL_DEVICE_QUEUE_PROPERTIES, sizeof sup, &sup, NULL));
    have_ooo = (sup & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    q = make_queue(ctx, 0);
    qp = make_queue(ctx, CL_QUEUE_PROFILING_ENABLE);
    qo = make_queue(ctx, have_ooo ? CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE : 0);
    if (!have_ooo) NOTE("no out-of-order queue; its tests run in order");
    prog = build_program(ctx, SRC, "");
    kaxpb = CHKE(clCreateKernel(prog, "axpb", E));
    test_chain();
    test_user_events();
    test_callbacks();
    test_profiling();
    test_markers_barriers();
    test_cross_context();
    CHECK(clReleaseKernel(kaxpb));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseCommandQueue(qp));
    CHECK(clReleaseCommandQueue(qo));
    CHECK(clReleaseContext(ctx));
    pass("events");
    return 0;
}
