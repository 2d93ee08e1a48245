/*
 * embedding.cl: token embeddings, the forward gather and a deterministic backward.
 *
 *   emb_check  the first position whose id is outside [0, V) (atomic_min on an int: the smallest
 *              such position whatever the order, so the report is deterministic)
 *   emb_fwd    out[i, :] = weight[ids[i], :], storage copied bit for bit; a row of work-groups
 *              per position, grid-stride over positions
 *   emb_bwd    a work-group per position i: when i is the first occurrence of its id, it owns
 *              dweight[id, :] and adds the sum of dout[j, :] over every j >= i holding that id,
 *              in increasing j. One owner per row and a fixed order: no atomics, the same bits
 *              run after run.
 *
 * Dtypes: ID_DT (I32 or I64) for the ids, DT (F32, BF16, F16) for weight and out, or dout;
 * dweight is f32. Tunables: WG (work-group size, default 256).
 */
#ifndef WG
#define WG 256
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
    const long id = TOKEN(i);
    if (id < 0 || id >= V)
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

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
emb_bwd(const __global tok_t *ids, ulong ioff, long istride, long n, const __global st_t *dout,
        ulong doff, long ds, long H, __global float *dw, ulong dwoff, long dws)
{
    __local int seen;
    const int lid = get_local_id(0);
    for (long i = get_group_id(0); i < n; i += get_num_groups(0)) {
        const long id = TOKEN(i);
        if (lid == 0)
            seen = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (long j = lid; j < i; j += WG)
            if (TOKEN(j) == id)
                seen = 1;
        barrier(CLK_LOCAL_MEM_FENCE);
        const int first = !seen;
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone has read seen before it is reset */
        if (!first)
            continue;
        for (long h = lid; h < H; h += WG) {
            float acc = 0.0f;
            for (long j = i; j < n; ++j)
                if (TOKEN(j) == id)
                    acc += LOAD(DT, dout, doff + j * ds + h);
            dw[dwoff + id * dws + h] += acc;
        }
    }
}
