/*
 * rope.cl: rotary position embedding in place on q and k (forward), or the inverse rotation on dq
 * and dk (backward: sign -1 negates sin).
 *
 * q and k are strided 4-D views read as (batch b, head h, token t, element d), d unit-stride, so
 * both [B, H, T, D] and [B, T, H, D] arrive as strides. Heads 0..hq-1 are q's and hq..hq+hk-1 are
 * k's, one index space, so one launch rotates both. A token (b, t) has `slots` work-items: each
 * owns VEC consecutive pairs (a chunk) of HPT heads, obtains cos/sin for its chunk once (from the
 * tables or computed) and applies them to every one of its heads, loading all HPT heads before it
 * stores any (memory-level parallelism; stores may alias later loads, so the compiler would not
 * reorder them). A work-group holds `tpw` tokens and strides over the grid (64-bit offsets).
 *
 * Pairs: half-split (STYLE 0) rotates elements (i, i + pairs); interleaved (STYLE 1) rotates
 * (2i, 2i + 1). Elements past 2 * pairs (partial rotary) are never touched.
 *
 * Defines (the launcher sets them):
 *   DT      storage of q and k: F32, BF16 or F16 (math in f32).
 *   STYLE   0 half-split (Hugging Face / NeoX), 1 interleaved (GPT-J).
 *   SRC     0 f32 cos/sin tables indexed [b, t, i] by strides; 1 angles from positions.
 *   POS_DT  I32 or I64: the positions' storage (SRC 1).
 *   SHARE   1 (SRC 1 only): a work-group computes its tokens' cos/sin once into local memory
 *           (8 * tpw * pairs bytes) and all its head groups share them; 0: per work-item.
 *   TALIGNED 1: the tables' offsets and strides are multiples of VEC (whole-vector loads);
 *           0: element-aligned vloadn.
 *   RAW16   1: bf16 heads held as stored between their loads and the rotation (vec_io.cl's raw
 *           vectors): where VEC is 4 or 8.
 * Tunables (kernel keys "rope" with tables, "rope_pos" with computed angles; size key
 * rotary_dim / 2 * (Hq + Hk)):
 *   VEC     pairs per work-item: 1, 2, 4 or 8 (default 8; 4 for f32). The launcher lowers it
 *           until the pair count and every offset and stride of q and k are multiples of it, so q
 *           and k move as aligned vectors (16 bytes for 8 pairs of 16-bit halves).
 *   HPT     heads per work-item sharing one cos/sin: 1 to 16 (default 4; 1 on NVIDIA); registers
 *           grow with 2 * HPT * VEC floats.
 *   WG      target work-group size, a launch parameter (default 256; 128 on NVIDIA with ORDER 1):
 *           tpw = max(1, WG / slots) tokens per group, lowered to fill whole warps where some count
 *           does, and to what the kernel allows.
 *   ORDER   0 or 1, as above (default 0; on NVIDIA 1 where q's token stride is smaller than its
 *           head stride).
 *   HINT    NVIDIA only (LLMCL_NV_PTX), on 16-byte vectors (VEC 8 of bf16 or f16, VEC 4 of f32;
 *           else ignored): bit 0: loads without L1 allocation (ld.global.L1::no_allocate; never
 *           the read-only path, as q and k are written); bit 1: streaming stores (st.global.cs):
 *           0 to 3 (default 0).
 *
 * Precision (SRC 1): as in Hugging Face, inv_freq = 1 / theta^(2i / rotary_dim) and the angle
 * pos * inv_freq are f32, so the angle carries an error of about |pos| * 2^-23 rad; cos and sin of
 * it use the precise built-ins (full argument reduction), never native_ ones.
 */

#ifndef DT
#define DT F32
#endif
#ifndef STYLE
#define STYLE 0
#endif
#ifndef SRC
#define SRC 0
#endif
#ifndef POS_DT
#define POS_DT I32
#endif
#ifndef TALIGNED
#define TALIGNED 0
#endif
#ifndef SHARE
#define SHARE 0
#endif
#ifndef VEC
#define VEC 8
#endif
#ifndef HPT
#define HPT 4
#endif
#ifndef ORDER
#define ORDER 0
#endif
#ifndef HINT
#define HINT 0
#endif

/* ---- VEC-wide aligned loads and stores of q and k ---- */

#if VEC == 1
typedef float floatv;
#define VLOAD(p, i) LOAD(DT, p, i)
#define VSTORE(p, i, v) STORE(DT, p, i, v)
#define TLOAD(p) (*(p))
#else
typedef LLMCL_CAT(float, VEC) floatv;
#define VLOAD(p, i) LLMCL_CAT(vload_, DT)((p), (i))
#define VSTORE(p, i, v) LLMCL_CAT(vstore_, DT)((p), (i), (v))
#if TALIGNED
#define TLOAD(p) (*(const __global floatv *)(p))
#else
#define TLOAD(p) LLMCL_CAT(vload, VEC)(0, (p))
#endif
LLMCL_VEC_IO_ALIGNED()
#endif

/*
 * Interleaved pairs: two loaded vectors a (elements 2 i0 ..) and b (the next VEC) hold VEC pairs;
 * DEINT splits them into first members x and second members y, REINT puts them back.
 */
#if VEC == 1
#define DEINT(a, b, x, y) (x = (a), y = (b))
#define REINT(x, y, a, b) (a = (x), b = (y))
#elif VEC == 2
#define DEINT(a, b, x, y) (x = (float2)((a).s0, (b).s0), y = (float2)((a).s1, (b).s1))
#define REINT(x, y, a, b) (a = (float2)((x).s0, (y).s0), b = (float2)((x).s1, (y).s1))
#elif VEC == 4
#define DEINT(a, b, x, y) (x = (float4)((a).even, (b).even), y = (float4)((a).odd, (b).odd))
#define REINT(x, y, a, b)                                                                          \
    (a = (float4)((x).s0, (y).s0, (x).s1, (y).s1), b = (float4)((x).s2, (y).s2, (x).s3, (y).s3))
#else
#define DEINT(a, b, x, y) (x = (float8)((a).even, (b).even), y = (float8)((a).odd, (b).odd))
#define REINT(x, y, a, b)                                                                          \
    (a = (float8)((x).s0, (y).s0, (x).s1, (y).s1, (x).s2, (y).s2, (x).s3, (y).s3),                 \
     b = (float8)((x).s4, (y).s4, (x).s5, (y).s5, (x).s6, (y).s6, (x).s7, (y).s7))
#endif

/*
 * inv_freq of pair i, with Llama 3 scaling when l3_factor > 0 (Hugging Face's
 * _compute_llama3_parameters: long wavelengths divided by the factor, short ones kept, the band
 * between interpolated). All in f32 as there.
 */
inline float rope_inv_freq(int i, int rotary_dim, float theta, float l3_factor, float l3_low,
                           float l3_high, float l3_orig, float l3_low_wl, float l3_high_wl)
{
    float inv = 1.0f / pow(theta, (float)(2 * i) / (float)rotary_dim);
    if (l3_factor > 0.0f) {
        const float wavelen = 2.0f * M_PI_F / inv;
        if (wavelen > l3_low_wl) {
            inv = inv / l3_factor;
        } else if (wavelen >= l3_high_wl) {
            const float smooth = (l3_orig / wavelen - l3_low) / (l3_high - l3_low);
            inv = (1.0f - smooth) * inv / l3_factor + smooth * inv;
        }
    }
    return inv;
}

/* The rotation of one work-item's VEC pairs (from pair i0) in its HPT heads (group hg) of token
 * (b, t), with cos c and sin sn of those pairs. Loads every head before storing any. */
inline void rope_heads(__global STORAGE(DT) *q, long q_off, long qsb, long qsh, long qst,
                       __global STORAGE(DT) *k, long k_off, long ksb, long ksh, long kst, int hq,
                       int nh, int pairs, long b, long t, int hg, int i0, floatv c, floatv sn)
{
#if STYLE == 0
    const long e0 = i0, e1 = (long)i0 + pairs;
#else
    const long e0 = 2L * i0, e1 = 2L * i0 + VEC;
#endif
    long base[HPT];
    __global STORAGE(DT) *ptr[HPT];
    VRAW va[HPT], vb[HPT];
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
        const int h = hg * HPT + j;
        if (h < hq) {
            ptr[j] = q;
            base[j] = q_off + b * qsb + h * qsh + t * qst;
        } else {
            ptr[j] = k;
            base[j] = k_off + b * ksb + (long)(h - hq) * ksh + t * kst;
        }
        if (h < nh) {
            va[j] = VRAW_LOAD(ptr[j], base[j] + e0);
            vb[j] = VRAW_LOAD(ptr[j], base[j] + e1);
        }
    }
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
        if (hg * HPT + j < nh) {
            const floatv v0 = VRAW_F32(va[j]), v1 = VRAW_F32(vb[j]);
            floatv x, y;
#if STYLE == 0
            x = v0;
            y = v1;
#else
            DEINT(v0, v1, x, y);
#endif
            const floatv xr = x * c - y * sn, yr = y * c + x * sn;
            floatv oa, ob;
#if STYLE == 0
            oa = xr;
            ob = yr;
#else
            REINT(xr, yr, oa, ob);
#endif
            VSTORE(ptr[j], base[j] + e0, oa);
            VSTORE(ptr[j], base[j] + e1, ob);
        }
    }
}

#if VEC == 1
#define LLOAD(p) (*(p))
#else
#define LLOAD(p) LLMCL_CAT(vload, VEC)(0, (p))
#endif

#define ROPE_HEADS(hg, i0, c, sn)                                                                  \
    rope_heads(q, (long)q_off, qsb, qsh, qst, k, (long)k_off, ksb, ksh, kst, hq, nh, pairs, b, t,  \
               (hg), (i0), (c), (sn))

/* cos c and sin sn of pairs i0 .. i0 + VEC - 1 of token (b, t): from the tables, or computed. */
#if SRC == 0
#define ROPE_ANGLES(i0, c, sn)                                                                     \
    do {                                                                                           \
        c = TLOAD(ctab + c_off + b * tsb + t * tst + (i0));                                        \
        sn = TLOAD(stab + s_off + b * tsb + t * tst + (i0));                                       \
    } while (0)
#else
#define ROPE_ANGLES(i0, c, sn)                                                                     \
    rope_angles((float)LOAD(POS_DT, pos, p_off + b * psb + t * pst), (i0), pairs, theta,          \
                l3_factor, l3_low, l3_high, l3_orig, l3_low_wl, l3_high_wl, &(c), &(sn))

inline void rope_angles(float p, int i0, int pairs, float theta, float l3_factor, float l3_low,
                        float l3_high, float l3_orig, float l3_low_wl, float l3_high_wl,
                        floatv *c, floatv *sn)
{
    float ca[VEC], sa[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const float inv = rope_inv_freq(i0 + v, 2 * pairs, theta, l3_factor, l3_low, l3_high,
                                        l3_orig, l3_low_wl, l3_high_wl);
        sa[v] = sincos(p * inv, &ca[v]);
    }
    *c = LLOAD(ca);
    *sn = LLOAD(sa);
}
#endif

/*
 * One launch for all heads of q and k. ORDER 0: a work-group takes tpw tokens at a time, `slots`
 * items per token; each item owns the pairs chunk (s % cv) of head group (s / cv). ORDER 1:
 * `slots` is cv; a work-group takes tpw consecutive tokens of one head group at a time, an item
 * owning one chunk of one token.
 *
 * SHARE (computed angles): the group first computes cos/sin of its tokens' pairs once into local
 * memory (lcs, 2 * tpw * pairs floats), then every head group reads them there (ORDER 1: each item
 * loops over the head groups); otherwise each item loads (tables) or computes its chunk's cos/sin
 * itself.
 */
__kernel void rope(__global STORAGE(DT) *q, ulong q_off, long qsb, long qsh, long qst,
                   __global STORAGE(DT) *k, ulong k_off, long ksb, long ksh, long kst, int hq,
                   int hk, int n_tok, long n_tokens, int pairs, int slots, int tpw,
                   const __global float *ctab, ulong c_off, const __global float *stab, ulong s_off,
                   long tsb, long tst, const __global STORAGE(POS_DT) *pos, ulong p_off, long psb,
                   long pst, float theta, float l3_factor, float l3_low, float l3_high,
                   float l3_orig, float l3_low_wl, float l3_high_wl, float sign, __local float *lcs)
{
    const uint lid = get_local_id(0), wg = get_local_size(0);
    const uint sub = lid / (uint)slots; /* this item's token within the group */
    const uint s0 = lid - sub * (uint)slots;
    const int cv = pairs / VEC; /* chunks per head */
    const int nh = hq + hk;

#if SHARE
    __local float *lc = lcs, *ls = lcs + tpw * pairs;
    for (long blk = get_group_id(0); blk * tpw < n_tokens; blk += get_num_groups(0)) {
        for (int e = (int)lid; e < tpw * pairs; e += (int)wg) {
            const long tok = blk * tpw + e / pairs;
            if (tok < n_tokens) {
                const long b = (uint)tok / (uint)n_tok, t = tok - b * n_tok; /* B * T < 2^31 */
                const float p = (float)LOAD(POS_DT, pos, p_off + b * psb + t * pst);
                const float inv = rope_inv_freq(e % pairs, 2 * pairs, theta, l3_factor, l3_low,
                                                l3_high, l3_orig, l3_low_wl, l3_high_wl);
                float cosv;
                ls[e] = sign * sincos(p * inv, &cosv);
                lc[e] = cosv;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const long tok = blk * tpw + sub;
        if ((int)sub < tpw && tok < n_tokens) {
            const long b = (uint)tok / (uint)n_tok, t = tok - b * n_tok; /* B * T < 2^31 */
            for (uint s = s0; s < (uint)slots; s += wg) {
#if ORDER == 0
                const int i0 = ((int)s % cv) * VEC;
                ROPE_HEADS((int)s / cv, i0, LLOAD(lc + sub * pairs + i0),
                           LLOAD(ls + sub * pairs + i0));
#else
                const int i0 = (int)s * VEC;
                const floatv c = LLOAD(lc + sub * pairs + i0), sn = LLOAD(ls + sub * pairs + i0);
                for (int hg = 0; hg * HPT < nh; ++hg)
                    ROPE_HEADS(hg, i0, c, sn);
#endif
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#elif ORDER == 0
    if ((int)sub >= tpw)
        return;
    for (long tok = (long)get_group_id(0) * tpw + sub; tok < n_tokens;
         tok += (long)get_num_groups(0) * tpw) {
        const long b = (uint)tok / (uint)n_tok, t = tok - b * n_tok; /* B * T < 2^31 */
        for (uint s = s0; s < (uint)slots; s += wg) {
            const int i0 = ((int)s % cv) * VEC;
            floatv c, sn;
            ROPE_ANGLES(i0, c, sn);
            ROPE_HEADS((int)s / cv, i0, c, sign * sn);
        }
    }
#else
    if ((int)sub >= tpw)
        return;
    const long n_tb = (n_tokens + tpw - 1) / tpw; /* token blocks per head group */
    const long n_blk = n_tb * ((nh + HPT - 1) / HPT);
    for (long blk = get_group_id(0); blk < n_blk; blk += get_num_groups(0)) {
        const int hg = (int)(blk / n_tb);
        const long tok = (blk - hg * n_tb) * tpw + sub;
        if (tok >= n_tokens)
            continue;
        const long b = (uint)tok / (uint)n_tok, t = tok - b * n_tok; /* B * T < 2^31 */
        for (uint s = s0; s < (uint)slots; s += wg) {
            const int i0 = (int)s * VEC;
            floatv c, sn;
            ROPE_ANGLES(i0, c, sn);
            ROPE_HEADS(hg, i0, c, sign * sn);
        }
    }
#endif
}
