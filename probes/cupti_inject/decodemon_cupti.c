/* decodemon's CUPTI injection library: traced windows inside a process with no Python (llama-server, any C++
 * engine), over the same wire as the Python agent (probes/wire.py).
 *
 * `decodemon run -- llama-server ...` sets CUDA_INJECTION64_PATH to this library; the CUDA driver loads it at
 * cuInit and calls InitializeInjection, which starts one thread and returns. That thread, the door, listens on
 * the agent's socket (probes/wire_socket.socket_home: the per-user directory, 0700, held by fd; the socket 0600;
 * peers of this uid or root only) and reads each newcomer's Attach; a second thread serves one monitor at a time:
 *
 *   monitor -> Attach      this library reads window_period_s, time_window_s and trace, and checks their bounds
 *   library -> Hello, ProbeStatus
 *   library -> KernelWindow every window_period_s: CONCURRENT_KERNEL records over time_window_s (clock "time",
 *              no runtime-API records, launches counted from the kernels' correlation ids), then a ProbeStatus
 *   monitor -> Heartbeat   every second; a monitor silent for LEASE_S is dropped (Bye "dropped: silent ..."), so
 *                          a client that sent an Attach and went quiet cannot hold the slot
 *   monitor -> Detach      library -> Bye, and the next monitor may connect
 *
 * Between windows no activity kind is enabled. CUPTI is never finalized here: the Python agent finalizes at a
 * token boundary of the decode thread, and a C++ engine gives this thread no such point (a finalize from another
 * thread while CUDA graphs replay ended a loop on an H200). The token clock of llama-server stays its own /slots
 * counters, read by the monitor (monitor/outside.py), which forwards these windows beside them.
 *
 * Frames are msgpack, written here by hand: a tagged struct is a map whose first key is "type", a Column a
 * two-element array [dtype, bin]. The encoder of a window is exported (decodemon_cupti_encode_window) so that CI,
 * without a GPU, decodes what it writes with the monitor's own decoder.
 */
#define _GNU_SOURCE
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define WIRE_VERSION 2
#define MAX_CONTROL_BYTES (1024 * 1024 + 64 * 1024) /* frames.MAX_CONTROL_BYTES: an Attach carries a Python
                                                    * agent's copy of this library */
#define KCOLS 16
#define BUF_BYTES (4u << 20)
#define MAX_BUFS 16           /* 64 MiB of CUPTI buffers at most; past it CUPTI counts the records it drops */
#define MAX_ROWS 400000       /* 400k kernels x 128 B: a frame well under the monitor's 64 MiB limit */
#define DRAIN_S 0.05          /* a window's records are taken this often while it is open */
/* an attached monitor silent this long loses the slot: wire.lease_s for any tick an Attach may ask (at most 1 s);
 * the Hello says it, and a monitor sends a Heartbeat every wire.HEARTBEAT_S */
#define LEASE_S 5.0

/* the kernel record of the CUPTI these headers come with (the library is linked against the same wheel's) */
#if CUPTI_API_VERSION >= 130400
typedef CUpti_ActivityKernel13 kernel_rec_t;
#else
typedef CUpti_ActivityKernel10 kernel_rec_t;
#endif

/* ---------------------------------------------------------------- msgpack writer */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} buf_t;

static void b_need(buf_t *b, size_t k) {
    if (b->oom || b->n + k <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + k) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
}
static void b_put(buf_t *b, const void *s, size_t k) {
    b_need(b, k);
    if (b->oom) return;
    memcpy(b->p + b->n, s, k);
    b->n += k;
}
static void b_u8(buf_t *b, uint8_t v) { b_put(b, &v, 1); }
static void b_be(buf_t *b, uint64_t v, int bytes) {
    uint8_t t[8];
    for (int i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    b_put(b, t, (size_t)bytes);
}
static void mp_head(buf_t *b, uint8_t fix, uint8_t fixmax, uint8_t c16, uint8_t c32, uint32_t n) {
    if (n <= fixmax) b_u8(b, (uint8_t)(fix | n));
    else if (n <= 0xffff) { b_u8(b, c16); b_be(b, n, 2); }
    else { b_u8(b, c32); b_be(b, n, 4); }
}
static void mp_map(buf_t *b, uint32_t n) { mp_head(b, 0x80, 15, 0xde, 0xdf, n); }
static void mp_arr(buf_t *b, uint32_t n) { mp_head(b, 0x90, 15, 0xdc, 0xdd, n); }
static void mp_strn(buf_t *b, const char *s, size_t n) {
    if (n < 32) b_u8(b, (uint8_t)(0xa0 | n));
    else if (n <= 0xff) { b_u8(b, 0xd9); b_u8(b, (uint8_t)n); }
    else if (n <= 0xffff) { b_u8(b, 0xda); b_be(b, n, 2); }
    else { b_u8(b, 0xdb); b_be(b, n, 4); }
    b_put(b, s, n);
}
static void mp_str(buf_t *b, const char *s) { mp_strn(b, s, strlen(s)); }
/* A string from outside this library (argv, a host name) as valid UTF-8: each byte that does not start a valid
 * sequence becomes '?', so the monitor's decoder, which refuses invalid UTF-8, reads the frame. */
static void mp_str_utf8(buf_t *b, const char *s, size_t n) {
    char *t = malloc(n ? n : 1);
    if (!t) { b->oom = 1; return; }
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] < 0x80 ? 1 : (u[i] & 0xe0) == 0xc0 && u[i] >= 0xc2 ? 2 : (u[i] & 0xf0) == 0xe0 ? 3
                 : (u[i] & 0xf8) == 0xf0 && u[i] <= 0xf4 ? 4 : 0;
        int ok = k > 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++) ok = (u[i + j] & 0xc0) == 0x80;
        if (ok && k == 3) ok = !(u[i] == 0xe0 && u[i + 1] < 0xa0) && !(u[i] == 0xed && u[i + 1] >= 0xa0);
        if (ok && k == 4) ok = !(u[i] == 0xf0 && u[i + 1] < 0x90) && !(u[i] == 0xf4 && u[i + 1] >= 0x90);
        if (!ok) { t[i] = '?'; i++; continue; }
        memcpy(t + i, s + i, k);
        i += k;
    }
    mp_strn(b, t, n);
    free(t);
}
static void mp_int(buf_t *b, int64_t v) {
    if (v >= 0 && v < 128) b_u8(b, (uint8_t)v);
    else if (v < 0 && v >= -32) b_u8(b, (uint8_t)(int8_t)v);
    else { b_u8(b, 0xd3); b_be(b, (uint64_t)v, 8); }
}
static void mp_f64(buf_t *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    b_u8(b, 0xcb);
    b_be(b, u, 8);
}
static void mp_bool(buf_t *b, int v) { b_u8(b, v ? 0xc3 : 0xc2); }
static void mp_bin(buf_t *b, const void *p, size_t n) {
    if (n <= 0xff) { b_u8(b, 0xc4); b_u8(b, (uint8_t)n); }
    else if (n <= 0xffff) { b_u8(b, 0xc5); b_be(b, n, 2); }
    else { b_u8(b, 0xc6); b_be(b, n, 4); }
    b_put(b, p, n);
}
/* a wire.Column of little-endian int64 (x86_64 and aarch64 are little-endian: the values go as they lie) */
static void mp_col_i8(buf_t *b, const int64_t *v, size_t n) {
    mp_arr(b, 2);
    mp_str(b, "<i8");
    mp_bin(b, v, n * sizeof(int64_t));
}
static void kv_str(buf_t *b, const char *k, const char *v) { mp_str(b, k); mp_str(b, v); }
static void kv_int(buf_t *b, const char *k, int64_t v) { mp_str(b, k); mp_int(b, v); }

/* ---------------------------------------------------------------- msgpack reader (the monitor's Attach) */
typedef struct {
    const uint8_t *p, *end;
    int bad;
} rd_t;

enum { V_NIL, V_BOOL, V_INT, V_FLOAT, V_STR, V_OTHER };
typedef struct {
    int kind;
    int64_t i;
    double f;
    const char *s;
    uint32_t n;
} val_t;

static uint64_t rd_be(rd_t *r, int bytes) {
    if (r->bad || r->end - r->p < bytes) { r->bad = 1; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | r->p[i];
    r->p += bytes;
    return v;
}
static void rd_skip_bytes(rd_t *r, uint64_t n) {
    if (r->bad || (uint64_t)(r->end - r->p) < n) { r->bad = 1; return; }
    r->p += n;
}
static void rd_value(rd_t *r, val_t *v, int depth);
static void rd_skip_n(rd_t *r, uint64_t n, int depth) {
    val_t tmp;
    for (uint64_t i = 0; i < n && !r->bad; i++) rd_value(r, &tmp, depth + 1);
}
static void rd_value(rd_t *r, val_t *v, int depth) {
    memset(v, 0, sizeof *v);
    v->kind = V_OTHER;
    if (depth > 8) { r->bad = 1; return; }
    uint8_t c = (uint8_t)rd_be(r, 1);
    if (r->bad) return;
    if (c <= 0x7f) { v->kind = V_INT; v->i = c; return; }
    if (c >= 0xe0) { v->kind = V_INT; v->i = (int8_t)c; return; }
    if ((c & 0xe0) == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb) {
        uint64_t n = (c & 0xe0) == 0xa0 ? (c & 0x1f) : rd_be(r, c == 0xd9 ? 1 : c == 0xda ? 2 : 4);
        v->kind = V_STR;
        v->s = (const char *)r->p;
        v->n = (uint32_t)n;
        rd_skip_bytes(r, n);
        return;
    }
    if ((c & 0xf0) == 0x80) { rd_skip_n(r, 2u * (c & 0x0f), depth); return; }
    if ((c & 0xf0) == 0x90) { rd_skip_n(r, c & 0x0f, depth); return; }
    switch (c) {
    case 0xc0: v->kind = V_NIL; return;
    case 0xc2: case 0xc3: v->kind = V_BOOL; v->i = c == 0xc3; return;
    case 0xcc: v->kind = V_INT; v->i = (int64_t)rd_be(r, 1); return;
    case 0xcd: v->kind = V_INT; v->i = (int64_t)rd_be(r, 2); return;
    case 0xce: v->kind = V_INT; v->i = (int64_t)rd_be(r, 4); return;
    case 0xcf: { uint64_t u = rd_be(r, 8); v->kind = V_INT; v->i = u > INT64_MAX ? INT64_MAX : (int64_t)u; return; }
    case 0xd0: v->kind = V_INT; v->i = (int8_t)rd_be(r, 1); return;
    case 0xd1: v->kind = V_INT; v->i = (int16_t)rd_be(r, 2); return;
    case 0xd2: v->kind = V_INT; v->i = (int32_t)rd_be(r, 4); return;
    case 0xd3: v->kind = V_INT; v->i = (int64_t)rd_be(r, 8); return;
    case 0xca: { uint32_t u = (uint32_t)rd_be(r, 4); float f; memcpy(&f, &u, 4); v->kind = V_FLOAT; v->f = f; return; }
    case 0xcb: { uint64_t u = rd_be(r, 8); memcpy(&v->f, &u, 8); v->kind = V_FLOAT; return; }
    case 0xc4: rd_skip_bytes(r, rd_be(r, 1)); return;
    case 0xc5: rd_skip_bytes(r, rd_be(r, 2)); return;
    case 0xc6: rd_skip_bytes(r, rd_be(r, 4)); return;
    case 0xdc: rd_skip_n(r, rd_be(r, 2), depth); return;
    case 0xdd: rd_skip_n(r, rd_be(r, 4), depth); return;
    case 0xde: rd_skip_n(r, 2 * rd_be(r, 2), depth); return;
    case 0xdf: rd_skip_n(r, 2 * rd_be(r, 4), depth); return;
    case 0xd4: rd_skip_bytes(r, 2); return;
    case 0xd5: rd_skip_bytes(r, 3); return;
    case 0xd6: rd_skip_bytes(r, 5); return;
    case 0xd7: rd_skip_bytes(r, 9); return;
    case 0xd8: rd_skip_bytes(r, 17); return;
    case 0xc7: rd_skip_bytes(r, rd_be(r, 1) + 1); return;
    case 0xc8: rd_skip_bytes(r, rd_be(r, 2) + 1); return;
    case 0xc9: rd_skip_bytes(r, rd_be(r, 4) + 1); return;
    default: r->bad = 1; return;
    }
}
static int val_is(const val_t *v, const char *s) {
    return v->kind == V_STR && v->n == strlen(s) && memcmp(v->s, s, v->n) == 0;
}
static int val_num(const val_t *v, double *out) {
    if (v->kind == V_INT) { *out = (double)v->i; return 1; }
    if (v->kind == V_FLOAT) { *out = v->f; return 1; }
    return 0;
}

/* What this library takes from an Attach (the other fields are the Python agent's and are ignored here). */
typedef struct {
    double window_period_s, time_window_s;
    int trace;
} settings_t;

enum { MSG_BAD = 0, MSG_ATTACH, MSG_DETACH, MSG_HEARTBEAT };

/* Parse one control payload: MSG_ATTACH (with *s filled and *why set if a field is out of its bounds, the
 * bounds of wire.ATTACH_BOUNDS), MSG_DETACH, MSG_HEARTBEAT, or MSG_BAD for anything else. */
static int parse_control(const uint8_t *p, size_t n, settings_t *s, char *why, size_t why_n) {
    rd_t r = {p, p + n, 0};
    s->window_period_s = 4.0;
    s->time_window_s = 0.25;
    s->trace = 1;
    why[0] = 0;
    uint8_t c = (uint8_t)rd_be(&r, 1);
    uint64_t pairs;
    if ((c & 0xf0) == 0x80) pairs = c & 0x0f;
    else if (c == 0xde) pairs = rd_be(&r, 2);
    else if (c == 0xdf) pairs = rd_be(&r, 4);
    else return MSG_BAD;
    int kind = MSG_BAD;
    for (uint64_t i = 0; i < pairs && !r.bad; i++) {
        val_t k, v;
        rd_value(&r, &k, 0);
        rd_value(&r, &v, 0);
        if (r.bad || k.kind != V_STR) return MSG_BAD;
        double d;
        if (val_is(&k, "type")) {
            kind = val_is(&v, "attach") ? MSG_ATTACH : val_is(&v, "detach") ? MSG_DETACH
                 : val_is(&v, "heartbeat") ? MSG_HEARTBEAT : MSG_BAD;
            if (kind == MSG_BAD) return MSG_BAD;
        } else if (val_is(&k, "window_period_s")) {
            if (!val_num(&v, &d)) return MSG_BAD;
            s->window_period_s = d;
        } else if (val_is(&k, "time_window_s")) {
            if (!val_num(&v, &d)) return MSG_BAD;
            s->time_window_s = d;
        } else if (val_is(&k, "trace")) {
            if (v.kind != V_BOOL) return MSG_BAD;
            s->trace = (int)v.i;
        }
    }
    if (r.bad || r.p != r.end) return MSG_BAD;
    if (kind == MSG_ATTACH) {
        if (!(s->window_period_s > 0 && s->window_period_s <= 3600))
            snprintf(why, why_n, "window_period_s=%g is outside [0, 3600]", s->window_period_s);
        else if (!(s->time_window_s >= 0.01 && s->time_window_s <= 5.0))
            snprintf(why, why_n, "time_window_s=%g is outside [0.01, 5.0]", s->time_window_s);
    }
    return kind;
}

/* ---------------------------------------------------------------- a traced window's rows */
#define NAME_PTRS 256
typedef struct {
    int64_t *rows; /* n x KCOLS: name index, start, end, grid xyz, block xyz, regs, smem static, smem dynamic,
                      stream, graph id, graph node id, correlation (wire.KernelWindow's columns, in order) */
    size_t n, cap;
    char **names;
    size_t n_names, cap_names;
    size_t dropped;
    const char *seen[NAME_PTRS]; /* the pointer each of the first names came as (CUPTI's, for this window only) */
} window_t;

static const char *KERNEL_COLS[KCOLS] = {"name", "start", "end", "grid_x", "grid_y", "grid_z", "block_x",
                                         "block_y", "block_z", "regs", "smem_static", "smem_dynamic", "stream",
                                         "graph_id", "graph_node_id", "correlation"};

static int64_t name_index(window_t *w, const char *name) {
    if (!name) name = "?";
    /* CUPTI hands the same pointer for a name: matched by pointer first, then by text */
    for (size_t i = 0; i < w->n_names && i < NAME_PTRS; i++)
        if (w->seen[i] == name) return (int64_t)i;
    for (size_t i = 0; i < w->n_names; i++)  /* a window holds tens of distinct kernels, not thousands */
        if (strcmp(w->names[i], name) == 0) return (int64_t)i;
    if (w->n_names == w->cap_names) {
        size_t cap = w->cap_names ? 2 * w->cap_names : 64;
        char **p = realloc(w->names, cap * sizeof *p);
        if (!p) return -1;
        w->names = p;
        w->cap_names = cap;
    }
    char *copy = strdup(name);
    if (!copy) return -1;
    w->names[w->n_names] = copy;
    if (w->n_names < NAME_PTRS) w->seen[w->n_names] = name;
    return (int64_t)w->n_names++;
}

static int add_row(window_t *w, const int64_t *row) {
    if (w->n >= MAX_ROWS) { w->dropped++; return 0; }
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 4096;
        int64_t *p = realloc(w->rows, cap * KCOLS * sizeof *p);
        if (!p) { w->dropped++; return 0; }
        w->rows = p;
        w->cap = cap;
    }
    memcpy(w->rows + w->n * KCOLS, row, KCOLS * sizeof *row);
    w->n++;
    return 1;
}

static void window_clear(window_t *w) {
    for (size_t i = 0; i < w->n_names; i++) free(w->names[i]);
    w->n = w->n_names = w->dropped = 0;
}

/* One KernelWindow by time (wire.KernelWindow: tokens 0, token_bounds_ns [opened, closed], no guard token). */
static void encode_window(buf_t *b, const window_t *w, int64_t window_id, int64_t t_open, int64_t t_close,
                          int64_t host_ns) {
    mp_map(b, 11);
    kv_str(b, "type", "window");
    kv_int(b, "window_id", window_id);
    kv_int(b, "tokens", 0);
    mp_str(b, "token_bounds_ns");
    int64_t bounds[2] = {t_open, t_close};
    mp_col_i8(b, bounds, 2);
    mp_str(b, "names");
    mp_arr(b, (uint32_t)w->n_names);
    for (size_t i = 0; i < w->n_names; i++) mp_str(b, w->names[i]);
    mp_str(b, "kernels");
    mp_map(b, KCOLS);
    int64_t *col = malloc((w->n ? w->n : 1) * sizeof *col);
    if (!col) { b->oom = 1; return; }
    for (int j = 0; j < KCOLS; j++) {
        for (size_t i = 0; i < w->n; i++) col[i] = w->rows[i * KCOLS + j];
        mp_str(b, KERNEL_COLS[j]);
        mp_col_i8(b, col, w->n);
    }
    free(col);
    kv_int(b, "dropped_records", (int64_t)w->dropped);
    kv_int(b, "probe_host_ns", host_ns);
    kv_int(b, "guard_tokens", 0);
    mp_str(b, "apis_traced");
    mp_bool(b, 0);
    kv_str(b, "clock", "time");
}

/* For CI (no GPU): the window the rows `rows` (n x 16, as window_t's) and their kernels' `names` (the row's
 * first column indexes them) make, as the payload the socket carries. The caller frees *out with
 * decodemon_cupti_free. Returns 0, or -1 out of memory. */
int decodemon_cupti_encode_window(const int64_t *rows, size_t n, const char *const *names, size_t n_names,
                                  int64_t window_id, int64_t t_open, int64_t t_close, uint8_t **out,
                                  size_t *out_n) {
    window_t w = {0};
    int64_t row[KCOLS];
    for (size_t i = 0; i < n; i++) {
        memcpy(row, rows + i * KCOLS, sizeof row);
        int64_t k = row[0];
        row[0] = name_index(&w, (k >= 0 && (size_t)k < n_names) ? names[k] : "?");
        add_row(&w, row);
    }
    buf_t b = {0};
    encode_window(&b, &w, window_id, t_open, t_close, 0);
    window_clear(&w);
    free(w.rows);
    free(w.names);
    if (b.oom) { free(b.p); return -1; }
    *out = b.p;
    *out_n = b.n;
    return 0;
}

/* The control parser, for CI: 1 Attach (with its three settings), 2 Detach, 3 Heartbeat, 0 anything else; `why`
 * gets the reason an Attach is refused ("" when it is not). */
int decodemon_cupti_parse_control(const uint8_t *p, size_t n, double *window_period_s, double *time_window_s,
                                  int *trace, char *why, size_t why_n) {
    settings_t s;
    int k = parse_control(p, n, &s, why, why_n);
    *window_period_s = s.window_period_s;
    *time_window_s = s.time_window_s;
    *trace = s.trace;
    return k;
}

void decodemon_cupti_free(void *p) { free(p); }

/* ---------------------------------------------------------------- CUPTI */
static pthread_mutex_t g_buf_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct done_buf {
    uint8_t *p;
    size_t valid;
    struct done_buf *next;
} done_buf_t;
static done_buf_t *g_done, **g_done_tail = &g_done;
static size_t g_records_seen;
static int g_bufs_out; /* buffers handed to CUPTI or queued, not yet freed */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    void *p = NULL;
    pthread_mutex_lock(&g_buf_lock);
    int room = g_bufs_out < MAX_BUFS;
    g_bufs_out += room;
    pthread_mutex_unlock(&g_buf_lock);
    if (room && posix_memalign(&p, 8, BUF_BYTES) != 0) {
        p = NULL;
        pthread_mutex_lock(&g_buf_lock);
        g_bufs_out--;
        pthread_mutex_unlock(&g_buf_lock);
    }
    *buffer = p;
    *size = p ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx; (void)stream; (void)size;
    done_buf_t *d = malloc(sizeof *d);
    if (!d) {
        free(buffer);
        pthread_mutex_lock(&g_buf_lock);
        g_bufs_out--;
        pthread_mutex_unlock(&g_buf_lock);
        return;
    }
    d->p = buffer;
    d->valid = valid;
    d->next = NULL;
    pthread_mutex_lock(&g_buf_lock);
    *g_done_tail = d;
    g_done_tail = &d->next;
    g_records_seen += valid;
    pthread_mutex_unlock(&g_buf_lock);
}

/* The rows a Python agent's window adds to its kernels: runtime-API calls and copies (MEMCPY and MEMSET). */
typedef struct {
    int64_t *v;
    size_t n, cap, ncols;
} rows_t;

static void rows_add(rows_t *r, const int64_t *row, size_t *dropped) {
    if (r->n >= MAX_ROWS) { (*dropped)++; return; }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 1024;
        int64_t *p = realloc(r->v, cap * r->ncols * sizeof *p);
        if (!p) { (*dropped)++; return; }
        r->v = p;
        r->cap = cap;
    }
    memcpy(r->v + r->n * r->ncols, row, r->ncols * sizeof *row);
    r->n++;
}

typedef struct {
    rows_t apis;   /* cbid, start, end, correlation, domain (0 runtime) */
    rows_t copies; /* start, end, bytes, copy kind (-1: a memset) */
} extra_t;

/* The records CUPTI has handed back, as rows of `w` (kernels) and, when `x` is given, of `x` (API calls and
 * copies; without it those kinds are skipped). Their buffers go back. */
static void take_records(window_t *w, extra_t *x) {
    pthread_mutex_lock(&g_buf_lock);
    done_buf_t *d = g_done;
    g_done = NULL;
    g_done_tail = &g_done;
    pthread_mutex_unlock(&g_buf_lock);
    while (d) {
        CUpti_Activity *rec = NULL;
        while (cuptiActivityGetNextRecord(d->p, d->valid, &rec) == CUPTI_SUCCESS) {
            if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
                /* every field read here sits at the same offset in CUpti_ActivityKernel9 to 13 (CUPTI 12.x and
                 * 13.x), so the records of whichever libcupti the process loaded read alike */
                const kernel_rec_t *k = (const kernel_rec_t *)rec;
                if (k->start == 0 || k->end < k->start) { w->dropped++; continue; } /* incomplete: no times */
                int64_t row[KCOLS] = {name_index(w, k->name), (int64_t)k->start, (int64_t)k->end, k->gridX,
                                      k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->registersPerThread,
                                      k->staticSharedMemory, k->dynamicSharedMemory, k->streamId, k->graphId,
                                      (int64_t)k->graphNodeId, k->correlationId};
                add_row(w, row);
            } else if (!x) {
                continue;
            } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
                const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
                int64_t row[5] = {a->cbid, (int64_t)a->start, (int64_t)a->end, a->correlationId, 0};
                rows_add(&x->apis, row, &w->dropped);
            } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
                const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
                int64_t row[4] = {(int64_t)m->start, (int64_t)m->end, (int64_t)m->bytes, m->copyKind};
                rows_add(&x->copies, row, &w->dropped);
            } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
                const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
                int64_t row[4] = {(int64_t)m->start, (int64_t)m->end, (int64_t)m->bytes, -1};
                rows_add(&x->copies, row, &w->dropped);
            }
        }
        done_buf_t *next = d->next;
        free(d->p);
        free(d);
        pthread_mutex_lock(&g_buf_lock);
        g_bufs_out--;
        pthread_mutex_unlock(&g_buf_lock);
        d = next;
    }
}

static const char *cupti_err(CUptiResult r) {
    static __thread char line[96];
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "CUPTI error";
    snprintf(line, sizeof line, "%s (%d)", s, (int)r);
    return line;
}

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

typedef struct {
    int ready;       /* callbacks registered */
    char error[256]; /* why tracing is unavailable: CUPTI refused its callbacks, or the last window failed */
    int64_t windows;
} tracer_t;

static tracer_t g_tr;

static int tracer_ready(void) {
    if (g_tr.ready) return 1;
    if (g_tr.error[0]) return 0;
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        snprintf(g_tr.error, sizeof g_tr.error, "cuptiActivityRegisterCallbacks: %s", cupti_err(r));
        return 0;
    }
    g_tr.ready = 1;
    return 1;
}

static size_t records_seen(void) {
    pthread_mutex_lock(&g_buf_lock);
    size_t n = g_records_seen;
    pthread_mutex_unlock(&g_buf_lock);
    return n;
}

/* One window by time on this thread: kernels over `seconds` (their records taken every DRAIN_S, so CUPTI's
 * buffers go back as they fill), then flushed until no record has come for 50 ms (at most 1 s: kernels enqueued
 * before the close may still run), completed records only, and last a forced flush, whose incomplete records
 * are dropped. 0, or -1 with `err` set. */
static int trace_window(window_t *w, double seconds, int64_t *t_open, int64_t *t_close, int64_t *host_ns,
                        char *err, size_t err_n) {
    uint64_t ts = 0;
    int64_t h0 = mono_ns();
    CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
        snprintf(err, err_n, "cuptiActivityEnable: %s", cupti_err(r));
        return -1;
    }
    cuptiGetTimestamp(&ts);
    *t_open = (int64_t)ts;
    int64_t host = mono_ns() - h0, until = mono_ns() + (int64_t)(seconds * 1e9);
    while (mono_ns() < until) {
        int64_t left = until - mono_ns();
        sleep_s(left < DRAIN_S * 1e9 ? (double)left / 1e9 : DRAIN_S);
        int64_t d0 = mono_ns();
        cuptiActivityFlushAll(0);
        take_records(w, NULL);
        host += mono_ns() - d0;
    }
    int64_t c0 = mono_ns();
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiGetTimestamp(&ts);
    *t_close = (int64_t)ts;
    int64_t t0 = mono_ns(), last = t0;
    size_t seen = (size_t)-1;
    for (;;) {
        cuptiActivityFlushAll(0);
        take_records(w, NULL);
        size_t now_seen = records_seen();
        int64_t now = mono_ns();
        if (now_seen != seen) { seen = now_seen; last = now; }
        if (now - last >= 50000000LL || now - t0 >= 1000000000LL) break;
        sleep_s(0.01);
    }
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    take_records(w, NULL);
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &lost) == CUPTI_SUCCESS) w->dropped += lost;
    *host_ns = host + (mono_ns() - c0);
    return 0;
}

/* ---------------------------------------------------------------- a Python agent's windows
 * A Python target's agent (probes/native_tracer.py) loads this library with ctypes, which lets go of the GIL
 * for every call below, and drives one window at a time at the decode thread's token boundaries:
 *
 *   decodemon_win_start     agent thread, before the window: CUPTI's (re-)initialisation (its callbacks)
 *   decodemon_win_open      decode thread, a boundary: kernels, copies, memsets and (with_apis) the runtime
 *                           calls the timeline needs (launches, copies, syncs); CUPTI's clock then
 *   decodemon_win_timestamp CUPTI's clock (a boundary inside the window)
 *   decodemon_win_close     decode thread, the closing boundary: CUPTI's clock, then every kind off
 *   decodemon_win_flush     decode thread, right after: the window's records read into this library's rows
 *   decodemon_win_take      agent thread: those rows as the columns of wire.KernelWindow (msgpack), freed
 *                           with decodemon_cupti_free; it calls no CUPTI function
 *   decodemon_win_finalize  CUPTI detached (untraced tokens run at their own speed): the agent thread, after
 *                           the take, in a process that replays no CUDA graphs; else the decode thread, right
 *                           after the flush
 *
 * The records are read at the flush, before the finalize: a kernel record's name points into CUPTI's own memory,
 * which the finalize frees (on an H100 a take that read the names after it ended the loop with a segfault), and
 * any CUPTI call after a finalize would start CUPTI again on the agent thread. Reading ~3,700 records in C costs
 * the decode thread well under a millisecond (names matched by pointer first: CUPTI hands one string per name). */
static int g_runtime_filter_done;
static uint8_t *g_runtime_keep; /* per runtime cbid: 1 traced, 0 not (worked out once) */
static char **g_runtime_names;  /* per runtime cbid: its name in the loaded CUPTI, copied (NULL: none known) */
static size_t g_runtime_n;

static const char *KEEP_RUNTIME[] = {"cudaLaunch", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset", "Synchronize",
                                     "cudaEventSynchronize", "cudaStreamWaitEvent"};

static int keep_runtime(const char *name) {
    for (size_t i = 0; i < sizeof KEEP_RUNTIME / sizeof *KEEP_RUNTIME; i++)
        if (strstr(name, KEEP_RUNTIME[i])) return 1;
    return 0;
}

/* Which runtime calls a window records: those the timeline reads, by their names in the loaded CUPTI. */
static void runtime_filter(void) {
    if (g_runtime_filter_done) return;
    g_runtime_filter_done = 1;
    g_runtime_n = CUPTI_RUNTIME_TRACE_CBID_SIZE + 256; /* a newer libcupti may know calls these headers do not */
    g_runtime_keep = calloc(g_runtime_n, 1);
    g_runtime_names = calloc(g_runtime_n, sizeof *g_runtime_names);
    if (!g_runtime_keep || !g_runtime_names) { g_runtime_n = 0; return; }
    for (size_t cbid = 1; cbid < g_runtime_n; cbid++) {
        const char *name = NULL;
        int known = cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, (uint32_t)cbid, &name) == CUPTI_SUCCESS && name;
        g_runtime_keep[cbid] = !known || keep_runtime(name);
        if (known && g_runtime_keep[cbid]) g_runtime_names[cbid] = strdup(name);
    }
}

static const CUpti_ActivityKind WINDOW_KINDS[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                                  CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};
static int g_win_apis;       /* the open window records runtime calls */
static window_t g_win;       /* the window's rows, filled at each flush */
static extra_t g_win_extra = {{0, 0, 0, 5}, {0, 0, 0, 4}};

static void say(char *err, size_t n, const char *what, CUptiResult r) {
    if (err && n) snprintf(err, n, "%s: %s", what, cupti_err(r));
}

/* CUPTI (re-)initialised, its buffers this library's. 0, or -1 with `err` set. */
int decodemon_win_start(char *err, size_t n) {
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) { say(err, n, "cuptiActivityRegisterCallbacks", r); return -1; }
    runtime_filter();
    return 0;
}

/* The loaded libcupti's CUPTI API version (Hello.cupti_version). */
int decodemon_cupti_api_version(void) {
    uint32_t v = 0;
    return cuptiGetVersion(&v) == CUPTI_SUCCESS ? (int)v : 0;
}

int64_t decodemon_win_timestamp(void) {
    uint64_t ts = 0;
    cuptiGetTimestamp(&ts);
    return (int64_t)ts;
}

int decodemon_win_open(int with_apis, int64_t *ts, char *err, size_t n) {
    for (size_t i = 0; i < sizeof WINDOW_KINDS / sizeof *WINDOW_KINDS; i++) {
        CUptiResult r = cuptiActivityEnable(WINDOW_KINDS[i]);
        if (r != CUPTI_SUCCESS) { say(err, n, "cuptiActivityEnable", r); return -1; }
    }
    g_win_apis = with_apis != 0;
    if (g_win_apis) {
        CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
        if (r != CUPTI_SUCCESS) { say(err, n, "cuptiActivityEnable(RUNTIME)", r); return -1; }
        /* enabling RUNTIME enables every call again: filter at every open */
        for (size_t cbid = 1; cbid < g_runtime_n; cbid++)
            if (!g_runtime_keep[cbid]) cuptiActivityEnableRuntimeApi((CUpti_CallbackId)cbid, 0);
    }
    *ts = decodemon_win_timestamp();
    return 0;
}

int decodemon_win_close(int64_t *ts) {
    *ts = decodemon_win_timestamp();
    for (size_t i = 0; i < sizeof WINDOW_KINDS / sizeof *WINDOW_KINDS; i++) cuptiActivityDisable(WINDOW_KINDS[i]);
    if (g_win_apis) cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
    return 0;
}

/* Every record CUPTI holds delivered (forced: a closed window's last ones too). The buffers wait for take. */
static size_t g_win_lost; /* records CUPTI dropped, counted at each flush */

/* Every record CUPTI holds delivered (forced: a closed window's last ones too) and read into the window's rows,
 * names copied, before any finalize can free what they point to. */
int decodemon_win_flush(void) {
    int rc = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) == CUPTI_SUCCESS ? 0 : -1;
    take_records(&g_win, &g_win_extra);
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &lost) == CUPTI_SUCCESS) g_win_lost += lost;
    return rc;
}

/* Records CUPTI has delivered since the library was loaded (a window by time drains until this stops moving). */
int64_t decodemon_win_records(void) { return (int64_t)records_seen(); }

int decodemon_win_finalize(char *err, size_t n) {
    CUptiResult r = cuptiFinalize();
    if (r != CUPTI_SUCCESS) { say(err, n, "cuptiFinalize", r); return -1; }
    return 0;
}

static void encode_rows(buf_t *b, const rows_t *r, const char *const *cols) {
    mp_map(b, (uint32_t)r->ncols);
    int64_t *col = malloc((r->n ? r->n : 1) * sizeof *col);
    if (!col) { b->oom = 1; return; }
    for (size_t j = 0; j < r->ncols; j++) {
        for (size_t i = 0; i < r->n; i++) col[i] = r->v[i * r->ncols + j];
        mp_str(b, cols[j]);
        mp_col_i8(b, col, r->n);
    }
    free(col);
}

static const char *API_COLS[] = {"cbid", "start", "end", "correlation", "domain"};
static const char *COPY_COLS[] = {"start", "end", "bytes", "copy_kind"};

/* The window's columns: a msgpack map of names, kernels, apis, api_names ("0:cbid" -> the call's name),
 * memcpys, dropped_records and graph_kernels (whether a kernel came from a CUDA graph). */
static void encode_columns(buf_t *b, const window_t *w, const extra_t *x, size_t lost, int name_calls) {
    mp_map(b, 7);
    mp_str(b, "names");
    mp_arr(b, (uint32_t)w->n_names);
    for (size_t i = 0; i < w->n_names; i++) mp_str(b, w->names[i]);
    rows_t k = {w->rows, w->n, w->cap, KCOLS};
    mp_str(b, "kernels");
    encode_rows(b, &k, KERNEL_COLS);
    mp_str(b, "apis");
    encode_rows(b, &x->apis, API_COLS);
    mp_str(b, "memcpys");
    encode_rows(b, &x->copies, COPY_COLS);
    /* the calls' names, each cbid once */
    uint32_t seen_n = 0;
    uint8_t *seen = calloc(65536, 1);
    if (!seen) { b->oom = 1; return; }
    for (size_t i = 0; i < x->apis.n; i++) {
        int64_t cbid = x->apis.v[i * 5];
        if (cbid >= 0 && cbid < 65536 && !seen[cbid]) { seen[cbid] = 1; seen_n++; }
    }
    mp_str(b, "api_names");
    mp_map(b, seen_n);
    for (uint32_t cbid = 0; cbid < 65536 && seen_n; cbid++) {
        if (!seen[cbid]) continue;
        char key[24];
        const char *name = NULL;
        snprintf(key, sizeof key, "0:%u", cbid);
        mp_str(b, key);
        if (name_calls && cbid < g_runtime_n && g_runtime_names[cbid]) name = g_runtime_names[cbid];
        if (name) mp_str(b, name);
        else { snprintf(key, sizeof key, "cbid%u", cbid); mp_str(b, key); }
    }
    free(seen);
    kv_int(b, "dropped_records", (int64_t)(w->dropped + lost));
    int graph = 0;
    for (size_t i = 0; i < w->n && !graph; i++) graph = w->rows[i * KCOLS + 13] != 0;
    mp_str(b, "graph_kernels");
    mp_bool(b, graph);
}

static void win_clear(void) {
    window_clear(&g_win);
    free(g_win.rows);
    free(g_win.names);
    memset(&g_win, 0, sizeof g_win);
    free(g_win_extra.apis.v);
    free(g_win_extra.copies.v);
    g_win_extra.apis = (rows_t){0, 0, 0, 5};
    g_win_extra.copies = (rows_t){0, 0, 0, 4};
}

/* The records delivered since the last take, as the window's columns (encode_columns) in *out, which the caller
 * frees with decodemon_cupti_free. 0, or -1 out of memory. */
int decodemon_win_take(uint8_t **out, size_t *out_n) {
    buf_t b = {0};
    encode_columns(&b, &g_win, &g_win_extra, g_win_lost, 1);
    win_clear();
    g_win_lost = 0;
    if (b.oom) { free(b.p); return -1; }
    *out = b.p;
    *out_n = b.n;
    return 0;
}

/* ---------------------------------------------------------------- the socket */
static int send_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One frame behind its 4-byte little-endian length, in one sendmsg where the socket takes it whole (a reader
 * gets the length and the payload together), the rest by send_all. */
static int send_frame(int fd, buf_t *b) {
    if (b->oom) return -1;
    uint8_t len[4] = {(uint8_t)b->n, (uint8_t)(b->n >> 8), (uint8_t)(b->n >> 16), (uint8_t)(b->n >> 24)};
    struct iovec iov[2] = {{len, 4}, {b->p, b->n}};
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    ssize_t k;
    do k = sendmsg(fd, &m, MSG_NOSIGNAL); while (k < 0 && errno == EINTR);
    int rc = -1;
    if (k >= 0) {
        size_t sent = (size_t)k;
        rc = 0;
        if (sent < 4) rc = send_all(fd, len + sent, 4 - sent) || send_all(fd, b->p, b->n) ? -1 : 0;
        else if (sent < 4 + b->n) rc = send_all(fd, b->p + (sent - 4), b->n - (sent - 4));
    }
    b->n = 0;
    return rc;
}

static int send_bye(int fd, buf_t *b, const char *reason) {
    mp_map(b, 2);
    kv_str(b, "type", "bye");
    kv_str(b, "reason", reason);
    return send_frame(fd, b);
}

static void cmdline(buf_t *b) {
    char raw[8192];
    size_t n = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k;
        while (n < sizeof raw && (k = read(fd, raw + n, sizeof raw - n)) > 0) n += (size_t)k;
        close(fd);
    }
    uint32_t count = 0;
    for (size_t i = 0; i < n; i++) count += raw[i] == 0;
    mp_arr(b, count);
    for (size_t i = 0, s = 0; i < n; i++)
        if (raw[i] == 0) { mp_str_utf8(b, raw + s, i - s); s = i + 1; }
}

/* The device's facts from the CUDA driver that loaded this library (its symbols, found at run time: nothing
 * here links against libcuda), as wire.GpuInfo; device 0 of this process. Peak bandwidth and the driver's
 * version are NVML's, which the monitor adds (probes/device.nvml_facts). 0, or -1 with `why` set. */
typedef int (*cu_int_fn)(int *, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_uuid_fn)(unsigned char *, int);

static int gpu_facts(buf_t *b, char *why, size_t why_n) {
    cu_int_fn get = (cu_int_fn)dlsym(RTLD_DEFAULT, "cuDeviceGet");
    cu_attr_fn attr = (cu_attr_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetAttribute");
    cu_name_fn name_of = (cu_name_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetName");
    cu_mem_fn mem_of = (cu_mem_fn)dlsym(RTLD_DEFAULT, "cuDeviceTotalMem_v2");
    cu_uuid_fn uuid_of = (cu_uuid_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetUuid_v2");
    int (*drv_of)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "cuDriverGetVersion");
    int dev = 0, sms = 0, major = 0, minor = 0, drv = 0;
    if (!get || !attr || !name_of) { snprintf(why, why_n, "no CUDA driver in this process"); return -1; }
    int rc = get(&dev, 0);
    if (rc != 0) { snprintf(why, why_n, "no CUDA device 0 (CUDA error %d)", rc); return -1; }
    char name[256] = "";
    size_t mem = 0;
    unsigned char u[16] = {0};
    char uuid[48] = "";
    name_of(name, sizeof name, dev);
    attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    if (mem_of) mem_of(&mem, dev);
    if (drv_of) drv_of(&drv);
    if (uuid_of && uuid_of(u, dev) == 0)
        snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", major, minor);
    mp_map(b, 8);
    kv_int(b, "index", 0);
    kv_str(b, "name", name);
    kv_int(b, "sm_count", sms);
    mp_str(b, "mem_bandwidth_gbs");
    mp_f64(b, 0.0);
    kv_int(b, "memory_total_bytes", (int64_t)mem);
    kv_str(b, "uuid", uuid);
    kv_str(b, "cc", cc);
    kv_int(b, "cuda_driver_version", drv);
    return 0;
}

static int send_hello(int fd, buf_t *b) {
    char host[256] = "", why[128] = "";
    gethostname(host, sizeof host - 1);
    uint32_t v = 0;
    char ver[32] = "";
    if (cuptiGetVersion(&v) == CUPTI_SUCCESS) snprintf(ver, sizeof ver, "CUPTI API %u", v);
    mp_map(b, 10);
    kv_str(b, "type", "hello");
    kv_int(b, "wire_version", WIRE_VERSION);
    kv_int(b, "pid", getpid());
    mp_str(b, "argv");
    cmdline(b);
    kv_str(b, "python", "");
    mp_str(b, "hostname");
    mp_str_utf8(b, host, strlen(host));
    kv_str(b, "cupti_version", ver);
    mp_str(b, "gpu");
    size_t at = b->n;
    if (gpu_facts(b, why, sizeof why) != 0) {
        b->n = at;
        b_u8(b, 0xc0); /* nil */
    }
    kv_str(b, "gpu_unavailable", why);
    mp_str(b, "lease_s");
    mp_f64(b, LEASE_S);
    return send_frame(fd, b);
}

static int send_status(int fd, buf_t *b, const settings_t *s, int64_t windows, int64_t errors) {
    int armed = s->trace && !g_tr.error[0];
    mp_map(b, 9);
    kv_str(b, "type", "status");
    kv_str(b, "trace", !s->trace ? "off" : armed ? "armed" : "failed");
    kv_str(b, "trace_reason", !s->trace ? "settings" : armed ? "" : "error");
    kv_str(b, "trace_error", armed ? "" : g_tr.error);
    mp_str(b, "window_period_s");
    mp_f64(b, s->window_period_s);
    kv_str(b, "window_clock", armed ? "time" : "");
    kv_str(b, "window_clock_reason", armed ? "native" : "");
    kv_int(b, "windows", windows);
    kv_int(b, "errors", errors);
    return send_frame(fd, b);
}

/* A frame begun is whole within this, or the attach ends: a monitor that trickles its heartbeats a byte at a time
 * cannot hold the slot past the lease. */
#define FRAME_MS 2000

/* The n bytes at p from fd by `until` (mono_ns); 0, or -1 at the deadline, at end of stream or on an error. */
static int recv_by(int fd, uint8_t *p, size_t n, int64_t until) {
    for (size_t got = 0; got < n;) {
        int64_t left = until - mono_ns();
        struct pollfd pf = {fd, POLLIN, 0};
        int k = left > 0 ? poll(&pf, 1, (int)(left / 1000000) + 1) : 0;
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        ssize_t r = recv(fd, p + got, n - got, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Read one length-prefixed payload into p (at most cap bytes), waiting up to timeout_ms for it to start and
 * FRAME_MS for the rest; its length, 0 at end of stream or on a timeout, -1 on a frame too long, not whole in
 * time, or an error. */
static ssize_t read_frame(int fd, uint8_t *p, size_t cap, int timeout_ms) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0) return 0;
    uint8_t len[4];
    ssize_t k;
    do k = recv(fd, len, 4, MSG_DONTWAIT); while (k < 0 && errno == EINTR);
    if (k <= 0) return 0;
    int64_t until = mono_ns() + (int64_t)FRAME_MS * 1000000;
    if (k < 4 && recv_by(fd, len + k, (size_t)(4 - k), until)) return -1;
    size_t n = (size_t)len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
    if (n > cap || recv_by(fd, p, n, until)) return -1;
    return (ssize_t)n;
}

/* ---------------------------------------------------------------- the socket's home */
/* The socket lives in the per-user directory (probes/wire_socket.socket_dir), made, checked and used through its
 * fd: the directory opened under its parent's fd without following a link and checked to be this uid's, its mode
 * set by fchmod, the socket bound under /proc/self/fd/N of it and its mode set by name under N. No path can be
 * swapped between a check and a use. A directory that is refused (a link, another uid's) gets a private one of
 * this process's beside it (`<dir>-XXXXXXXX`); the monitor finds the socket from /proc/PID/net/unix either way,
 * through this process's own fd N, which stays open for the library's life. */
static int g_dir_fd = -1;
static char g_sock_name[32];
static pid_t g_sock_pid;
static int g_priv_parent = -1; /* a private directory's parent, to remove it at exit (-1: the per-user one) */
static char g_priv_name[96];

/* The directory `name` under `pfd`: a real directory of this uid (never followed through a link), made 0700
 * through its fd; its fd, or -1. */
static int checked_dir(int pfd, const char *name) {
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != getuid() || ((st.st_mode & 077) && fchmod(fd, 0700) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The socket directory's fd (the per-user one, or a private one beside it when that is refused), its path in
 * `dir` for messages; -1 with `dir` naming what was refused. A private one's parent fd and name go to *priv
 * and priv_name (else *priv is -1). */
static int own_socket_dir(char *dir, size_t n, int *priv, char *priv_name, size_t priv_n) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    const char *parent = "/tmp";
    char base[64];
    if (xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode)) {
        parent = xdg;
        snprintf(base, sizeof base, "decodemon");
    } else {
        snprintf(base, sizeof base, "decodemon-%u", (unsigned)getuid());
    }
    int len = snprintf(dir, n, "%s/%s", parent, base);
    *priv = -1;
    if (len < 0 || (size_t)len >= n) return -1;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return -1;
    if (mkdirat(pfd, base, 0700) != 0 && errno != EEXIST) { close(pfd); return -1; }
    int fd = checked_dir(pfd, base);
    for (int i = 0; fd < 0 && i < 16; i++) { /* refused: a private directory of this process's own */
        unsigned char r[4];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) break;
        char name[96];
        snprintf(name, sizeof name, "%s-%02x%02x%02x%02x", base, r[0], r[1], r[2], r[3]);
        if (mkdirat(pfd, name, 0700) != 0) continue;
        fd = checked_dir(pfd, name); /* swapped for another's since the mkdir: refused, and another name tried */
        if (fd >= 0) {
            snprintf(dir, n, "%s/%s", parent, name);
            snprintf(priv_name, priv_n, "%s", name);
            *priv = pfd;
            return fd;
        }
    }
    close(pfd);
    return fd;
}

/* A private directory removed: only the very one made here (the inode of `dfd`), and only once empty. */
static void remove_private(int pfd, const char *name, int dfd) {
    struct stat st, mine;
    if (pfd >= 0 && fstat(dfd, &mine) == 0 && fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == mine.st_dev && st.st_ino == mine.st_ino)
        unlinkat(pfd, name, AT_REMOVEDIR);
}

static void remove_socket(void) {
    struct stat st;
    if (g_dir_fd < 0 || getpid() != g_sock_pid) return; /* not a forked child's exit */
    if (fstatat(g_dir_fd, g_sock_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode))
        unlinkat(g_dir_fd, g_sock_name, 0);
    remove_private(g_priv_parent, g_priv_name, g_dir_fd);
}

static void register_exit(void) { atexit(remove_socket); }

/* Make the socket's home and listen there (a home made before is removed first): the listening fd, or -1 with a
 * line on stderr. */
static int listen_socket(void) {
    static pthread_once_t at_exit = PTHREAD_ONCE_INIT;
    remove_socket();
    if (g_dir_fd >= 0) close(g_dir_fd);
    if (g_priv_parent >= 0) close(g_priv_parent);
    g_dir_fd = g_priv_parent = -1;
    char dir[200] = "", priv_name[sizeof g_priv_name] = "";
    int priv = -1;
    int dfd = own_socket_dir(dir, sizeof dir, &priv, priv_name, sizeof priv_name);
    if (dfd < 0) {
        fprintf(stderr, "decodemon: no socket directory of this user's at %s; no traced windows\n", dir);
        return -1;
    }
    char name[32];
    snprintf(name, sizeof name, "%d.sock", (int)getpid());
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode)) unlinkat(dfd, name, 0);
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/%s", dfd, name);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* no umask here (it is the whole process's, and the engine's threads create files too): the directory is
     * 0700 and this user's, so the socket is out of others' reach until it is made 0600, by name under the
     * directory's fd (only this uid writes there) */
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || fchmodat(dfd, name, 0600, 0) != 0 ||
        listen(fd, 64) != 0) {
        fprintf(stderr, "decodemon: cannot listen in %s: %s; no traced windows\n", dir, strerror(errno));
        if (fd >= 0) close(fd);
        remove_private(priv, priv_name, dfd);
        close(dfd);
        if (priv >= 0) close(priv);
        return -1;
    }
    g_dir_fd = dfd;
    g_priv_parent = priv;
    memcpy(g_priv_name, priv_name, sizeof g_priv_name);
    memcpy(g_sock_name, name, sizeof g_sock_name);
    g_sock_pid = getpid();
    pthread_once(&at_exit, register_exit);
    return fd;
}

/* For tests: the socket's home made and listened on, as the agent thread does at its start; the listening fd. */
int decodemon_cupti_listen(void) { return listen_socket(); }

static pid_t peer_pid(int fd, int *ok) {
    struct ucred c;
    socklen_t n = sizeof c;
    *ok = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &n) != 0) return 0;
    *ok = c.uid == getuid() || c.uid == 0; /* this process's user, or root (who may watch any process) */
    return c.pid;
}

static void window_release(window_t *w, buf_t *b) {
    window_clear(w);
    free(w->rows);
    free(w->names);
    memset(w, 0, sizeof *w);
    free(b->p); /* a window's frame can be tens of MB: none of it is kept in the engine between windows */
    memset(b, 0, sizeof *b);
}

static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_slot_cv = PTHREAD_COND_INITIALIZER;
static int g_slot_fd = -1;   /* a monitor handed to the serving thread and not yet taken */
static pid_t g_holder;       /* the monitor in the slot (handed over or served), 0 when none */
static int64_t g_heard;      /* mono_ns of the holder's last whole frame (atomic: the door reads it to say so) */
static settings_t g_slot_settings;

/* The slot free again, before the monitor hears its Bye: one that attaches again once it has is served. */
static void release_slot(int *released) {
    if (*released) return;
    pthread_mutex_lock(&g_slot_mu);
    g_holder = 0;
    pthread_mutex_unlock(&g_slot_mu);
    *released = 1;
}

/* One attach, from the monitor's Attach (read by the door) to our Bye (no Bye after a send that failed: the
 * stream may end mid-frame, and a frame after it would be read as the rest of that one). */
static void serve(int fd, const settings_t *sp) {
    static uint8_t msg[MAX_CONTROL_BYTES];
    buf_t b = {0};
    window_t w = {0};
    settings_t s = *sp;
    char why[160];
    ssize_t n;
    int released = 0;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* reads wait no longer than read_frame's FRAME_MS */
    if (s.trace) tracer_ready();
    int64_t windows = 0, errors = 0;
    if (send_hello(fd, &b) || send_status(fd, &b, &s, windows, errors)) goto out;
    int64_t next = mono_ns() + (int64_t)(0.5e9 < s.window_period_s * 1e9 ? 0.5e9 : s.window_period_s * 1e9);
    int64_t heard = mono_ns(), lease = (int64_t)(LEASE_S * 1e9);
    __atomic_store_n(&g_heard, heard, __ATOMIC_RELAXED);
    const char *reason = "detached";
    char silent[64];
    int broken = 0;
    for (;;) {
        int64_t until = next < heard + lease ? next : heard + lease, wait_ns = until - mono_ns();
        struct pollfd pf[1] = {{fd, POLLIN, 0}};
        int k = poll(pf, 1, wait_ns > 0 ? (int)(wait_ns / 1000000) + 1 : 0);
        if (k > 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            n = read_frame(fd, msg, sizeof msg, 0);
            if (n <= 0) { reason = "monitor went away"; break; }
            settings_t ignored;
            int kind = parse_control(msg, (size_t)n, &ignored, why, sizeof why);
            if (kind == MSG_DETACH) break;
            if (kind != MSG_BAD) __atomic_store_n(&g_heard, heard = mono_ns(), __ATOMIC_RELAXED);
            continue;
        }
        /* nothing waiting to be read (a window's seconds may have passed unread: what came then was read first) */
        if (mono_ns() - heard >= lease) {
            snprintf(silent, sizeof silent, "dropped: silent for %.1f s", (double)(mono_ns() - heard) / 1e9);
            reason = silent;
            struct timeval quick = {0, 200000}; /* its Bye where it fits: a client that reads nothing waits no one */
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &quick, sizeof quick);
            break;
        }
        if (mono_ns() < next) continue;
        if (!s.trace || !tracer_ready()) { next = mono_ns() + (int64_t)(s.window_period_s * 1e9); continue; }
        int64_t t_open, t_close, host_ns;
        char err[sizeof g_tr.error];
        int rc = trace_window(&w, s.time_window_s, &t_open, &t_close, &host_ns, err, sizeof err);
        next = mono_ns() + (int64_t)(s.window_period_s * 1e9); /* the period runs from the window's end */
        if (rc == 0) {
            encode_window(&b, &w, g_tr.windows, t_open, t_close, host_ns);
            if (b.oom) {
                rc = -1;
                snprintf(err, sizeof err, "out of memory packing a window of %zu kernels", w.n);
                b.oom = 0;
                b.n = 0;
            }
        }
        if (rc != 0) {
            memcpy(g_tr.error, err, sizeof g_tr.error);
            errors++;
            window_release(&w, &b);
            if (send_status(fd, &b, &s, windows, errors)) { reason = "monitor went away"; broken = 1; break; }
            continue;
        }
        g_tr.error[0] = 0;
        g_tr.windows++;
        windows++;
        if (send_frame(fd, &b)) { reason = "monitor went away"; broken = 1; break; }
        window_release(&w, &b);
        if (send_status(fd, &b, &s, windows, errors)) { reason = "monitor went away"; broken = 1; break; }
    }
    release_slot(&released);
    if (!broken) send_bye(fd, &b, reason);
out:
    release_slot(&released);
    window_release(&w, &b);
}

/* ---------------------------------------------------------------- the door and the monitor slot */
/* The door thread accepts newcomers and reads each one's Attach without blocking on any of them: a connection
 * that has not sent its Attach whole within HANDSHAKE_MS is dropped (told so), and past MAX_PENDING at once the
 * oldest is. A whole Attach goes to the monitor slot, which the serving thread takes; a second monitor while one
 * is attached is told who is, by the door, so the attached monitor's windows never wait on a newcomer. */
#define HANDSHAKE_MS 2000
#define MAX_PENDING 64

typedef struct {
    int fd;
    pid_t pid;
    int64_t deadline;
    uint8_t len[4];
    uint32_t got, n;   /* bytes read, and the payload's length once the prefix is whole */
    uint8_t *payload;
} newcomer_t;

static void say_and_close(int fd, buf_t *b, const char *reason) {
    if (reason) send_bye(fd, b, reason); /* the socket is non-blocking: a Bye that does not fit is not sent */
    shutdown(fd, SHUT_WR);
    close(fd);
}

static void drop(newcomer_t *p, int i, int *np, buf_t *b, const char *reason) {
    say_and_close(p[i].fd, b, reason);
    free(p[i].payload);
    memmove(p + i, p + i + 1, (size_t)(*np - i - 1) * sizeof *p);
    (*np)--;
}

/* A whole Attach: refused, told the slot is taken, or handed to the serving thread. */
static void admit(newcomer_t *c, buf_t *b) {
    settings_t s;
    char why[160];
    if (parse_control(c->payload, c->n, &s, why, sizeof why) != MSG_ATTACH) { say_and_close(c->fd, b, NULL); return; }
    if (why[0]) {
        char line[200];
        snprintf(line, sizeof line, "refused: %s", why);
        say_and_close(c->fd, b, line);
        return;
    }
    pthread_mutex_lock(&g_slot_mu);
    pid_t holder = g_holder;
    int64_t now = mono_ns();
    if (!holder) {
        g_holder = c->pid;
        g_slot_fd = c->fd;
        g_slot_settings = s;
        __atomic_store_n(&g_heard, now, __ATOMIC_RELAXED); /* until its attach's loop hears it */
        pthread_cond_signal(&g_slot_cv);
    }
    pthread_mutex_unlock(&g_slot_mu);
    if (holder) {
        double ago = (double)(now - __atomic_load_n(&g_heard, __ATOMIC_RELAXED)) / 1e9;
        snprintf(why, sizeof why, "busy: monitor pid %d is attached (last heard %.1f s ago); one monitor at a time",
                 (int)holder, ago > 0 ? ago : 0.0);
        say_and_close(c->fd, b, why);
    }
}

/* Read what newcomer i has sent; 1 when it is done with (admitted, refused or gone), else 0. */
static int read_newcomer(newcomer_t *c, buf_t *b) {
    for (;;) {
        ssize_t k;
        if (c->got < 4) k = recv(c->fd, c->len + c->got, 4 - c->got, MSG_DONTWAIT);
        else k = recv(c->fd, c->payload + (c->got - 4), c->n - (c->got - 4), MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k <= 0) { say_and_close(c->fd, b, NULL); return 1; }
        c->got += (uint32_t)k;
        if (c->got == 4) {
            c->n = (uint32_t)c->len[0] | (uint32_t)c->len[1] << 8 | (uint32_t)c->len[2] << 16 |
                   (uint32_t)c->len[3] << 24;
            if (c->n > MAX_CONTROL_BYTES) {
                say_and_close(c->fd, b, "refused: a first frame longer than an Attach");
                return 1;
            }
            c->payload = malloc(c->n ? c->n : 1);
            if (!c->payload) { say_and_close(c->fd, b, NULL); return 1; }
        }
        if (c->got >= 4 && c->got - 4 == c->n) { admit(c, b); return 1; }
    }
}

static void *serve_slot(void *arg);

static void *agent_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "dm-agent");
    int lfd = listen_socket();
    if (lfd < 0) return NULL;
    fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int started = pthread_create(&t, &a, serve_slot, NULL) == 0; /* signals stay blocked: this thread's mask */
    pthread_attr_destroy(&a);
    if (!started) { close(lfd); return NULL; }
    static newcomer_t p[MAX_PENDING];
    int np = 0;
    buf_t b = {0};
    for (;;) {
        int64_t now = mono_ns();
        for (int i = 0; i < np;) {
            if (p[i].deadline <= now) drop(p, i, &np, &b, "dropped: no whole Attach within 2 s");
            else i++;
        }
        int wait_ms = -1;
        for (int i = 0; i < np; i++) {
            int ms = (int)((p[i].deadline - now) / 1000000) + 1;
            if (wait_ms < 0 || ms < wait_ms) wait_ms = ms;
        }
        struct pollfd pf[MAX_PENDING + 1];
        pf[0] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < np; i++) pf[i + 1] = (struct pollfd){p[i].fd, POLLIN, 0};
        int k = poll(pf, (nfds_t)np + 1, wait_ms);
        if (k < 0 && errno != EINTR) break;
        if (k <= 0) continue;
        /* the newcomers first (their fds are pf[1..np]), from the last so that a drop leaves the rest in place */
        for (int i = np - 1; i >= 0; i--)
            if (pf[i + 1].revents && read_newcomer(&p[i], &b)) {
                free(p[i].payload);
                memmove(p + i, p + i + 1, (size_t)(np - i - 1) * sizeof *p);
                np--;
            }
        if (!(pf[0].revents & POLLIN)) continue;
        for (;;) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                /* EAGAIN: all taken; out of fds or memory: the queue waits, rather than a busy loop on it */
                if (errno != EAGAIN && errno != EWOULDBLOCK) usleep(100000);
                break;
            }
            int ok;
            pid_t pid = peer_pid(fd, &ok);
            if (!ok) { close(fd); continue; }
            if (np == MAX_PENDING) drop(p, 0, &np, &b, "dropped: too many connections at once");
            p[np] = (newcomer_t){fd, pid, mono_ns() + (int64_t)HANDSHAKE_MS * 1000000, {0}, 0, 0, NULL};
            if (read_newcomer(&p[np], &b)) free(p[np].payload); /* a monitor's Attach is usually there already */
            else np++;
        }
    }
    free(b.p);
    return NULL;
}

/* The serving thread: one monitor at a time, as the door hands them over. */
static void *serve_slot(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "dm-serve");
    for (;;) {
        pthread_mutex_lock(&g_slot_mu);
        while (g_slot_fd < 0) pthread_cond_wait(&g_slot_cv, &g_slot_mu);
        int fd = g_slot_fd;
        settings_t s = g_slot_settings;
        g_slot_fd = -1;
        pthread_mutex_unlock(&g_slot_mu);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        serve(fd, &s); /* frees the slot before its Bye */
        close(fd);
    }
    return NULL;
}

static void start_agent(void) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the engine's signals stay its own threads' */
    pthread_create(&t, &a, agent_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
}

/* Called by the CUDA driver at cuInit (CUDA_INJECTION64_PATH): start the agent thread once, and return. */
int InitializeInjection(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, start_agent);
    return 1;
}

/* DECODEMON_CUPTI_START_AT_LOAD=1 starts the agent thread when the library is loaded (LD_PRELOAD), without
 * waiting for cuInit: a process that never initialises CUDA (a CPU build, CI) still answers on the wire. */
__attribute__((constructor)) static void start_at_load(void) {
    const char *e = getenv("DECODEMON_CUPTI_START_AT_LOAD");
    if (e && strcmp(e, "1") == 0) InitializeInjection();
}
