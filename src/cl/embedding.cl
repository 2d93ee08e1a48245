/*
 * embedding.cl: token embeddings, the forward gather and a deterministic backward.
 *
 *   emb_check  the first position whose id is outside [0, V) (atomic_min on an int: the smallest
 *              such position whatever the order, so the report is deterministic)
 *   emb_fwd    out[i, :] = weight[ids[i], :], storage copied bit for bit; a row of work-groups
 *              per position, grid-stride over positions
 *   emb_bwd    a row of work-groups per position i (a work-item a column): when i is the first
 *              occurrence of its id, they own dweight[id, :] and add the sum of dout[j, :] over
 *              every j >= i holding that id, in increasing j. One owner per row and a fixed
 *              order: no atomics, the same bits run after run. Each of the owner's work-groups
 *              lists the id's positions in local memory with one pass over the ids (a prefix
 *              sum keeps them in order), so that each column then sums only those rows; an id
 *              with more than LIST positions sums them by scanning the ids again for each
 *              column, in the same order.
 *
 * Dtypes: ID_DT (I32 or I64) for the ids, DT (F32, BF16, F16) for weight and out, or dout;
 * dweight is f32. Tunables: WG (work-group size, default 256), LIST (positions an owner lists
 * in local memory, default 2048).
 */
#ifndef WG
#define WG 256
#endif
#ifndef LIST
#define LIST 2048
#endif
#ifndef ID_DT
#define ID_DT I64
#endif
#ifndef DT
#define DT F32
#endif

typedef STORAGE(ID_DT) tok_t;
typedef STORAGE(DT) st_t;

#define TOKEN(i) LOAD(ID_DT, ids, ioff + (i) * istride)

__kernel void emb_check(const __global tok_t *ids, ulong ioff, long istride, long n, long V,
                        __global int *bad)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    /* one unsigned compare: Mesa's LLVM 15 (rusticl) folds id < 0 || id >= V into a test that
       passes negative ids sign-extended from I32 */
    if ((ulong)TOKEN(i) >= (ulong)V)
        atomic_min(bad, (int)i);
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
emb_fwd(const __global tok_t *ids, ulong ioff, long istride, long n, const __global st_t *w,
        ulong woff, long ws, long H, __global st_t *out, ulong ooff, long os)
{
    for (long i = get_group_id(1); i < n; i += get_num_groups(1)) {
        const long id = TOKEN(i);
        for (long h = get_global_id(0); h < H; h += get_global_size(0))
            out[ooff + i * os + h] = w[woff + id * ws + h];
    }
}

/* Exclusive prefix sum of each work-item's flag over the work-group (scan: WG ints); returns the
   total. */
inline int emb_scan(__local int *scan, int flag, int *before)
{
    const int lid = get_local_id(0);
    scan[lid] = flag;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int d = 1; d < WG; d *= 2) {
        const int add = lid >= d ? scan[lid - d] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        scan[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *before = scan[lid] - flag;
    const int total = scan[WG - 1];
    barrier(CLK_LOCAL_MEM_FENCE); /* everyone has read scan before it is written again */
    return total;
}

/* Whether a position before i holds id: then i is not the first and owns nothing. */
inline int emb_seen_before(const __global tok_t *ids, ulong ioff, long istride, long i, long id,
                           __local int *seen)
{
    if (get_local_id(0) == 0)
        *seen = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long j = get_local_id(0); j < i; j += WG)
        if (TOKEN(j) == id)
            *seen = 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int r = *seen;
    barrier(CLK_LOCAL_MEM_FENCE); /* everyone has read seen before it is reset */
    return r;
}

/* The positions j >= i holding id, in increasing order, into list (the first LIST of them);
   returns how many there are. */
inline int emb_positions(const __global tok_t *ids, ulong ioff, long istride, long i, long n,
                         long id, __local int *scan, __local int *list)
{
    int count = 0;
    for (long j0 = i; j0 < n; j0 += WG) {
        const long j = j0 + get_local_id(0);
        const int hit = j < n && TOKEN(j) == id;
        int before;
        const int total = emb_scan(scan, hit, &before);
        if (hit && count + before < LIST)
            list[count + before] = (int)j;
        count += total;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return count;
}

/*
 * dweight[id, h] += the sum of dout[j, h] over the listed positions, in list order: the loads go
 * out eight at a time, the additions stay in order (a long list is a chain of dependent loads
 * otherwise: a byte-level corpus's space owns a seventh of the positions).
 */
inline float emb_sum_listed(const __global st_t *dout, ulong doff, long ds, long h,
                            const __local int *list, int count)
{
    float acc = 0.0f;
    int e = 0;
    for (; e + 8 <= count; e += 8) {
        float v[8];
        for (int q = 0; q < 8; ++q)
            v[q] = LOAD(DT, dout, doff + list[e + q] * ds + h);
        for (int q = 0; q < 8; ++q)
            acc += v[q];
    }
    for (; e < count; ++e)
        acc += LOAD(DT, dout, doff + list[e] * ds + h);
    return acc;
}

/* Grid: (column blocks of WG, positions); every block of a position repeats its owner check. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
emb_bwd(const __global tok_t *ids, ulong ioff, long istride, long n, const __global st_t *dout,
        ulong doff, long ds, long H, __global float *dw, ulong dwoff, long dws)
{
    __local int seen, scan[WG], list[LIST];
    for (long i = get_group_id(1); i < n; i += get_num_groups(1)) {
        const long id = TOKEN(i);
        if (emb_seen_before(ids, ioff, istride, i, id, &seen))
            continue;
        const int count = emb_positions(ids, ioff, istride, i, n, id, scan, list);
        for (long h = get_global_id(0); h < H; h += get_global_size(0)) {
            float acc = 0.0f;
            if (count <= LIST) {
                acc = emb_sum_listed(dout, doff, ds, h, list, count);
            } else {
                for (long j = i; j < n; ++j)
                    if (TOKEN(j) == id)
                        acc += LOAD(DT, dout, doff + j * ds + h);
            }
            dw[dwoff + id * dws + h] += acc;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the list is read before the next owner writes it */
    }
}
